"""The shared-memory bank-conflict model (tracea/codegen/bank_conflicts.py): plain row-major tiles
conflict under ldmatrix, the chosen XOR swizzles do not, and the stores stay conflict-free."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracea.dialects.schedule import Swizzle
from tracea.codegen.bank_conflicts import (TileLayout, accumulator_pair_addresses, conflict_free_swizzle, conflicts,
                                           ldmatrix_x4_addresses, report, wavefronts)


def test_the_warp_model():
    assert wavefronts([4 * t for t in range(32)], 4) == 1  # 32 banks, one word each
    assert wavefronts([0] * 32, 4) == 1  # one word: a broadcast
    assert wavefronts([128 * t for t in range(32)], 4) == 32  # every thread in bank 0
    assert wavefronts([16 * t for t in range(32)], 16) == 4  # 16-byte accesses: 4 phases of 8 threads
    assert conflicts([256 * (t % 8) for t in range(8)], 16) == 7  # 8 rows 256 B apart: 8-way


def test_128_byte_rows_of_f16():
    """The classic case: a 64-column f16 tile (128-byte rows). Row-major, the 8 rows each
    ldmatrix phase reads sit in the same 4 banks (8-way); Swizzle<3,3,3> spreads them."""
    plain = TileLayout(64, 64, 2)
    assert report(plain) == {"store": 0, "ldmatrix": 28}  # 4 phases x 8 wavefronts instead of 4
    swizzle = conflict_free_swizzle(64, 2)
    assert (swizzle.kind, swizzle.bits, swizzle.base, swizzle.shift) == ("xor", 3, 3, 3)
    assert report(TileLayout(64, 64, 2, swizzle)) == {"store": 0, "ldmatrix": 0}


def test_a_narrower_swizzle_only_halves_the_conflicts():
    assert report(TileLayout(64, 64, 2, Swizzle.xor(2, 3, 3)))["ldmatrix"] == 4  # 2-way in each phase


@given(rows=st.sampled_from([16, 32, 64, 128]), chunks=st.sampled_from([1, 2, 4, 8, 16, 32]),
       elem_bytes=st.sampled_from([2, 4]))
def test_chosen_swizzles_are_conflict_free(rows, chunks, elem_bytes):
    cols = chunks * 16 // elem_bytes
    rows = max(rows, 32) if chunks == 1 else rows  # an ldmatrix.x4 block of 16-byte rows is 32 rows
    layout = TileLayout(rows, cols, elem_bytes, conflict_free_swizzle(cols, elem_bytes))
    assert report(layout) == {"store": 0, "ldmatrix": 0}
    if chunks > 1:  # rows of two chunks or more do conflict without it
        assert report(TileLayout(rows, cols, elem_bytes))["ldmatrix"] > 0
    # a swizzle permutes the tile: every element keeps its own address
    addresses = {layout.address(r, c) for r in range(rows) for c in range(cols)}
    assert len(addresses) == rows * cols and max(addresses) < rows * cols * elem_bytes


def test_ldmatrix_rows_are_the_fragment_rows():
    layout = TileLayout(16, 16, 2)
    assert ldmatrix_x4_addresses(layout)[:3] == [0, 32, 64]  # rows 0-2, bytes 0-15
    assert ldmatrix_x4_addresses(layout)[16] == 16  # thread 16: row 0, bytes 16-31


def test_rows_that_are_not_whole_chunks_are_refused():
    with pytest.raises(ValueError, match="pad the tile's rows"):
        conflict_free_swizzle(24, 2)
    with pytest.raises(ValueError, match="holds no ldmatrix.x4 block"):
        report(TileLayout(8, 64, 2))


def test_accumulator_pairs_into_a_staging_box():
    """The Hopper GEMM's TMA-store epilogue writes its accumulator pairs into 64-row boxes of
    128-byte rows, swizzled as TMA's 128-byte mode reads them (chunk ^ row % 8; the kernel's
    layout). For bf16 / f16 (64 columns) a warp's 8 rows fall in the same banks row-major
    (8-way) and in 8 different ones swizzled. For f32 (32 columns, 8-byte pairs: two phases of
    4 rows, each row 2 chunks) the swizzle takes 4 wavefronts a phase down to 2: rows 2i and
    2i + 1 swap the same two chunks."""
    pairs = [(j, half) for j in range(8) for half in range(2)]
    for elem_bytes, plain_conflicts, swizzled_conflicts in ((2, 7, 0), (4, 6, 2)):
        cols = 128 // elem_bytes
        plain = TileLayout(64, cols, elem_bytes)
        swizzled = TileLayout(64, cols, elem_bytes, conflict_free_swizzle(cols, elem_bytes))
        for layout, expected in ((plain, plain_conflicts), (swizzled, swizzled_conflicts)):
            assert {conflicts(accumulator_pair_addresses(layout, j, half), 2 * elem_bytes)
                    for j, half in pairs if 8 * j < cols} == {expected}
