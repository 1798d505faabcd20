"""Runs a GpuKernelArtifact's PTX on the CPU: the NVIDIA kernels checked without a GPU.

An interpreter for the PTX that LLVM's NVPTX back end emits for Tracea's kernels (integer and
float arithmetic, loads and stores, branches, `bar.sync` (0, and named barriers with a
thread count: `bar.sync` / `bar.arrive id, n`), shuffles, `cp.async` groups,
`ldmatrix`, `mma.sync` m16n8k16, mbarriers, 2-D and 3-D TMA tile copies, 2-D TMA stores in
bulk groups and `wgmma` with A from shared-memory descriptors or registers; thread block
clusters: a cluster's blocks run together, with `barrier.cluster`, `mapa`, remote mbarrier
arrivals and multicast copies), written from the PTX ISA's definitions, not from Tracea's code
generators: it checks their lane mappings, swizzles and descriptors by running them.

It is adversarial where the hardware is free to be: asynchronous copies fill their destination
with NaN bytes when issued and deliver the data only when waited for, `wgmma` reads its shared
memory operands and writes its accumulators only at `wgmma.wait_group`, warps of a block are
interleaved at random between barriers, shared memory and outputs start as NaN. A kernel that
reads a buffer before its wait, refills one that another warp still reads, or leaves output
unwritten gives NaN, not a lucky answer. Out-of-bounds or misaligned accesses, writes over a
live mbarrier, deadlocks and divergent warp-collective instructions raise EmulationError
naming the PTX line; so do a TMA store of shared memory that a thread wrote without a
`fence.proxy.async` after, a write to shared memory that a TMA store has not yet been waited
for (`cp.async.bulk.wait_group.read`), and a block exiting with TMA stores still in flight.

Each warp executes in lock step on numpy arrays of its 32 lanes; when its lanes diverge, those
earliest in a topological order of the control flow graph run first, so the others wait for them
where the paths join (a branch around an `if` reconverges before a loop's back edge), as the
hardware's reconvergence points do. It can record every warp instruction's shared-memory
addresses, so that bank conflicts are measured on what a kernel does (bank_conflicts.measured).
It is slow (about 10 µs an instruction per warp): for small shapes in tests. Needs numpy only,
like the rest of tracea/runtime.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

import numpy as np

try:
    from ..errors import TraceaError
except ImportError:  # this file alone, without Tracea's compiler
    class TraceaError(Exception):
        pass


class EmulationError(TraceaError):
    pass


WARP = 32
GLOBAL_BASE = 0x7F00_0000_0000  # above 4 GB: a 32-bit truncated address faults
SHARED_WINDOW = 0x1_0000_0000_0000  # generic addresses of shared memory: window + offset
CLUSTER_BIT, CLUSTER_RANK_SHIFT = 1 << 31, 24  # shared::cluster addresses (mapa): bit, rank, offset
POISON = 0xFF  # every byte: NaN as f16, bf16 and f32

TYPES = {"pred": 1, "b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16,
         "b32": 32, "u32": 32, "s32": 32, "f32": 32, "f16x2": 32, "bf16x2": 32,
         "b64": 64, "u64": 64, "s64": 64, "f64": 64}
_MASK = {w: np.uint64((1 << w) - 1) if w < 64 else np.uint64(0xFFFF_FFFF_FFFF_FFFF) for w in (1, 8, 16, 32, 64)}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# -- values: registers hold raw bits in uint64 lanes ---------------------------------------

def typed(bits: np.ndarray, t: str) -> np.ndarray:
    """The lanes' bits read as PTX type t (ints widened to int64 / uint64)."""
    w = TYPES[t]
    if t == "pred":
        return bits != 0
    if t == "f32":
        return (bits & _MASK[32]).astype(np.uint32).view(np.float32)
    if t == "f64":
        return bits.view(np.float64)
    if t == "f16":
        return (bits & _MASK[16]).astype(np.uint16).view(np.float16)
    if t == "bf16":
        return ((bits & _MASK[16]) << np.uint64(16)).astype(np.uint32).view(np.float32)
    if t[0] == "s":
        v = (bits & _MASK[w]).astype(np.int64)
        return np.where(v >= (1 << (w - 1)), v - (1 << w), v) if w < 64 else bits.view(np.int64)
    return bits & _MASK[w]


def bits_of(values, t: str) -> np.ndarray:
    """Inverse of typed: values of type t as uint64 bits (ints wrap to the type's width)."""
    w = TYPES[t]
    values = np.asarray(values)
    if t == "pred":
        return values.astype(bool).astype(np.uint64)
    if t == "f32":
        return values.astype(np.float32).view(np.uint32).astype(np.uint64)
    if t == "f64":
        return values.astype(np.float64).view(np.uint64)
    if t == "f16":
        return values.astype(np.float16).view(np.uint16).astype(np.uint64)
    if t == "bf16":
        return bf16_bits(values)
    if values.dtype.kind == "f":
        values = values.astype(np.int64)
    return values.astype(np.int64).view(np.uint64) & _MASK[w] if values.dtype.kind == "i" else \
        values.astype(np.uint64) & _MASK[w]


def bf16_bits(values) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even (NaN stays NaN)."""
    b = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) & _MASK[16]
    return np.where(np.isnan(np.asarray(values, np.float32)), np.uint64(0x7FC0), rounded)


def _mul_hi64(x: np.ndarray, y: np.ndarray, signed: bool) -> np.ndarray:
    """The high 64 bits of the 128-bit product, from 32-bit halves (numpy has no 128-bit ints)."""
    a, b = x.astype(np.int64).view(np.uint64) if signed else x, y.astype(np.int64).view(np.uint64) if signed else y
    m32, s32 = np.uint64(0xFFFF_FFFF), np.uint64(32)
    a0, a1, b0, b1 = a & m32, a >> s32, b & m32, b >> s32
    p01, p10 = a0 * b1, a1 * b0
    middle = ((a0 * b0) >> s32) + (p01 & m32) + (p10 & m32)
    high = a1 * b1 + (p01 >> s32) + (p10 >> s32) + (middle >> s32)
    if signed:  # two's complement: subtract the other operand for each negative one
        high = high - np.where(x < 0, b, np.uint64(0)) - np.where(y < 0, a, np.uint64(0))
    return high


def _round_f32(x64: np.ndarray, mode: str) -> np.ndarray:
    """float64 -> float32 with the PTX rounding mode (rn, rz, rm, rp)."""
    with np.errstate(invalid="ignore", over="ignore"):
        r = x64.astype(np.float32)
        r64 = r.astype(np.float64)
        if mode == "rm":
            r = np.where(r64 > x64, np.nextafter(r, np.float32(-np.inf)), r)
        elif mode == "rp":
            r = np.where(r64 < x64, np.nextafter(r, np.float32(np.inf)), r)
        elif mode == "rz":
            r = np.where(np.abs(r64) > np.abs(x64), np.nextafter(r, np.float32(0)), r)
    return r


# -- parsing -------------------------------------------------------------------------------

@dataclass
class Op:
    """An operand. kind: reg, imm (int), fimm (float bits), sym, special, addr (base Op + offset),
    vec (ops), tmap (base Op, coordinate Ops), sink (`_`), label."""
    kind: str
    value: object = None
    offset: int = 0
    items: tuple = ()


@dataclass
class Instruction:
    opcode: str
    parts: list[str]
    operands: list[Op]
    guard: tuple[str, bool] | None  # (predicate register, negated)
    line: int
    text: str

    def type(self, default: str | None = None) -> str:
        for p in reversed(self.parts):
            if p in TYPES:
                return p
        if default is None:
            raise EmulationError(f"PTX line {self.line}: no type in '{self.opcode}'")
        return default


@dataclass
class SharedVariable:
    name: str
    align: int
    size: int | None  # None: the extern (dynamic) array


@dataclass
class Kernel:
    name: str
    target: str
    params: list[tuple[str, str]]  # (name, type)
    shared: list[SharedVariable]
    code: list[Instruction]
    labels: dict[str, int]
    cluster: tuple[int, int, int] = (1, 1, 1)  # .reqnctapercluster: blocks that run together


_SPECIAL = re.compile(r"%(tid|ntid|ctaid|nctaid)\.[xyz]|%laneid|%warpid|%cluster_n?ctarank")


def _split_operands(text: str) -> list[str]:
    if "[" not in text and "{" not in text:
        return [t.strip() for t in text.split(",") if t.strip()]
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _operand(text: str) -> Op:
    text = text.strip()
    if text == "_":
        return Op("sink")
    if text.startswith("["):
        inner = text[1:-1].strip()
        if "{" in inner:  # tensor map and coordinates
            base, coords = inner.split(",", 1)
            return Op("tmap", _operand(base), items=tuple(_operand(c) for c in _split_operands(coords.strip()[1:-1])))
        m = re.fullmatch(r"([^+\-]+?)\s*(?:([+-])\s*(-?\w+))?", inner)  # [%rd1+-12] occurs
        base, sign, off = m.group(1), m.group(2), m.group(3)
        offset = int(off, 0) * (-1 if sign == "-" else 1) if off else 0
        return Op("addr", _operand(base), offset)
    if text.startswith("{"):
        return Op("vec", items=tuple(_operand(t) for t in _split_operands(text[1:-1])))
    if _SPECIAL.fullmatch(text):
        return Op("special", text)
    if text.startswith("%") or re.fullmatch(r"[A-Za-z_$][\w$#]*", text):
        return Op("reg", text)  # registers, shared variables, parameters and labels: resolved by use
    if re.fullmatch(r"0[fF][0-9a-fA-F]{8}", text):
        return Op("fimm", int(text[2:], 16), 32)
    if re.fullmatch(r"0[dD][0-9a-fA-F]{16}", text):
        return Op("fimm", int(text[2:], 16), 64)
    if re.fullmatch(r"-?(0[xX][0-9a-fA-F]+|\d+)U?", text):
        return Op("imm", int(text.rstrip("U"), 0))
    return Op("label", text)


def parse(ptx: str) -> Kernel:
    """The (first) kernel of a PTX module."""
    text = re.sub(r"//[^\n]*", "", ptx)
    target = (re.search(r"\.target\s+(\w+)", text) or [None, "sm_80"])[1]
    module_shared = [SharedVariable(m.group(3), int(m.group(2) or 1), None)
                     for m in re.finditer(r"\.extern\s+\.shared\s+(\.align\s+(\d+)\s+)?\.b8\s+(\w+)\[\];", text)]
    entry = re.search(r"\.entry\s+(\w+)\s*\((.*?)\)", text, re.S)
    if not entry:
        raise EmulationError("no .entry kernel in the PTX")
    params = [(p.split()[-1], p.split()[1]) for p in (s.strip() for s in entry.group(2).split(",")) if p]
    cluster = re.match(r"[^{]*?\.reqnctapercluster\s+(\d+)\s*,\s*(\d+)\s*,\s*(\d+)", text[entry.end():], re.S)
    body_start = text.index("{", entry.end())
    # statements (they may span lines), with the names declared in nested { } scopes (inline asm)
    # made unique: a brace opens a scope where a statement starts, else it is a vector operand
    raw: list[tuple[int, str, int]] = []  # (line, statement, scope id)
    scope_ids, next_id = [0], 1
    declared: dict[int, set[str]] = {0: set()}
    line = text[:body_start].count("\n") + 1
    current, vector, start_line = "", 0, line
    for piece in re.split(r"([{};:])", text[body_start + 1:]):
        if not current.strip():
            start_line = line + piece[:len(piece) - len(piece.lstrip())].count("\n")
            if piece == "{":
                scope_ids.append(next_id)
                declared[next_id] = set()
                next_id += 1
                current = ""
                continue
            if piece == "}":
                if len(scope_ids) == 1:
                    break  # the kernel body's closing brace
                scope_ids.pop()
                current = ""
                continue
        line += piece.count("\n")
        if piece == ":" and re.fullmatch(r"\s*[$\w]+", current):
            declared[scope_ids[-1]].add(current.strip())
            raw.append((start_line, current.strip() + ":", scope_ids[-1]))
            current = ""
            continue
        vector += (piece == "{") - (piece == "}")
        if piece == ";" and vector == 0:
            stmt = " ".join(current.split())
            m = re.match(r"\.reg\s+\.\w+\s+(.*)", stmt)
            if m:
                declared[scope_ids[-1]].update(n.strip() for n in m.group(1).split(",") if "<" not in n)
            elif stmt:
                raw.append((start_line, stmt, scope_ids[-1]))
            current = ""
            continue
        current += piece

    def rename(stmt: str, scope: int) -> str:
        if scope == 0 or not declared[scope]:
            return stmt
        return re.sub(r"(?<![\w%$.])([$%]?\w+)", lambda m: f"{m.group(1)}#{scope}"
                      if m.group(1) in declared[scope] else m.group(1), stmt)

    shared: list[SharedVariable] = []
    code: list[Instruction] = []
    labels: dict[str, int] = {}
    for n, stmt, scope in raw:
        stmt = rename(stmt, scope)
        if stmt.endswith(":"):
            labels[stmt[:-1]] = len(code)
            continue
        m = re.match(r"\.shared\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+(\w+)(?:\[(\d*)\])?", stmt)
        if m:
            size = TYPES[m.group(2)] // 8 * (int(m.group(4)) if m.group(4) else 1)
            shared.append(SharedVariable(m.group(3), int(m.group(1) or 1), None if m.group(4) == "" else size))
            continue
        if stmt.startswith("."):
            continue  # .maxntid, .local and other directives: nothing to execute
        guard = None
        g = re.match(r"@(!?)(\S+)\s+(.*)", stmt)
        if g:
            guard, stmt = (g.group(2), g.group(1) == "!"), g.group(3)
        opcode, rest = (re.split(r"\s+", stmt, maxsplit=1) + [""])[:2]
        operands = [_operand(o) for o in _split_operands(rest)] if rest.strip() else []
        code.append(Instruction(opcode, opcode.split("."), operands, guard, n, stmt))
    return Kernel(entry.group(1), target, params, module_shared + shared, code, labels,
                  tuple(int(n) for n in cluster.groups()) if cluster else (1, 1, 1))


# -- memory --------------------------------------------------------------------------------

class Memory:
    """A flat byte space at `base`: global memory (allocations separated by unmapped red zones)
    or one block's shared memory."""

    def __init__(self, name: str, size: int, base: int = 0, valid: bool = True):
        self.name, self.base = name, base
        self.data = np.full(size, POISON, np.uint8)
        self.valid = np.full(size, valid, bool)
        self.regions: list[tuple[int, int, str]] = []

    def offsets(self, addresses: np.ndarray, width: int, what: str, line: int) -> np.ndarray:
        off = addresses.astype(np.int64) - self.base
        bad = (off < 0) | (off + width > len(self.data))
        if not bad.any():
            idx = off[:, None] + np.arange(width)
            bad = ~self.valid[idx].all(axis=1)
        if bad.any():
            addr = int(addresses[np.argmax(bad)])
            raise EmulationError(f"PTX line {line}: {what} of {width} bytes at {self.name} address {addr:#x} is "
                                 f"outside {self.describe(addr)}")
        if (addresses % np.uint64(min(width, 16))).any():
            addr = int(addresses[np.argmax(addresses % np.uint64(min(width, 16)) != 0)])
            raise EmulationError(f"PTX line {line}: {what} of {width} bytes at {self.name} address {addr:#x} is "
                                 f"not {min(width, 16)}-byte aligned")
        return off

    def describe(self, addr: int) -> str:
        for start, size, name in self.regions:
            if start - 4096 <= addr < start + size + 4096:
                return f"{name} ([{start:#x}, {start + size:#x}))"
        return f"the {self.name} memory in use"

    def read(self, addresses, width, what, line) -> np.ndarray:
        off = self.offsets(addresses, width, what, line)
        return self.data[off[:, None] + np.arange(width)]

    def write(self, addresses, raw: np.ndarray, what, line) -> None:
        off = self.offsets(addresses, raw.shape[1], what, line)
        self.data[off[:, None] + np.arange(raw.shape[1])] = raw


def _to_lanes(raw: np.ndarray) -> np.ndarray:
    """(lanes, width) bytes -> uint64 per lane (little-endian)."""
    return np.ascontiguousarray(raw).view(_UINT[raw.shape[1]]).reshape(-1).astype(np.uint64)


def _to_bytes(values: np.ndarray, width: int) -> np.ndarray:
    return (values & _MASK[width * 8]).astype(_UINT[width]).view(np.uint8).reshape(-1, width)


@dataclass
class TensorMap:
    """What cuTensorMapEncodeTiled encodes for Tracea's maps (see cuda_launcher): a matrix of
    `rows` x `cols`, or `slices` of them (3-D: boxes stay inside their slice)."""
    address: int
    rows: int
    cols: int
    item: int
    box: tuple[int, int]  # (inner, outer) elements
    swizzle: int  # bytes: 0 or 128
    slices: int = 0  # 0: a 2-D map


def swizzled(address: np.ndarray, swizzle: int) -> np.ndarray:
    """The 128-byte swizzle of TMA and wgmma (Swizzle<3,4,3> on byte addresses): the 16-byte
    chunk index (address bits 4-6) XOR the 128-byte row index within 1024 bytes (bits 7-9)."""
    if swizzle == 0:
        return address
    if swizzle != 128:
        raise EmulationError(f"the emulator models the 128-byte swizzle only, not {swizzle}")
    return address ^ (((address >> 7) & 7) << 4)


# -- execution -----------------------------------------------------------------------------

@dataclass
class SharedAccess:
    """One warp instruction's access to shared memory, as `emulate(..., shared_accesses=[])`
    records it: the active lanes and their byte offsets, `width` bytes each (ldmatrix: a
    16-byte row per lane that gives one)."""
    line: int
    opcode: str
    width: int
    lanes: np.ndarray
    offsets: np.ndarray


@dataclass
class _Copy:  # cp.async: per lane destination (shared), source (global), bytes to read
    dst: np.ndarray
    src: np.ndarray
    size: int
    src_size: np.ndarray
    line: int


@dataclass
class _Wgmma:
    inst: Instruction
    old: dict[str, np.ndarray] | None  # accumulators at issue (None: chained on an earlier one in flight)
    desc_a: int
    desc_b: int
    scale_d: bool
    a_regs: np.ndarray | None = None  # A in registers: the 4 x 32 lanes' b32 fragments, read at issue


@dataclass
class Warp:
    index: int
    lanes: np.ndarray  # linear thread ids in the block, -1 past its last thread
    regs: dict = field(default_factory=dict)
    pcs: np.ndarray = None
    done: np.ndarray = None
    waiting: np.ndarray = None  # at a bar.sync
    named: int | None = None  # the named barrier (bar.sync id, count) it waits at, if any
    copies: list = field(default_factory=list)  # cp.async issued since the last commit
    groups: list = field(default_factory=list)  # committed cp.async groups, oldest first
    mma_open: list = field(default_factory=list)
    mma_groups: list = field(default_factory=list)
    mma_in_flight: dict = field(default_factory=dict)  # accumulator register -> wgmmas in flight writing it
    mma_values: dict = field(default_factory=dict)  # a retired wgmma's result the next one in flight reads
    cluster_phase: int | None = None  # the barrier.cluster phase it arrived in, until it waits
    cluster_synced: bool = False  # has passed a barrier.cluster: may use the other blocks' shared memory
    stores: list = field(default_factory=list)  # TMA stores issued since the last cp.async.bulk.commit_group
    store_groups: list = field(default_factory=list)  # committed bulk groups of TMA stores, oldest first

    def __post_init__(self):
        self.pcs = np.zeros(WARP, np.int64)
        self.done = self.lanes < 0
        self.waiting = np.zeros(WARP, bool)

    def runnable(self) -> bool:
        return bool((~self.done & ~self.waiting).any())


def _topological_order(kernel: Kernel) -> np.ndarray:
    """Each pc's rank (and one past the end's, last) in a reverse post-order of the basic blocks
    ignoring back edges: diverged lanes run lowest rank first, so a path reaches a join point
    only after every path into it."""
    code = kernel.code
    targets = [kernel.labels.get(i.operands[0].value) if i.parts[0] == "bra" else None for i in code]
    starts = sorted({0, len(code), *kernel.labels.values(),
                     *(pc + 1 for pc, i in enumerate(code) if i.parts[0] in ("bra", "ret", "exit"))})
    block_of = np.searchsorted(starts, np.arange(len(code) + 1), side="right") - 1

    def successors(b: int) -> list[int]:
        last = starts[b + 1] - 1
        if last < 0 or starts[b] >= len(code):
            return []
        i = code[last]
        out = [block_of[targets[last]]] if targets[last] is not None else []
        if i.parts[0] not in ("bra", "ret", "exit") or i.guard is not None:
            out.append(block_of[last + 1])
        return out

    post, seen, stack = [], {0}, [(0, iter(successors(0)))]
    while stack:  # iterative depth-first search
        b, it = stack[-1]
        nxt = next((s for s in it if s not in seen), None)
        if nxt is None:
            post.append(b)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(successors(nxt))))
    rank = {b: r for r, b in enumerate(reversed(post))}
    block_rank = np.array([rank.get(b, len(starts) + b) for b in range(len(starts))])
    pcs = np.arange(len(code) + 1)
    return block_rank[block_of] * (len(code) + 1) + pcs


class ClusterBarrier:
    """barrier.cluster: every thread of the cluster's blocks arrives, then waits for the phase."""
    def __init__(self, threads: int):
        self.threads, self.arrived, self.phase = threads, 0, 0


class Block:
    def __init__(self, emulator: "Emulator", ctaid: tuple[int, int, int]):
        self.em, self.ctaid = emulator, ctaid
        self.shared = Memory("shared", emulator.shared_size)
        self.shared.regions = list(emulator.shared_regions)
        self.mbarriers: dict[int, list[int]] = {}  # address -> [count, pending arrivals, tx bytes, phase]
        self.tma: dict[int, list] = {}  # mbarrier address -> copies in flight
        self.named: dict[int, list] = {}  # named barrier id -> [thread count, threads arrived, warps waiting]
        threads = math.prod(emulator.block)
        ids = [np.arange(w * WARP, (w + 1) * WARP) for w in range(-(-threads // WARP))]
        self.warps = [Warp(w, np.where(i < threads, i, -1)) for w, i in enumerate(ids)]  # -1: no thread
        self.cluster: list[Block] = [self]  # by rank; run_cluster sets both
        self.cluster_barrier: ClusterBarrier | None = None
        self.exited = False
        # the async proxy (TMA stores) sees a thread's shared-memory writes only after its
        # fence.proxy.async: the warp whose write to each byte is not yet fenced, else -1
        self.unfenced = np.full(self.shared.data.size, -1, np.int16)
        self.store_sources: list[tuple[int, int]] = []  # [start, end) a TMA store in flight reads

    @property
    def rank(self) -> int:
        cx, cy, cz = self.em.kernel.cluster
        x, y, z = self.ctaid
        return x % cx + cx * (y % cy + cy * (z % cz))

    def settle(self) -> None:
        """With no warp of this block able to run: exit, complete barrier 0, or report a deadlock."""
        live = [w for w in self.warps if not w.done.all()]
        if not live:
            if self.exited:
                return
            if any(w.stores or w.store_groups for w in self.warps):
                raise EmulationError(f"block {self.ctaid} exits with TMA stores that may not have read their shared "
                                     "memory yet: cp.async.bulk.wait_group.read 0 before exiting")
            if self.named:  # arrivals without the waits they pair with
                raise EmulationError(f"block {self.ctaid} exits with named barriers part-way: " + ", ".join(
                    f"{bar} has {n[1]} of {n[0]} threads" for bar, n in sorted(self.named.items())))
            self.exited = True
            return
        if any(w.runnable() for w in live):
            return
        at_zero = [w for w in live if w.named is None]
        if not at_zero:
            raise EmulationError(f"deadlock in block {self.ctaid}: every warp waits at a named barrier ("
                                 + ", ".join(f"{bar} has {n[1]} of {n[0]} threads"
                                             for bar, n in sorted(self.named.items())) + ")")
        for w in at_zero:  # everyone left is at barrier 0 or a named one: 0 completes
            w.waiting[:] = False

    def check_not_mbarrier(self, offsets: np.ndarray, width: int, what: str, line: int) -> None:
        for addr in self.mbarriers:
            hit = (offsets < addr + 8) & (offsets + width > addr)
            if hit.any():
                raise EmulationError(f"PTX line {line}: {what} writes over the mbarrier at shared {addr:#x}")


def run_cluster(em: "Emulator", blocks: list[Block], rng: random.Random) -> None:
    """Run blocks that share a cluster (one block without clusters), interleaving their warps."""
    warps = [(b, w) for b in blocks for w in b.warps]
    barrier = ClusterBarrier(sum(int((w.lanes >= 0).sum()) for _, w in warps))
    for b in blocks:
        b.cluster, b.cluster_barrier = blocks, barrier
    idle = 0
    while True:
        for b in blocks:
            b.settle()
        runnable = [(b, w) for b, w in warps if w.runnable()]
        if not runnable:
            return  # every block exited (settle raised for any other state)
        block, warp = rng.choice(runnable)
        progressed = em.step_warp(block, warp, rng.randint(1, 48))
        idle = 0 if progressed else idle + 1
        if idle > 2000 * len(warps):
            where = ", ".join(f"block {b.ctaid} warp {w.index} at PTX line "
                              f"{em.kernel.code[int(w.pcs[~w.done].min())].line}" for b, w in warps if not w.done.all())
            raise EmulationError(f"deadlock in {'cluster' if len(blocks) > 1 else 'block'} "
                                 f"{blocks[0].ctaid}: {where} (an mbarrier wait whose phase never completes?)")


def _is_tma_store(inst: Instruction) -> bool:
    """cp.async.bulk.tensor.Nd.global.shared::cta...: a copy to global memory."""
    return inst.opcode.startswith("cp.async.bulk.tensor") and inst.parts[5:6] == ["global"]


class Emulator:
    def __init__(self, kernel: Kernel, grid, block, dynamic_shared: int):
        self.kernel, self.grid, self.block = kernel, tuple(grid), tuple(block)
        # ptxas's layout: static variables from 1 KB on sm_90 (the reserved area), then the extern array
        offset = 1024 if int(re.sub(r"\D", "", kernel.target) or 80) >= 90 else 0
        self.symbols: dict[str, int] = {}
        self.shared_regions = []
        for var in [v for v in kernel.shared if v.size is not None] + [v for v in kernel.shared if v.size is None]:
            offset = -(-offset // var.align) * var.align
            self.symbols[var.name] = offset
            size = var.size if var.size is not None else dynamic_shared
            self.shared_regions.append((offset, size, var.name))
            offset += size
        self.shared_size = offset
        self.memory: Memory | None = None
        self.params: dict[str, int] = {}
        self.tensor_maps: dict[int, TensorMap] = {}
        # shared-memory writes are tracked for the async proxy only where TMA stores read them
        self.tma_stores = any(_is_tma_store(i) for i in kernel.code)
        self.shared_accesses: list[SharedAccess] | None = None  # a list: record them (bank conflicts)
        self._compiled = [self._compile(i) for i in kernel.code]
        self.order = _topological_order(kernel)

    # -- operands ----------------------------------------------------------------------
    def read(self, warp: Warp, op: Op, t: str) -> np.ndarray:
        """An operand's lanes as uint64 bits of type t."""
        if op.kind == "reg":
            if op.value in warp.regs:
                return warp.regs[op.value]
            if op.value in self.symbols:
                return np.full(WARP, self.symbols[op.value], np.uint64)
            raise EmulationError(f"register {op.value} read before it is written")
        if op.kind == "imm":
            return np.full(WARP, op.value & ((1 << TYPES.get(t, 64)) - 1), np.uint64)
        if op.kind == "fimm":
            bits, width = op.value, op.offset
            if width == 64 and t == "f32":
                bits = int(np.array([bits], np.uint64).view(np.float64).astype(np.float32).view(np.uint32)[0])
            return np.full(WARP, bits, np.uint64)
        if op.kind == "special":
            name = op.value
            if name.startswith("%tid."):  # lanes hold linear thread ids, x fastest
                bx, by, _ = self.block
                ids = np.maximum(warp.lanes, 0)
                return {"x": ids % bx, "y": ids // bx % by, "z": ids // (bx * by)}[name[-1]].astype(np.uint64)
            if name == "%laneid":
                return np.arange(WARP, dtype=np.uint64)
            if name == "%warpid":
                return np.full(WARP, warp.index, np.uint64)
            if name.startswith("%cluster_"):
                return np.full(WARP, self.current.rank if name == "%cluster_ctarank" else len(self.current.cluster),
                               np.uint64)
            axis = "xyz".index(name[-1])
            value = {"%tid": 0, "%ntid": self.block[axis], "%ctaid": self.current.ctaid[axis],
                     "%nctaid": self.grid[axis]}[name[:-2]]
            return np.full(WARP, value, np.uint64)
        raise EmulationError(f"cannot read operand {op}")

    def write(self, warp: Warp, op: Op, value: np.ndarray, mask: np.ndarray) -> None:
        if op.kind == "sink":
            return
        if op.kind != "reg":
            raise EmulationError(f"cannot write operand {op}")
        old = warp.regs.get(op.value)
        value = np.asarray(value, np.uint64)
        if old is None or mask.all():
            warp.regs[op.value] = value.copy() if value.shape else np.full(WARP, value, np.uint64)
        else:
            warp.regs[op.value] = np.where(mask, value, old)

    def address(self, warp: Warp, op: Op) -> np.ndarray:
        base = op.value
        if base.kind == "reg" and base.value in self.params:
            raise EmulationError("parameter address used as a value")
        return self.read(warp, base, "u64") + np.uint64(op.offset & 0xFFFF_FFFF_FFFF_FFFF)

    def record_shared(self, inst: Instruction, lanes: np.ndarray, offsets: np.ndarray, width: int) -> None:
        if self.shared_accesses is not None:
            self.shared_accesses.append(SharedAccess(inst.line, inst.opcode, width, np.asarray(lanes).copy(),
                                                     np.asarray(offsets, np.uint64).copy()))

    # -- scheduling --------------------------------------------------------------------
    def step_warp(self, block: Block, warp: Warp, budget: int) -> bool:
        """Run up to `budget` instructions of one warp; False if it only spun on a wait."""
        self.current = block
        progressed = False
        for _ in range(budget):
            live = ~warp.done & ~warp.waiting
            if not live.any():
                break
            live_pcs = warp.pcs[live]
            pc = int(live_pcs[self.order[live_pcs].argmin()])
            active = live & (warp.pcs == pc)
            if pc >= len(self._compiled):
                warp.done |= active
                continue
            inst = self.kernel.code[pc]
            mask = active
            if inst.guard is not None:
                reg, negated = inst.guard
                if reg not in warp.regs:
                    raise EmulationError(f"PTX line {inst.line}: predicate {reg} read before it is written")
                p = warp.regs[reg] != 0
                mask = active & (~p if negated else p)
            warp.pcs[active] = pc + 1
            try:
                outcome = self._compiled[pc](warp, mask, active) if mask.any() else None
            except EmulationError as e:
                if str(e).startswith("PTX line"):
                    raise
                raise EmulationError(f"PTX line {inst.line} ({inst.text.strip()[:80]}): {e}") from None
            if outcome == "spin":
                return progressed
            progressed = progressed or inst.parts[0] != "bra"
            if outcome == "yield":
                break
        return progressed

    # -- instructions ------------------------------------------------------------------
    def _compile(self, inst: Instruction):
        name = inst.parts[0]
        handler = getattr(self, "_op_" + name.replace(".", "_"), None)
        if _is_tma_store(inst):
            return self._tma_store(inst)
        if inst.opcode.startswith("cp.async.bulk.tensor"):
            return self._tma(inst)
        if inst.opcode.startswith("cp.async.bulk."):
            return self._bulk_group(inst)
        if inst.opcode.startswith("cp.async"):
            return self._cp_async(inst)
        if handler is None:
            raise EmulationError(f"PTX line {inst.line}: the emulator does not model '{inst.opcode}'")
        return handler(inst)

    def _float_mode(self, inst) -> str:
        return next((p for p in inst.parts if p in ("rn", "rz", "rm", "rp")), "rn")

    def _arith(self, inst, fn64, fn32):
        t, mode = inst.type(), self._float_mode(inst)
        if t == "f32":
            sat = "sat" in inst.parts
            ops = inst.operands

            def run(w, m, _):
                args = [typed(self.read(w, o, t), t) for o in ops[1:]]
                with np.errstate(all="ignore"):
                    r = fn32(*args) if mode == "rn" else _round_f32(fn64(*[a.astype(np.float64) for a in args]), mode)
                if sat:
                    r = np.where(np.isnan(r), np.float32(0), np.clip(r, 0, 1))
                self.write(w, ops[0], bits_of(r, t), m)
            return run
        if t == "f64":
            return self._generic(inst, fn64)
        return self._int_arith(inst, fn64)

    def _generic(self, inst, fn, result: str | None = None):
        """fn over the operands read as the instruction's type; the result written as `result`."""
        t, ops = inst.type(), inst.operands

        def run(w, m, _):
            with np.errstate(all="ignore"):
                self.write(w, ops[0], bits_of(fn(*[typed(self.read(w, o, t), t) for o in ops[1:]]), result or t), m)
        return run

    def _int_arith(self, inst, fn):
        t, ops = inst.type(), inst.operands

        def run(w, m, _):
            args = [typed(self.read(w, o, t), t).astype(np.uint64) for o in ops[1:]]
            with np.errstate(over="ignore"):
                self.write(w, ops[0], fn(*args) & _MASK[TYPES[t]], m)
        return run

    def _op_add(self, inst):
        return self._arith(inst, lambda a, b: a + b, lambda a, b: a + b)

    def _op_sub(self, inst):
        return self._arith(inst, lambda a, b: a - b, lambda a, b: a - b)

    def _op_mul(self, inst):
        t = inst.type()
        if t in ("f32", "f64"):
            return self._arith(inst, lambda a, b: a * b, lambda a, b: a * b)
        width, wide = TYPES[t], np.int64 if t[0] == "s" else np.uint64
        if "wide" in inst.parts:
            return self._generic(inst, lambda x, y: x.astype(wide) * y.astype(wide), result=t[0] + str(2 * width))
        if "hi" in inst.parts:
            if width == 64:  # conv index arithmetic divides by constants this way
                return self._generic(inst, lambda x, y: _mul_hi64(x, y, t[0] == "s"))
            return self._generic(inst, lambda x, y: (x.astype(wide) * y.astype(wide)) >> wide(width))
        return self._int_arith(inst, lambda x, y: x * y)

    def _op_mad(self, inst):
        t = inst.type()
        if t in ("f32", "f64"):
            return self._op_fma(inst)
        if "wide" in inst.parts:
            raise EmulationError(f"PTX line {inst.line}: mad.wide is not modelled")
        return self._int_arith(inst, lambda x, y, z: x * y + z)

    def _op_fma(self, inst):
        return self._arith(inst, lambda a, b, c: a * b + c,
                           lambda a, b, c: (a.astype(np.float64) * b + c).astype(np.float32))

    @staticmethod
    def _quotient(a, b):
        """C's integer division, truncating toward zero."""
        if (b == 0).any():
            raise EmulationError("integer division by zero")
        return np.abs(a) // np.abs(b) * np.sign(a) * np.sign(b)

    def _op_div(self, inst):
        if inst.type()[0] == "f":
            return self._arith(inst, lambda a, b: a / b, lambda a, b: a / b)
        return self._generic(inst, self._quotient)

    def _op_rem(self, inst):
        return self._generic(inst, lambda a, b: a - self._quotient(a, b) * b)

    def _op_neg(self, inst):
        t = inst.type()
        if t == "f32":
            d, a = inst.operands
            return lambda w, m, _: self.write(w, d, self.read(w, a, t) ^ np.uint64(0x8000_0000), m)
        return self._int_arith(inst, lambda x: np.uint64(0) - x)

    def _op_abs(self, inst):
        t = inst.type()
        if t == "f32":
            d, a = inst.operands
            return lambda w, m, _: self.write(w, d, self.read(w, a, t) & np.uint64(0x7FFF_FFFF), m)
        return self._generic(inst, np.abs)

    def _op_copysign(self, inst):  # d = b with the sign of a
        d, a, b = inst.operands
        return lambda w, m, _: self.write(w, d, (self.read(w, b, "f32") & np.uint64(0x7FFF_FFFF)) |
                                          (self.read(w, a, "f32") & np.uint64(0x8000_0000)), m)

    def _minmax(self, inst, pick):
        t = inst.type()
        if t[0] != "f":
            return self._generic(inst, pick)
        nan = "NaN" in inst.parts

        def fn(a, b):
            r = (np.fmin if pick is np.minimum else np.fmax)(a, b)
            return np.where(np.isnan(a) | np.isnan(b), np.float32(np.nan), r) if nan else r
        return self._generic(inst, fn)

    def _op_min(self, inst):
        return self._minmax(inst, np.minimum)

    def _op_max(self, inst):
        return self._minmax(inst, np.maximum)

    def _op_rcp(self, inst):
        return self._generic(inst, lambda a: np.float32(1) / a)

    def _op_sqrt(self, inst):
        return self._generic(inst, np.sqrt)

    def _op_rsqrt(self, inst):
        return self._generic(inst, lambda a: np.float32(1) / np.sqrt(a))

    def _op_ex2(self, inst):
        return self._generic(inst, np.exp2)

    def _op_lg2(self, inst):
        return self._generic(inst, np.log2)

    def _op_sin(self, inst):
        return self._generic(inst, np.sin)

    def _op_cos(self, inst):
        return self._generic(inst, np.cos)

    def _op_tanh(self, inst):
        return self._generic(inst, np.tanh)

    def _logic(self, inst, fn):
        t, ops = inst.type(), inst.operands
        if t == "pred":
            return lambda w, m, _: self.write(w, ops[0], fn(*[self.read(w, o, t) != 0 for o in ops[1:]])
                                              .astype(np.uint64), m)
        return lambda w, m, _: self.write(w, ops[0], fn(*[self.read(w, o, t) & _MASK[TYPES[t]] for o in ops[1:]])
                                          & _MASK[TYPES[t]], m)

    def _op_and(self, inst):
        return self._logic(inst, lambda a, b: a & b)

    def _op_or(self, inst):
        return self._logic(inst, lambda a, b: a | b)

    def _op_xor(self, inst):
        return self._logic(inst, lambda a, b: a ^ b)

    def _op_not(self, inst):
        return self._logic(inst, lambda a: ~a)

    def _shift(self, inst, left: bool):
        t, (d, a, b) = inst.type(), inst.operands
        width = TYPES[t]

        def run(w, m, _):
            n = typed(self.read(w, b, "u32"), "u32")
            n_ = np.minimum(n, 63).astype(np.uint64)
            if left:
                r = np.where(n >= width, 0, (self.read(w, a, t) << n_)) .astype(np.uint64) & _MASK[width]
            elif t[0] == "s":
                r = bits_of(typed(self.read(w, a, t), t) >> np.minimum(n, 63).astype(np.int64), t)
            else:
                r = np.where(n >= width, 0, (self.read(w, a, t) & _MASK[width]) >> n_).astype(np.uint64)
            self.write(w, d, r, m)
        return run

    def _op_shl(self, inst):
        return self._shift(inst, True)

    def _op_shr(self, inst):
        return self._shift(inst, False)

    def _op_bfe(self, inst):
        t, (d, a, b, c) = inst.type(), inst.operands
        if t[0] == "s":
            raise EmulationError(f"PTX line {inst.line}: signed bfe is not modelled")
        width = TYPES[t]

        def run(w, m, _):
            pos = np.minimum(self.read(w, b, "u32") & np.uint64(0xFF), width)
            length = np.minimum(self.read(w, c, "u32") & np.uint64(0xFF), width)
            x = self.read(w, a, t) & _MASK[width]
            shifted = np.where(pos >= 64, np.uint64(0), x >> np.minimum(pos, 63))
            ones = np.where(length >= 64, _MASK[64], (np.uint64(1) << np.minimum(length, 63)) - np.uint64(1))
            self.write(w, d, shifted & ones, m)
        return run

    def _op_selp(self, inst):
        t, (d, a, b, c) = inst.type(), inst.operands
        return lambda w, m, _: self.write(w, d, np.where(self.read(w, c, "pred") != 0, self.read(w, a, t),
                                                         self.read(w, b, t)), m)

    _COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}

    def _op_setp(self, inst):
        t = inst.type()
        cmp = inst.parts[1]
        combine = next((p for p in inst.parts[2:] if p in ("and", "or", "xor")), None)
        dst = inst.operands[0]
        a, b = inst.operands[1:3]
        c = inst.operands[3] if combine else None
        pair = dst.kind == "reg" and "|" in dst.value
        d1, d2 = (Op("reg", x) for x in dst.value.split("|")) if pair else (dst, None)

        def compare(x, y):
            if t[0] == "f":
                with np.errstate(invalid="ignore"):
                    unordered = np.isnan(x) | np.isnan(y)
                    if cmp == "num":
                        return ~unordered
                    if cmp == "nan":
                        return unordered
                    if cmp.endswith("u"):
                        return unordered | self._COMPARE[cmp[:-1]](x, y)
                    return ~unordered & self._COMPARE[cmp](x, y)
            return self._COMPARE[cmp](x, y)

        def run(w, m, _):
            r = compare(typed(self.read(w, a, t), t), typed(self.read(w, b, t), t))
            r2 = ~r
            if combine:
                q = self.read(w, c, "pred") != 0
                op = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[combine]
                r, r2 = op(r, q), op(r2, q)
            self.write(w, d1, r.astype(np.uint64), m)
            if d2 is not None:
                self.write(w, d2, r2.astype(np.uint64), m)
        return run

    def _op_mov(self, inst):
        t = inst.type()
        d, a = inst.operands
        width = TYPES[t]
        if d.kind == "vec":  # unpack
            part = width // len(d.items)
            return lambda w, m, _: [self.write(w, o, (self.read(w, a, t) >> np.uint64(i * part)) & _MASK[part], m)
                                    for i, o in enumerate(d.items)]
        if a.kind == "vec":  # pack, first element lowest
            part = width // len(a.items)
            return lambda w, m, _: self.write(w, d, sum((self.read(w, o, "b%d" % part) & _MASK[part]) << np.uint64(i * part)
                                                        for i, o in enumerate(a.items)), m)
        return lambda w, m, _: self.write(w, d, self.read(w, a, t) & _MASK[max(width, 8)], m)

    def _op_cvt(self, inst):
        types = [p for p in inst.parts[1:] if p in TYPES]
        dt, st = types[0], types[1]
        mods = [p for p in inst.parts[1:] if p not in TYPES]
        rounding = next((p for p in mods if p in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi")), None)
        sat = "sat" in mods
        ops = inst.operands
        if dt in ("f16x2", "bf16x2"):  # d = {cvt(a) high, cvt(b) low}
            conv = "f16" if dt == "f16x2" else "bf16"
            return lambda w, m, _: self.write(w, ops[0], (bits_of(typed(self.read(w, ops[1], st), st), conv) << np.uint64(16)) |
                                              bits_of(typed(self.read(w, ops[2], st), st), conv), m)
        d, a = ops

        def run(w, m, _):
            x = typed(self.read(w, a, st), st)
            if dt[0] == "f" or dt == "bf16":
                with np.errstate(all="ignore"):
                    x = np.asarray(x, np.float64)
                    if rounding in ("rni", "rzi", "rmi", "rpi"):
                        x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[rounding](x)
                    if sat:
                        x = np.where(np.isnan(x), 0.0, np.clip(x, 0.0, 1.0))
                    if dt == "f32" and rounding in ("rz", "rm", "rp"):
                        x = _round_f32(x, rounding)
                    self.write(w, d, bits_of(x.astype(np.float32) if dt in ("f32", "bf16") else x, dt), m)
                return
            width = TYPES[dt]
            if st[0] == "f" or st == "bf16":
                x = np.asarray(x, np.float64)
                x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil, None: np.trunc}[rounding](x)
                lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if dt[0] == "s" else (0, (1 << width) - 1)
                x = np.where(np.isnan(x), 0, np.clip(x, lo, hi))
                self.write(w, d, bits_of(x.astype(np.int64) if dt[0] == "s" else x.astype(np.uint64), dt), m)
                return
            self.write(w, d, bits_of(x, dt), m)
        return run

    def _op_cvta(self, inst):
        d, a = inst.operands
        if "to" in inst.parts:
            space = inst.parts[2]
            if space.startswith("shared"):
                return lambda w, m, _: self.write(w, d, self.read(w, a, "u64") - np.uint64(SHARED_WINDOW), m)
            return lambda w, m, _: self.write(w, d, self.read(w, a, "u64"), m)
        if inst.parts[1].startswith("shared"):
            return lambda w, m, _: self.write(w, d, self.read(w, a, "u64") + np.uint64(SHARED_WINDOW), m)
        return lambda w, m, _: self.write(w, d, self.read(w, a, "u64"), m)

    # -- memory ------------------------------------------------------------------------
    def _space(self, inst) -> str:
        for p in inst.parts[1:]:
            if p in ("global", "shared", "param", "local", "const") or p.startswith("shared::"):
                return p.split("::")[0]
        return "generic"

    def _resolve(self, space: str, addresses: np.ndarray):
        """(memory, addresses in it) for a state space; generic addresses pick by the window."""
        if space == "generic":
            in_shared = (addresses >= np.uint64(SHARED_WINDOW)) & (addresses < np.uint64(SHARED_WINDOW + (1 << 32)))
            if in_shared.all():
                return self.current.shared, addresses - np.uint64(SHARED_WINDOW)
            if in_shared.any():
                raise EmulationError("a generic access mixes shared and global addresses across lanes")
            return self.memory, addresses
        if space == "shared":
            return self.current.shared, addresses
        if space == "global":
            return self.memory, addresses
        raise EmulationError(f"the emulator does not model the .{space} state space")

    def _op_ld(self, inst):
        space = self._space(inst)
        d, a = inst.operands
        t = inst.type()
        width = max(TYPES[t] // 8, 1)
        outs = d.items if d.kind == "vec" else (d,)
        if space == "param":
            name = a.value.value

            def param(w, m, _):
                if name not in self.params:
                    raise EmulationError(f"kernel parameter {name} was not given")
                self.write(w, d, np.full(WARP, (self.params[name] >> (8 * a.offset)) & ((1 << (8 * width)) - 1), np.uint64), m)
            return param

        def run(w, m, _):
            memory, addrs = self._resolve(space, self.address(w, a)[m])
            if memory is self.current.shared:
                self.record_shared(inst, np.flatnonzero(m), addrs, width * len(outs))
            raw = memory.read(addrs, width * len(outs), f"a {'.'.join(inst.parts[:2])}", inst.line)
            for i, o in enumerate(outs):
                vals = np.zeros(WARP, np.uint64)
                vals[m] = _to_lanes(raw[:, i * width:(i + 1) * width])
                self.write(w, o, vals, m)
        return run

    def _op_st(self, inst):
        space = self._space(inst)
        a, s = inst.operands
        t = inst.type()
        width = max(TYPES[t] // 8, 1)
        ins = s.items if s.kind == "vec" else (s,)

        def run(w, m, _):
            memory, addrs = self._resolve(space, self.address(w, a)[m])
            raw = np.concatenate([_to_bytes(self.read(w, o, t)[m], width) for o in ins], axis=1)
            if memory is self.current.shared:
                self.record_shared(inst, np.flatnonzero(m), addrs, raw.shape[1])
                self._check_shared_store(w, addrs, raw.shape[1], inst.line)
            memory.write(addrs, raw, f"a {'.'.join(inst.parts[:2])}", inst.line)
        return run

    def _check_shared_store(self, w: Warp, addrs: np.ndarray, size: int, line: int) -> None:
        """Not over a live mbarrier; in a kernel with TMA stores, not over a box one still has to
        read, and marked unfenced (for the async proxy) until the warp's fence.proxy.async."""
        block = self.current
        block.check_not_mbarrier(addrs.astype(np.int64), size, "a st.shared", line)
        if not self.tma_stores:
            return
        for start, end in block.store_sources:
            if ((addrs < end) & (addrs + size > start)).any():
                raise EmulationError(f"PTX line {line}: a st.shared writes shared memory [{start:#x}, {end:#x}) that "
                                     "a TMA store in flight may not have read yet (cp.async.bulk.wait_group.read "
                                     "first)")
        block.unfenced[(addrs[:, None] + np.arange(size, dtype=np.uint64)).astype(np.int64)] = w.index

    def _op_prefetch(self, inst):
        return lambda w, m, _: None

    _op_membar = _op_prefetch

    def _op_fence(self, inst):
        if inst.parts[1:3] != ["proxy", "async"]:  # the memory model's other fences: warps interleave anyway
            return self._op_prefetch(inst)

        def run(w, m, _):  # the warp's shared-memory writes become visible to TMA
            unfenced = self.current.unfenced
            unfenced[unfenced == w.index] = -1
        return run

    def _op_bra(self, inst):
        target = inst.operands[0].value
        if target not in self.kernel.labels:
            raise EmulationError(f"PTX line {inst.line}: branch to unknown label {target}")
        to = self.kernel.labels[target]

        def run(w, m, _):
            w.pcs[m] = to
        return run

    def _op_ret(self, inst):
        def run(w, m, _):
            w.done |= m
        return run

    _op_exit = _op_ret

    def _op_bar(self, inst):
        if inst.parts[1] == "warp":
            return lambda w, m, _: None
        if len(inst.operands) == 2:
            return self._named_barrier(inst)
        if inst.parts[1] != "sync" or (inst.operands and (inst.operands[0].kind != "imm" or inst.operands[0].value)):
            raise EmulationError(f"PTX line {inst.line}: only bar.sync 0 and barriers with an id and a thread count "
                                 "are modelled")

        def run(w, m, active):
            if not (m == active).all():
                raise EmulationError("bar.sync under a predicate that differs across the warp's lanes")
            w.waiting |= m
            return "yield"
        return run

    def _named_barrier(self, inst):
        """bar.sync / bar.arrive id, count: a warp adds its 32 threads to barrier `id`'s count
        (arriving or also waiting); the `count`-th thread completes it and frees the waiting warps."""
        ident, count = inst.operands
        waits = inst.parts[1] == "sync"

        def run(w, m, active):
            if not (m == active).all():
                raise EmulationError(f"PTX line {inst.line}: a named barrier under a predicate that differs across "
                                     "the warp's lanes")
            bar_id, n = (np.unique(typed(self.read(w, op, "u32"), "u32")[m]) for op in (ident, count))
            if len(bar_id) != 1 or len(n) != 1:
                raise EmulationError(f"PTX line {inst.line}: the warp's lanes name different barriers or counts")
            bar_id, n = int(bar_id[0]), int(n[0])
            if not 0 < bar_id < 16 or n % WARP:
                raise EmulationError(f"PTX line {inst.line}: barrier {bar_id} with {n} threads (ids 1-15 with a "
                                     "multiple of 32 threads are modelled)")
            bar = self.current.named.setdefault(bar_id, [n, 0, []])
            if bar[0] != n:
                raise EmulationError(f"PTX line {inst.line}: barrier {bar_id} used with {n} threads while it counts "
                                     f"{bar[0]}")
            bar[1] += WARP
            if waits:
                w.waiting |= m
                w.named = bar_id
                bar[2].append(w)
            if bar[1] == n:
                for waiter in bar[2]:
                    waiter.waiting[:] = False
                    waiter.named = None
                del self.current.named[bar_id]
            return "yield" if waits else None
        return run

    def _op_barrier(self, inst):  # barrier.sync / .arrive is bar's other spelling
        return self._cluster_barrier(inst) if inst.parts[1] == "cluster" else self._op_bar(inst)

    def _op_setmaxnreg(self, inst):  # registers are not modelled; the instruction is warp-collective
        return lambda w, m, _: self._whole_warp(w, m, "setmaxnreg")

    def _whole_warp(self, w: Warp, m: np.ndarray, what: str) -> None:
        if not (m | w.done).all():
            raise EmulationError(f"{what} executed by lanes {np.flatnonzero(m).tolist()} only: a warp-collective "
                                 "instruction needs the whole warp")

    def _op_shfl(self, inst):
        mode = inst.parts[2]
        d, a, b, c, _mask = inst.operands
        pair = d.kind == "reg" and "|" in d.value
        dst, pdst = (Op("reg", x) for x in d.value.split("|")) if pair else (d, None)

        def run(w, m, _):
            self._whole_warp(w, m, "shfl.sync")
            lane = np.arange(WARP)
            bval = typed(self.read(w, b, "u32"), "u32").astype(np.int64) & 31
            cval = typed(self.read(w, c, "u32"), "u32").astype(np.int64)
            clamp, segmask = cval & 31, (cval >> 8) & 31
            max_lane = (lane & segmask) | (clamp & ~segmask)
            min_lane = lane & segmask
            src = {"bfly": lane ^ bval, "up": lane - bval, "down": lane + bval, "idx": (bval & ~segmask) | min_lane}[mode]
            ok = (src >= min_lane) if mode == "up" else (src <= max_lane)
            src = np.where(ok, src, lane)
            vals = self.read(w, a, "b32")
            self.write(w, dst, vals[src], m)
            if pdst is not None:
                self.write(w, pdst, ok.astype(np.uint64), m)
        return run

    # -- Tensor Cores: ldmatrix, mma.sync ------------------------------------------------
    def _op_ldmatrix(self, inst):
        count = int(next(p for p in inst.parts if p.startswith("x"))[1:])
        trans = "trans" in inst.parts
        d, a = inst.operands
        space = self._space(inst)

        def run(w, m, _):
            self._whole_warp(w, m, "ldmatrix")
            memory, addrs = self._resolve(space, self.address(w, a))
            lane = np.arange(WARP)
            if memory is self.current.shared:
                self.record_shared(inst, lane[:8 * count], addrs[:8 * count], 16)
            rows = memory.read(addrs[:8 * count], 16, "an ldmatrix row", inst.line).view(np.uint16)  # (8*count, 8)
            for i, o in enumerate(d.items):
                mat = rows[8 * i:8 * i + 8]
                if trans:
                    mat = mat.T
                r, c = lane // 4, (lane % 4) * 2
                self.write(w, o, mat[r, c].astype(np.uint64) | (mat[r, c + 1].astype(np.uint64) << np.uint64(16)), m)
        return run

    @staticmethod
    def _halves(bits: np.ndarray, t: str) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = bits & _MASK[16], (bits >> np.uint64(16)) & _MASK[16]
        return typed(lo, t).astype(np.float64), typed(hi, t).astype(np.float64)

    def _op_mma(self, inst):
        shape = inst.parts[3]
        if shape != "m16n8k16" or inst.parts[4:6] != ["row", "col"]:
            raise EmulationError(f"PTX line {inst.line}: only mma.sync m16n8k16.row.col is modelled")
        dtype, atype, btype, ctype = inst.parts[6:10]
        d, a, b, c = inst.operands
        lane = np.arange(WARP)
        g, tq = lane // 4, lane % 4

        def run(w, m, _):
            self._whole_warp(w, m, "mma.sync")
            A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
            for r, o in enumerate(a.items):  # a0..a7: rows g (+8 for registers 1, 3), columns 2t (+8 for 2, 3)
                lo, hi = self._halves(self.read(w, o, "b32"), atype)
                row, col = g + 8 * (r % 2), 2 * tq + 8 * (r // 2)
                A[row, col], A[row, col + 1] = lo, hi
            for r, o in enumerate(b.items):  # b0..b3: rows (k) 2t (+8 for register 1), column g
                lo, hi = self._halves(self.read(w, o, "b32"), btype)
                k = 2 * tq + 8 * r
                B[k, g], B[k + 1, g] = lo, hi
            for r, o in enumerate(c.items):  # c0..c3: rows g (+8 for 2, 3), columns 2t (+1)
                C[g + 8 * (r // 2), 2 * tq + r % 2] = typed(self.read(w, o, ctype), ctype)
            D = (A @ B + C).astype(np.float32)
            for r, o in enumerate(d.items):
                self.write(w, o, bits_of(D[g + 8 * (r // 2), 2 * tq + r % 2], dtype), m)
        return run

    # -- cp.async ------------------------------------------------------------------------
    def _cp_async(self, inst):
        kind = inst.parts[2]
        if kind == "commit_group":
            def commit(w, m, active):
                self._whole_warp(w, m, "cp.async.commit_group")
                w.groups.append(w.copies)
                w.copies = []
            return commit
        if kind in ("wait_group", "wait_all"):
            keep = inst.operands[0].value if kind == "wait_group" else 0

            def wait(w, m, _):
                self._whole_warp(w, m, f"cp.async.{kind}")
                if kind == "wait_all":
                    w.groups.append(w.copies)
                    w.copies = []
                while len(w.groups) > keep:
                    for copy in w.groups.pop(0):
                        self._deliver(copy)
            return wait
        if kind not in ("ca", "cg"):
            raise EmulationError(f"PTX line {inst.line}: the emulator does not model '{inst.opcode}'")
        dst, src, size = inst.operands[:3]
        src_size = inst.operands[3] if len(inst.operands) > 3 else None

        def issue(w, m, _):
            d = self.address(w, dst)[m]
            s = self.address(w, src)[m]
            n = size.value
            ss = typed(self.read(w, src_size, "u32"), "u32")[m] if src_size is not None else np.full(len(d), n, np.uint64)
            shared = self.current.shared
            self.record_shared(inst, np.flatnonzero(m), d, n)
            shared.offsets(d, n, "a cp.async destination", inst.line)
            self.current.check_not_mbarrier(d.astype(np.int64), n, "a cp.async", inst.line)
            shared.write(d, np.full((len(d), n), POISON, np.uint8), "a cp.async", inst.line)  # may land early
            w.copies.append(_Copy(d, s, n, ss, inst.line))
        return issue

    def _deliver(self, copy: _Copy) -> None:
        data = np.zeros((len(copy.dst), copy.size), np.uint8)
        for n in np.unique(copy.src_size):
            rows = copy.src_size == n
            if n:
                data[rows, :int(n)] = self.memory.read(copy.src[rows], int(n), "a cp.async source read", copy.line)
        self.current.shared.write(copy.dst, data, "a cp.async", copy.line)

    # -- mbarrier and TMA ----------------------------------------------------------------
    def _op_mbarrier(self, inst):
        what = inst.parts[1]
        if what == "init":
            a, count = inst.operands

            def init(w, m, _):
                n = int(typed(self.read(w, count, "u32"), "u32")[m][0])
                for addr in np.unique(self.address(w, a)[m]).tolist():
                    block, addr = self.in_cluster(w, addr, inst.line)
                    block.shared.offsets(np.array([addr], np.uint64), 8, "an mbarrier", inst.line)
                    block.mbarriers[addr] = [n, n, 0, 0]
            return init
        if what == "arrive":
            expect = "expect_tx" in inst.parts
            a = inst.operands[1]
            tx = inst.operands[2] if expect else None

            def arrive(w, m, _):
                addrs = self.address(w, a)[m]
                txs = typed(self.read(w, tx, "u32"), "u32")[m] if expect else np.zeros(len(addrs), np.uint64)
                for addr, nbytes in zip(addrs.tolist(), txs.tolist()):
                    block, addr = self.in_cluster(w, addr, inst.line)  # a peer's, after mapa
                    bar = self._barrier(block, addr, inst.line)
                    bar[2] += int(nbytes)
                    bar[1] -= 1
                    self._maybe_complete(block, addr)
            return arrive
        if what in ("try_wait", "test_wait"):
            if "parity" not in inst.parts:
                raise EmulationError(f"PTX line {inst.line}: only mbarrier waits on a phase parity are modelled")
            p, a, parity = inst.operands[:3]

            def wait(w, m, _):
                addrs = self.address(w, a)
                par = typed(self.read(w, parity, "u32"), "u32")
                result = np.zeros(WARP, np.uint64)
                for addr in np.unique(addrs[m]).tolist():
                    self._flush_tma(self.current, addr)  # the copies land as late as possible: when someone waits
                    bar = self._barrier(self.current, addr, inst.line)
                    lanes = m & (addrs == addr)
                    result[lanes] = ((bar[3] & 1) != (par[lanes] & np.uint64(1))).astype(np.uint64)
                self.write(w, p, result, m)
                if not result[m].all():
                    return "spin"
            return wait
        raise EmulationError(f"PTX line {inst.line}: the emulator does not model '{inst.opcode}'")

    @staticmethod
    def _barrier(block: Block, addr: int, line: int) -> list[int]:
        bar = block.mbarriers.get(addr)
        if bar is None:
            raise EmulationError(f"PTX line {line}: mbarrier at shared {addr:#x} of block {block.ctaid} used before "
                                 "mbarrier.init")
        return bar

    @staticmethod
    def _maybe_complete(block: Block, addr: int) -> None:
        bar = block.mbarriers[addr]
        if bar[1] == 0 and bar[2] == 0:
            bar[1], bar[3] = bar[0], bar[3] + 1

    def _flush_tma(self, block: Block, addr: int) -> None:
        for copy in block.tma.pop(addr, []):
            self._deliver_tma(block, *copy)
            block.mbarriers[addr][2] -= copy[3]
        if addr in block.mbarriers:
            self._maybe_complete(block, addr)

    def in_cluster(self, warp: Warp, addr: int, line: int) -> tuple[Block, int]:
        """The block and shared offset a shared::cluster address names: `mapa` sets CLUSTER_BIT
        and the rank above the offset; a plain shared::cta offset is the current block's."""
        if not addr & CLUSTER_BIT:
            return self.current, addr
        return self.peer(warp, (addr >> CLUSTER_RANK_SHIFT) & 0x7F, line), addr & ((1 << CLUSTER_RANK_SHIFT) - 1)

    def peer(self, warp: Warp, rank: int, line: int) -> Block:
        """Block `rank` of the current one's cluster, whose shared memory `warp` is about to use:
        only after a barrier.cluster (before it the block may not have initialized its mbarriers)
        and before the block exits."""
        if rank >= len(self.current.cluster):
            raise EmulationError(f"PTX line {line}: rank {rank} is outside the cluster of {len(self.current.cluster)} "
                                 "blocks")
        block = self.current.cluster[rank]
        if block is not self.current and not warp.cluster_synced:
            raise EmulationError(f"PTX line {line}: block {block.ctaid}'s shared memory is used before a "
                                 "barrier.cluster: its mbarriers may not be initialized yet")
        if block.exited:
            raise EmulationError(f"PTX line {line}: block {block.ctaid}'s shared memory is used after it exited "
                                 "(a barrier.cluster before exiting keeps the cluster's blocks alive)")
        return block

    def _op_mapa(self, inst):
        d, a, rank = inst.operands

        def run(w, m, _):
            offsets = self.read(w, a, "u32") & np.uint64((1 << CLUSTER_RANK_SHIFT) - 1)
            ranks = self.read(w, rank, "u32")
            if (ranks[m] >= len(self.current.cluster)).any():
                raise EmulationError(f"PTX line {inst.line}: mapa to a rank outside the cluster")
            self.write(w, d, np.uint64(CLUSTER_BIT) | (ranks << np.uint64(CLUSTER_RANK_SHIFT)) | offsets, m)
        return run

    def _cluster_barrier(self, inst):
        if inst.parts[2] == "arrive":
            def arrive(w, m, _):
                self._whole_warp(w, m, "barrier.cluster.arrive")
                if w.cluster_phase is not None:
                    raise EmulationError(f"PTX line {inst.line}: barrier.cluster.arrive twice without a wait")
                state = self.current.cluster_barrier
                w.cluster_phase = state.phase
                state.arrived += int(m.sum())
                if state.arrived == state.threads:
                    state.arrived, state.phase = 0, state.phase + 1
            return arrive

        def wait(w, m, active):
            self._whole_warp(w, m, "barrier.cluster.wait")
            if w.cluster_phase is None:
                raise EmulationError(f"PTX line {inst.line}: barrier.cluster.wait without an arrive")
            if self.current.cluster_barrier.phase == w.cluster_phase:
                w.pcs[active] -= 1  # stay here
                return "spin"
            w.cluster_phase, w.cluster_synced = None, True
        return wait

    def _tma(self, inst):
        if not {"2d", "3d"} & set(inst.parts) or "mbarrier::complete_tx::bytes" not in inst.parts:
            raise EmulationError(f"PTX line {inst.line}: only 2-D and 3-D TMA loads completing on an mbarrier are "
                                 "modelled")
        dst, src, bar = inst.operands[:3]
        multicast = inst.operands[3] if "multicast::cluster" in inst.parts else None

        def issue(w, m, _):
            for lane in np.flatnonzero(m).tolist():
                d = int(self.address(w, dst)[lane])
                d -= SHARED_WINDOW if d >= SHARED_WINDOW else 0
                tm, coords = self._tma_map(w, lane, src, len(src.items), inst.line)
                b = int(self.address(w, bar)[lane])
                mask = int(self.read(w, multicast, "u16")[lane]) if multicast else 1 << self.current.rank
                ranks = [r for r in range(len(self.current.cluster)) if mask >> r & 1]
                if not ranks or mask >> len(self.current.cluster):
                    raise EmulationError(f"PTX line {inst.line}: multicast mask {mask:#x} names no block or one "
                                         f"outside the cluster of {len(self.current.cluster)}")
                inner, outer = tm.box
                nbytes = inner * outer * tm.item
                self._check_swizzled_box(tm, d)
                targets = swizzled(np.arange(d, d + nbytes, tm.item, dtype=np.uint64), tm.swizzle)
                for rank in ranks:  # the same offsets, and the same mbarrier, in each block the mask names
                    block = self.peer(w, rank, inst.line)
                    self._barrier(block, b, inst.line)
                    block.check_not_mbarrier(targets.astype(np.int64), tm.item, "a TMA copy", inst.line)
                    block.shared.write(targets, np.full((len(targets), tm.item), POISON, np.uint8), "a TMA copy",
                                       inst.line)
                    block.tma.setdefault(b, []).append((targets, tm, coords, nbytes, inst.line))
        return issue

    def _tma_map(self, w: Warp, lane: int, op: Op, dims: int, line: int) -> tuple[TensorMap, list[int]]:
        """The tensor map and coordinates of a TMA operand [map, {x, y[, z]}]."""
        tm_addr = int(self.read(w, op.value, "u64")[lane])
        tm = self.tensor_maps.get(tm_addr)
        if tm is None:
            raise EmulationError(f"{tm_addr:#x} is not the address of a tensor map")
        coords = [int(typed(self.read(w, c, "s32"), "s32")[lane]) for c in op.items]
        if len(coords) != dims or dims != (3 if tm.slices else 2):
            raise EmulationError(f"PTX line {line}: {len(coords)} coordinates for a {3 if tm.slices else 2}-D tensor "
                                 "map")
        return tm, coords

    def _tma_store(self, inst):
        """cp.async.bulk.tensor.2d.global.shared::cta.bulk_group: the box is read from shared
        memory (checked: fenced, and not written again until a wait_group.read retires it) and
        written to global memory, clipped to the tensor, when its bulk group is waited for."""
        if "2d" not in inst.parts or "bulk_group" not in inst.parts:
            raise EmulationError(f"PTX line {inst.line}: only 2-D TMA stores completing in bulk groups are modelled")
        dst, src = inst.operands[:2]

        def issue(w, m, _):
            block = self.current
            for lane in np.flatnonzero(m).tolist():
                tm, coords = self._tma_map(w, lane, dst, 2, inst.line)
                s = int(self.address(w, src)[lane])
                s -= SHARED_WINDOW if s >= SHARED_WINDOW else 0
                inner, outer = tm.box
                nbytes = inner * outer * tm.item
                self._check_swizzled_box(tm, s)
                sources = swizzled(np.arange(s, s + nbytes, tm.item, dtype=np.uint64), tm.swizzle)
                data = block.shared.read(sources, tm.item, "a TMA store's source read", inst.line)
                writers = block.unfenced[s:s + nbytes]
                if (writers >= 0).any():
                    raise EmulationError(f"PTX line {inst.line}: a TMA store reads shared memory that warp "
                                         f"{int(writers[writers >= 0][0])} wrote without a fence.proxy.async after")
                block.store_sources.append((s, s + nbytes))
                w.stores.append((data, tm, coords, (s, s + nbytes), inst.line))
        return issue

    def _bulk_group(self, inst):
        kind = inst.parts[3]
        if kind == "commit_group":
            def commit(w, m, _):
                w.store_groups.append(w.stores)
                w.stores = []
            return commit
        if kind != "wait_group":
            raise EmulationError(f"PTX line {inst.line}: the emulator does not model '{inst.opcode}'")
        keep = inst.operands[0].value

        def wait(w, m, _):
            while len(w.store_groups) > keep:
                for data, tm, coords, source, line in w.store_groups.pop(0):
                    self.current.store_sources.remove(source)
                    x, y, inside = self._box_elements(tm, coords)
                    if inside.any():
                        dst = (tm.address + (y[inside] * tm.cols + x[inside]) * tm.item).astype(np.uint64)
                        self.memory.write(dst, data[inside], "a TMA store", line)
        return wait

    @staticmethod
    def _check_swizzled_box(tm: TensorMap, address: int) -> None:
        inner = tm.box[0]
        if tm.swizzle and (inner * tm.item != tm.swizzle or address % 1024):
            raise EmulationError(f"a {tm.swizzle}-byte swizzled TMA box needs {tm.swizzle}-byte rows and a 1024-byte "
                                 f"aligned shared-memory address (rows of {inner * tm.item} bytes at {address:#x})")

    @staticmethod
    def _box_elements(tm: TensorMap, coords) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A box's elements in the tensor, row by row: column, row, and whether inside it."""
        inner, outer = tm.box
        x = coords[0] + np.tile(np.arange(inner), outer)
        y = coords[1] + np.repeat(np.arange(outer), inner)
        return x, y, (x >= 0) & (x < tm.cols) & (y >= 0) & (y < tm.rows)

    def _deliver_tma(self, block: Block, targets, tm: TensorMap, coords, nbytes, line) -> None:
        x, y, inside = self._box_elements(tm, coords)
        if tm.slices:  # a 3-D box is one slice deep
            inside &= 0 <= coords[2] < tm.slices
            y = y + coords[2] * tm.rows
        data = np.zeros((len(targets), tm.item), np.uint8)  # zeros outside the tensor
        if inside.any():
            src = (tm.address + (y[inside] * tm.cols + x[inside]) * tm.item).astype(np.uint64)
            data[inside] = self.memory.read(src, tm.item, "a TMA source read", line)
        block.shared.write(targets, data, "a TMA copy", line)

    # -- wgmma -----------------------------------------------------------------------------
    def _op_wgmma(self, inst):
        what = inst.parts[1]
        if what == "fence":
            return lambda w, m, _: self._whole_warp(w, m, "wgmma.fence")
        if what == "commit_group":
            def commit(w, m, _):
                self._whole_warp(w, m, "wgmma.commit_group")
                w.mma_groups.append(w.mma_open)
                w.mma_open = []
            return commit
        if what == "wait_group":
            keep = inst.operands[0].value

            def wait(w, m, _):
                self._whole_warp(w, m, "wgmma.wait_group")
                while len(w.mma_groups) > keep:
                    for op in w.mma_groups.pop(0):
                        self._retire_wgmma(w, op)
            return wait
        if what != "mma_async":
            raise EmulationError(f"PTX line {inst.line}: the emulator does not model '{inst.opcode}'")
        shape = next(p for p in inst.parts if re.fullmatch(r"m64n\d+k16", p))
        if inst.parts[-3] != "f32":
            raise EmulationError(f"PTX line {inst.line}: only f32 accumulators are modelled")
        d, desc_a, desc_b, scale_d = inst.operands[:4]
        if desc_a.kind == "vec" and len(desc_a.items) != 4:
            raise EmulationError(f"PTX line {inst.line}: A in registers is 4 b32 registers, got {len(desc_a.items)}")
        n = int(re.search(r"n(\d+)", shape).group(1))
        if len(d.items) != n // 2:
            raise EmulationError(f"PTX line {inst.line}: {shape} needs {n // 2} accumulator registers")

        def issue(w, m, _):
            self._whole_warp(w, m, "wgmma.mma_async")
            names = [o.value for o in d.items]
            in_flight = {bool(w.mma_in_flight.get(x)) for x in names}
            if len(in_flight) > 1:
                raise EmulationError("a wgmma accumulates into registers only some of which a wgmma in flight writes")
            chained = in_flight == {True}  # D += on the result of the one before: read at retirement
            old = None if chained else {x: w.regs.get(x, np.zeros(WARP, np.uint64)).copy() for x in names}
            db = int(self.read(w, desc_b, "b64")[0])
            a_regs = None
            if desc_a.kind == "vec":
                da, a_regs = 0, np.stack([self.read(w, o, "b32") for o in desc_a.items])
            else:
                da = int(self.read(w, desc_a, "b64")[0])
            sd = bool(self.read(w, scale_d, "pred")[0])
            w.mma_open.append(_Wgmma(inst, old, da, db, sd, a_regs))
            for x in names:  # the accumulators are the Tensor Cores' until the wait
                if not chained:
                    w.regs[x] = np.full(WARP, 0x7FC00000, np.uint64)
                w.mma_in_flight[x] = w.mma_in_flight.get(x, 0) + 1
        return issue

    def _descriptor_matrix(self, desc: int, rows: int, k_major: bool, item: int, t: str) -> np.ndarray:
        """The rows x 16 (A, K-major), or 16 x rows transposed, operand a wgmma descriptor points
        at, in the canonical layouts of the PTX ISA (128-byte swizzle)."""
        start = (desc & 0x3FFF) << 4
        lbo = ((desc >> 16) & 0x3FFF) << 4
        sbo = ((desc >> 32) & 0x3FFF) << 4
        base_offset, mode = (desc >> 49) & 7, desc >> 62
        if mode != 1 or base_offset:
            raise EmulationError(f"wgmma descriptor {desc:#x}: the emulator models 128-byte swizzled operands with "
                                 "base offset 0 only")
        mn = np.arange(rows)[:, None]
        k = np.arange(16)[None, :]
        if k_major:  # ((8,m),(T,2k)):((8T,SBO),(1,T)) elements
            offset = (mn % 8) * 128 + (mn // 8) * sbo + k * item
        else:  # ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), T = 16 bytes of elements
            per_row = 128 // item
            offset = (mn % per_row) * item + (mn // per_row) * lbo + (k % 8) * 128 + (k // 8) * sbo
        addrs = swizzled((start + offset).astype(np.uint64).reshape(-1), 128)
        raw = self.current.shared.read(addrs, item, "a wgmma operand read", 0)
        return typed(_to_lanes(raw), t).astype(np.float64).reshape(rows, 16)

    def _retire_wgmma(self, w: Warp, op: _Wgmma) -> None:
        inst = op.inst
        n = int(re.search(r"m64n(\d+)k16", inst.opcode).group(1))
        atype, btype = inst.parts[-2], inst.parts[-1]
        imm = [o.value for o in inst.operands[4:]]
        lane = np.arange(WARP)
        g, tq = lane // 4, lane % 4
        item = 2
        if op.a_regs is None:
            scale_a, scale_b, trans_a, trans_b = (imm + [1, 1, 0, 0])[:4]
            A = self._descriptor_matrix(op.desc_a, 64, trans_a == 0, item, atype)[16 * (w.index % 4):][:16]
        else:  # the warp's 16 rows of A, laid out as mma.sync m16n8k16's A fragments
            scale_a, scale_b, trans_b = (imm + [1, 1, 0])[:3]
            A = np.zeros((16, 16))
            for r, bits in enumerate(op.a_regs):
                lo, hi = self._halves(bits, atype)
                row, col = g + 8 * (r % 2), 2 * tq + 8 * (r // 2)
                A[row, col], A[row, col + 1] = lo, hi
        B = self._descriptor_matrix(op.desc_b, n, trans_b == 0, item, btype)  # [n, k]
        rows = (scale_a * A) @ (scale_b * B).T  # the warp's 16 x n of D
        for i, o in enumerate(inst.operands[0].items):
            prev = typed(op.old[o.value] if op.old is not None else w.mma_values.pop(o.value), "f32").astype(np.float64)
            value = rows[g + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * tq + i % 2]
            result = bits_of((value + prev if op.scale_d else value).astype(np.float32), "f32")
            w.mma_in_flight[o.value] -= 1
            if w.mma_in_flight[o.value]:  # a later wgmma in flight accumulates onto it: the register stays NaN
                w.mma_values[o.value] = result
            else:
                w.regs[o.value] = result


# -- the driver: a GpuKernelArtifact run on numpy arrays ------------------------------------

_NUMPY = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}


def _host_bytes(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return bf16_bits(np.asarray(array, np.float32)).astype(np.uint16).view(np.uint8).reshape(-1)
    return np.ascontiguousarray(np.asarray(array, _NUMPY[dtype])).view(np.uint8).reshape(-1)


def _from_bytes(raw: np.ndarray, dtype: str, shape) -> np.ndarray:
    if dtype == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return raw.view(_NUMPY[dtype]).reshape(shape).astype(np.float32)


def emulate(artifact, *inputs, seed: int = 0, blocks=None, shared_accesses: list | None = None) -> list[np.ndarray]:
    """Run `artifact` (runtime.gpu_artifact.GpuKernelArtifact) on numpy inputs, one per input
    Param in order (bf16 given as float32); returns its outputs as float32 arrays. `blocks`: the
    block indices (x, y, z) to run, default all (outputs of blocks not run stay NaN).
    `shared_accesses`: a list to which every warp instruction's shared-memory access is
    appended (SharedAccess), for bank_conflicts.measured."""
    kernel = parse(artifact.ptx)
    tensors = [p for p in artifact.params if p.tensor_map is None and p.shape is not None]
    inputs_ = [p for p in tensors if not p.output]
    if len(inputs) != len(inputs_):
        raise EmulationError(f"{artifact.name} takes {len(inputs_)} inputs, got {len(inputs)}")
    for p, x in zip(inputs_, inputs):
        if tuple(np.shape(x)) != tuple(p.shape):
            raise EmulationError(f"{artifact.name}: {p.name} must have shape {list(p.shape)}, got {list(np.shape(x))}")
    item = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i32": 4, "i64": 8}
    sizes = [math.prod(p.shape) * item[p.dtype] for p in tensors]
    maps = [p for p in artifact.params if p.tensor_map is not None]
    layout, offset = [], 0
    for size in sizes + [128] * len(maps):
        layout.append(offset)
        offset += -(-size // 256) * 256 + 4096  # a red zone after each allocation
    em = Emulator(kernel, artifact.grid, artifact.block, artifact.dynamic_shared_bytes)
    em.memory = Memory("global", offset, GLOBAL_BASE, valid=False)
    em.shared_accesses = shared_accesses
    addresses = {}
    for i, (p, size) in enumerate(zip(tensors, sizes)):
        start = layout[i]
        em.memory.valid[start:start + size] = True
        em.memory.regions.append((GLOBAL_BASE + start, size, p.name))
        addresses[p.name] = GLOBAL_BASE + start
        if not p.output:
            em.memory.data[start:start + size] = _host_bytes(inputs[inputs_.index(p)], p.dtype)
    for j, p in enumerate(maps):
        source = artifact.params[p.tensor_map[0]]
        address = GLOBAL_BASE + layout[len(tensors) + j]
        sliced = p.tensor_map_rank == 3  # [..., rows, cols] as slices of matrices, else one matrix
        rows = source.shape[-2] if sliced else math.prod(source.shape[:-1])
        em.tensor_maps[address] = TensorMap(addresses[source.name], rows, source.shape[-1], item[source.dtype],
                                            (p.tensor_map[1], p.tensor_map[2]), p.tensor_map[3],
                                            math.prod(source.shape[:-2]) if sliced else 0)
        addresses[p.name] = address
    values = [addresses[p.name] for p in artifact.params]
    arguments = artifact.launch_arguments(values)
    if len(arguments) != len(kernel.params):
        raise EmulationError(f"{artifact.name}: {len(arguments)} launch arguments for {len(kernel.params)} PTX "
                             "parameters")
    for (name, _type), (ctype, value) in zip(kernel.params, arguments):
        em.params[name] = int(value) if ctype != "f32" else int(np.float32(value).view(np.uint32))
    grid = artifact.grid
    cluster = kernel.cluster
    if any(g % c for g, c in zip(grid, cluster)):
        raise EmulationError(f"grid {list(grid)} is not a whole number of {list(cluster)} clusters")
    origins = sorted({tuple(i - i % c for i, c in zip(ctaid, cluster)) for ctaid in blocks}) if blocks else [
        (x, y, z) for z in range(0, grid[2], cluster[2]) for y in range(0, grid[1], cluster[1])
        for x in range(0, grid[0], cluster[0])]
    for origin in origins:  # a cluster's blocks, by rank (x fastest)
        members = [(origin[0] + x, origin[1] + y, origin[2] + z)
                   for z in range(cluster[2]) for y in range(cluster[1]) for x in range(cluster[0])]
        run_cluster(em, [Block(em, ctaid) for ctaid in members],
                    random.Random(hash((seed, origin))))
    outputs = []
    for p, size in zip(tensors, sizes):
        if p.output:
            start = addresses[p.name] - GLOBAL_BASE
            outputs.append(_from_bytes(em.memory.data[start:start + size].copy(), p.dtype, p.shape))
    return outputs
