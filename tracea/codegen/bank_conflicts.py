"""Shared-memory bank conflicts: a tile's layout (row-major, optionally XOR-swizzled) against
the accesses a warp makes to it, and the swizzle that removes the conflicts.

The model (NVIDIA sm_80 / sm_90): 32 banks of 4 bytes. A warp's shared-memory instruction is
served in phases of 128 bytes' worth of threads (32 threads of 4 B, 16 of 8 B, 8 of 16 B); in a
phase, threads reaching distinct 4-byte words of one bank are served one after another (the
same word is a broadcast). `wavefronts` counts what an instruction costs; conflicts are the
wavefronts beyond one per phase. ldmatrix.x4 is four such phases: threads 8i..8i+7 each give
the address of one 16-byte row of matrix i.

A row-major tile whose rows are 128 bytes (64 f16) puts column c of every row in the same bank,
so the 8 rows an ldmatrix phase reads serialize 8 ways. `conflict_free_swizzle` XORs row bits
into the 16-byte chunk index (CUTLASS's Swizzle<bits, base, shift> on element offsets): each of
the 8 rows then lands in other banks, while a warp's 16-byte stores of consecutive chunks stay
conflict-free.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..dialects.schedule import Swizzle

BANKS = 32
BANK_BYTES = 4
PHASE_BYTES = BANKS * BANK_BYTES  # what one wavefront serves without conflicts
CHUNK_BYTES = 16  # a cp.async / ldmatrix row / 128-bit access


@dataclass(frozen=True)
class TileLayout:
    """A rows x cols tile of `elem_bytes` elements in shared memory, row-major, then swizzled."""
    rows: int
    cols: int
    elem_bytes: int
    swizzle: Swizzle = field(default_factory=Swizzle)

    def address(self, row: int, col: int) -> int:
        """Byte offset of element (row, col) in the tile."""
        return self.swizzle.apply(row * self.cols + col) * self.elem_bytes


def wavefronts(addresses, access_bytes: int, lanes=None) -> int:
    """Wavefronts one warp instruction takes; `addresses[i]` is the byte address of thread
    `lanes[i]` (default: thread i), each thread accessing `access_bytes` (4, 8 or 16)."""
    return sum(_worst_bank(phase) for phase in _phases(addresses, access_bytes, lanes))


def conflicts(addresses, access_bytes: int, lanes=None) -> int:
    """Wavefronts beyond the conflict-free one per phase that has an active thread."""
    return sum(_worst_bank(phase) - 1 for phase in _phases(addresses, access_bytes, lanes))


def _worst_bank(phase: dict[int, set[int]]) -> int:
    """A phase's wavefronts: the most distinct words any one bank serves."""
    return max(len(words) for words in phase.values())


def _phases(addresses, access_bytes: int, lanes=None) -> list[dict[int, set[int]]]:
    """Per phase with an active thread: bank -> the distinct 4-byte words its threads reach."""
    per_phase = BANKS if access_bytes <= BANK_BYTES else PHASE_BYTES // access_bytes
    lanes = range(len(addresses)) if lanes is None else lanes
    phases: dict[int, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for lane, address in zip(lanes, addresses):
        address = int(address)
        for word in range(address // BANK_BYTES, (address + access_bytes - 1) // BANK_BYTES + 1):
            phases[int(lane) // per_phase][word % BANKS].add(word)
    return list(phases.values())


def measured(accesses) -> dict[tuple[int, str], int]:
    """Worst conflicts of each shared-memory instruction (PTX line, opcode) over the accesses an
    emulated kernel made (ptx_emulator.emulate(..., shared_accesses=[])): the kernel's real
    addresses, not this module's model of its layout."""
    worst: dict[tuple[int, str], int] = {}
    for a in accesses:
        key = (a.line, a.opcode)
        worst[key] = max(worst.get(key, 0), conflicts(a.offsets.tolist(), a.width, a.lanes.tolist()))
    return worst


def store_addresses(layout: TileLayout, warp: int = 0) -> list[int]:
    """A warp copying the tile from global memory 16 bytes per thread (cp.async), chunks in
    row-major order: thread t of warp w writes chunk 32 w + t."""
    per_chunk = CHUNK_BYTES // layout.elem_bytes
    per_row = layout.cols // per_chunk
    chunks = [warp * 32 + t for t in range(32)]
    return [layout.address(c // per_row % layout.rows, c % per_row * per_chunk) for c in chunks]


def ldmatrix_x4_addresses(layout: TileLayout, row0: int = 0, col0: int = 0) -> list[int]:
    """ldmatrix.x4 of the 16-row x 32-byte block at (row0, col0) (an m16n8k16 A fragment of a
    16-bit type): matrices 0-3 are (rows 0-7, 8-15) x (bytes 0-15, 16-31), thread t giving row
    t % 16 of chunk t // 16. Rows of a single chunk: a 32-row block, thread t giving row t."""
    per_chunk = CHUNK_BYTES // layout.elem_bytes
    chunks = min(2, layout.cols // per_chunk)
    rows = 32 // chunks
    return [layout.address(row0 + t % rows, col0 + (t // rows) * per_chunk) for t in range(32)]


def accumulator_pair_addresses(layout: TileLayout, j: int = 0, half: int = 0) -> list[int]:
    """A warp writing one pair of its Tensor Core accumulators (mma.sync m16n8 or a wgmma m64N
    warp's 16 rows) into the tile, as the Hopper GEMM's TMA-store epilogue does: thread t writes
    columns 8 j + 2 (t % 4) + {0, 1} of row t / 4 + 8 half, 2 elements in one access."""
    return [layout.address(t // 4 + 8 * half, 8 * j + 2 * (t % 4)) for t in range(32)]


def report(layout: TileLayout) -> dict[str, int]:
    """Conflicts (extra wavefronts per warp instruction, worst over the tile) of the accesses a
    GEMM makes: the 16-byte stores from global memory and the ldmatrix.x4 reads."""
    per_chunk = CHUNK_BYTES // layout.elem_bytes
    warps = max(1, layout.rows * layout.cols // per_chunk // 32)
    stores = max(conflicts(store_addresses(layout, w), CHUNK_BYTES) for w in range(warps))
    block_cols = min(2, layout.cols // per_chunk) * per_chunk
    block_rows = 32 * per_chunk // block_cols
    if layout.rows < block_rows:
        raise ValueError(f"a tile of {layout.rows} rows x {layout.cols * layout.elem_bytes} bytes holds no "
                         f"ldmatrix.x4 block ({block_rows} rows x {block_cols * layout.elem_bytes} bytes)")
    reads = max(conflicts(ldmatrix_x4_addresses(layout, r, c), CHUNK_BYTES)
                for r in range(0, layout.rows - block_rows + 1, block_rows)
                for c in range(0, layout.cols - block_cols + 1, block_cols))
    return {"store": stores, "ldmatrix": reads}


def conflict_free_swizzle(cols: int, elem_bytes: int) -> Swizzle:
    """The XOR swizzle for rows of `cols` elements: the 16-byte chunk index (bits from
    base = log2(elements per chunk)) XORed with the row bits that repeat banks within 8 rows.
    Rows of one chunk need none."""
    per_chunk = CHUNK_BYTES // elem_bytes
    chunks = cols // per_chunk
    if chunks * per_chunk != cols or chunks & (chunks - 1):
        raise ValueError(f"rows of {cols} x {elem_bytes}-byte elements are not a power-of-two number of "
                         f"16-byte chunks; pad the tile's rows")
    if chunks == 1:
        return Swizzle()
    log_chunks = chunks.bit_length() - 1
    bits = min(3, log_chunks)  # the chunk index within a 128-byte line (at most 8 chunks)
    # the XOR source starts at the row bits that are 128 bytes apart or more
    return Swizzle.xor(bits, per_chunk.bit_length() - 1, max(3, log_chunks))
