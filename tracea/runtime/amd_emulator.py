"""An emulator of the AMD GPU instruction set, enough of it to run Tracea's ROCm kernels here.

No AMD GPU lends itself to this project, so the kernels' numbers are checked the way the PTX
emulator checks NVIDIA's: the machine code is run, instruction by instruction, on every lane of
every wave of every workgroup, and the result compared with numpy. What runs is the kernel's
assembly as LLVM's AMDGPU back end printed it beside the code object (the same module, the same
code generator; HsacoKernelArtifact.asm), read into instructions once.

Modelled: CDNA (gfx90a, gfx942: wave64) and RDNA3 (gfx1100: wave32) as far as Tracea's kernels
use them: scalar and vector ALU (f32, f16 conversions, 16/24/32/64-bit integers, SDWA operand
selects), compares into VCC / SGPR pairs / EXEC, EXEC-masked control flow, global memory through
64-bit lane addresses (every access checked against the buffers it may touch), LDS with
s_barrier across a workgroup's waves, kernel arguments through the kernarg segment, workgroup
and packed work-item ids as the .amdhsa directives ask. Timing, caches, wait counts and memory
ordering between waves are not: a kernel that needs an s_waitcnt it lacks still passes here.
An instruction outside this set stops the run with EmulatorError naming it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import TraceaError
from .dtypes import to_numpy
from .gpu_artifact import checked_inputs


class EmulatorError(TraceaError, RuntimeError):
    """The kernel did something the emulator does not model, or something no GPU allows (an
    access outside every buffer); the message names the instruction."""


GLOBAL_BASE = 1 << 32  # buffers live above 4 GiB: a 32-bit truncation of an address cannot alias one
VCC, M0, EXEC = 106, 124, 126  # SGPR numbers of vcc_lo, m0, exec_lo (vcc_hi, exec_hi follow)
SPECIAL = {"vcc": (VCC, 2), "vcc_lo": (VCC, 1), "vcc_hi": (VCC + 1, 1), "exec": (EXEC, 2), "exec_lo": (EXEC, 1),
           "exec_hi": (EXEC + 1, 1), "m0": (M0, 1), "null": (120, 2)}  # (null: written, never read)
INLINE_FLOATS = {"0.5": 0x3F000000, "-0.5": 0xBF000000, "1.0": 0x3F800000, "-1.0": 0xBF800000, "2.0": 0x40000000,
                 "-2.0": 0xC0000000, "4.0": 0x40800000, "-4.0": 0xC0800000, "0.15915494": 0x3E22F983}
# waits, scheduling hints and cache maintenance: nothing a value depends on in this model
IGNORED = {"s_waitcnt", "s_waitcnt_vscnt", "s_waitcnt_lgkmcnt", "s_waitcnt_vmcnt", "s_waitcnt_depctr", "s_nop",
           "s_delay_alu", "s_clause", "s_sendmsg", "s_set_inst_prefetch_distance", "s_setprio", "buffer_gl0_inv",
           "buffer_gl1_inv", "buffer_wbl2", "buffer_inv"}


@dataclass(frozen=True)
class Operand:
    kind: str  # "s", "v", "a" (registers), "imm", "label"
    index: int = 0  # first register, or the immediate's value (32-bit pattern, sign kept for ints)
    count: int = 1  # registers
    neg: bool = False
    abs: bool = False
    text: str = ""
    half: str = ""  # RDNA3's 16-bit operands: "l" or "h", the low or high half of a VGPR


@dataclass
class Instruction:
    mnemonic: str
    operands: list[Operand]
    modifiers: dict[str, str]
    line: str
    handler: object = None


@dataclass(frozen=True)
class LdsAccess:
    """One LDS instruction of one wave as it ran: its active lanes' byte addresses."""
    line: str
    width: int  # bytes each lane reads or writes
    lanes: np.ndarray
    addresses: np.ndarray


@dataclass
class Program:
    name: str
    instructions: list[Instruction]
    labels: dict[str, int]
    directives: dict[str, int]
    args: list[tuple[int, int]] = field(default_factory=list)  # (offset, size) of each kernel argument


_REGISTER = re.compile(r"^([sva])(?:(\d+)|\[(\d+):(\d+)\])$")


def _operand(text: str) -> Operand:
    t, neg, absolute = text.strip(), False, False
    if t.startswith("-") and not re.match(r"^-\d|^-0x", t):
        neg, t = True, t[1:]
    if t.startswith("|") and t.endswith("|"):
        absolute, t = True, t[1:-1]
    if t.startswith("neg(") or t.startswith("abs("):
        raise EmulatorError(f"operand modifier {text!r} is not modelled")
    if t in SPECIAL:
        index, count = SPECIAL[t]
        return Operand("s", index, count, neg, absolute, text)
    m = re.match(r"^v(\d+)\.([lh])$", t)
    if m:
        return Operand("v", int(m.group(1)), 1, neg, absolute, text, m.group(2))
    m = _REGISTER.match(t)
    if m:
        first = int(m.group(2) if m.group(2) is not None else m.group(3))
        last = first if m.group(2) is not None else int(m.group(4))
        return Operand(m.group(1), first, last - first + 1, neg, absolute, text)
    if t.startswith("."):
        return Operand("label", text=t)
    if t.startswith("gpr_idx("):  # s_set_gpr_idx_on's modes: which operands the index moves
        return Operand("gpr_idx", text=t[len("gpr_idx("):-1])
    if t in INLINE_FLOATS:
        return Operand("imm", INLINE_FLOATS[t], neg=neg, abs=absolute, text=t)
    try:
        value = int(t, 0)
    except ValueError:
        raise EmulatorError(f"operand {text!r} is not modelled") from None
    return Operand("imm", -value if neg else value, abs=absolute, text=t)


def _split_operands(rest: str) -> tuple[list[str], dict[str, str]]:
    """Operands (comma separated, the last one running up to the first `key:value` / flag
    modifier) and the modifiers."""
    parts = [p.strip() for p in re.split(r",(?![^\[(]*[\])])", rest)] if rest.strip() else []
    modifiers: dict[str, str] = {}
    if parts:
        words = parts[-1].split()
        parts[-1] = words[0] if words else ""
        for word in words[1:]:
            key, _, value = word.partition(":")
            modifiers[key] = value
    return [p for p in parts if p], modifiers


def parse(asm: str, kernel: str) -> Program:
    """The kernel's instructions, labels, .amdhsa directives and argument layout, from the
    assembly LLVM printed."""
    start = asm.find(f"\n{kernel}:\n")
    end = asm.find(".Lfunc_end", start)
    if start < 0 or end < 0:
        raise EmulatorError(f"no kernel {kernel} in the assembly")
    instructions, labels = [], {}
    for raw in asm[start + len(kernel) + 3:end].splitlines():
        line = raw.split(";")[0].strip()
        if not line or line.startswith("."):
            if line.endswith(":"):
                labels[line[:-1]] = len(instructions)
            continue
        if line.endswith(":"):
            labels[line[:-1]] = len(instructions)
            continue
        if " :: " in line:  # an RDNA3 dual issue: two instructions, sources read before either writes
            halves = [h.strip() for h in line.split("::")]
            parsed = [_instruction(h) for h in halves]
            instructions.append(Instruction("v_dual", [], {}, line, parsed))
            continue
        instructions.append(_instruction(line))
    directives = {k: int(v) for k, v in re.findall(r"\.(amdhsa_\w+) (\d+)", asm)}
    meta = asm[asm.find("amdhsa.kernels:"):]
    args = [(int(o), int(s)) for o, s in re.findall(r"\.offset:\s+(\d+)\s+\.size:\s+(\d+)", meta)]
    return Program(kernel, instructions, labels, directives, args)


def _instruction(line: str) -> Instruction:
    mnemonic, _, rest = line.partition(" ")
    if mnemonic in IGNORED or mnemonic in ("s_barrier", "s_endpgm"):
        return Instruction(mnemonic, [], {}, line)
    texts, modifiers = _split_operands(rest)
    operands = [Operand("off", text="off") if t == "off" else _operand(t) for t in texts]
    if mnemonic.startswith("v_dual_"):  # one half of an RDNA3 dual issue: the plain instruction
        mnemonic = "v_" + mnemonic[len("v_dual_"):]
        if mnemonic == "v_cndmask_b32" and len(operands) == 3:
            operands.append(_operand("vcc_lo"))  # (implicit in the dual form)
    return Instruction(mnemonic, operands, modifiers, line)


class Wave:
    """One wave's registers: SGPRs (with VCC, M0, EXEC at their hardware numbers), VGPRs and
    AGPRs as [register, lane] arrays of uint32, SCC."""

    def __init__(self, lanes: int, vgprs: int):
        self.lanes = lanes
        self.s = np.zeros(128, np.uint32)
        self.v = np.zeros((max(vgprs, 256), lanes), np.uint32)  # (v255: a scratch register of the emulator's)
        self.a = np.zeros((256, lanes), np.uint32)
        self.scc = False
        self.pc = 0
        self.done = False
        self.at_barrier = False
        self.private = np.zeros((lanes, 0), np.uint8)  # each lane's scratch
        self.gpr_idx: tuple[int, set[str]] | None = None  # CDNA's VGPR index mode (s_set_gpr_idx_on)

    # -- masks -------------------------------------------------------------------------------------
    def mask(self, first: int) -> np.ndarray:
        """The lanes of the mask in SGPRs from `first` (EXEC, VCC or a pair), as booleans."""
        bits = int(self.s[first]) | (int(self.s[first + 1]) << 32 if self.lanes == 64 else 0)
        return ((bits >> np.arange(self.lanes, dtype=np.uint64)) & 1).astype(bool)

    def set_mask(self, first: int, lanes: np.ndarray) -> None:
        bits = int(np.sum(lanes.astype(np.uint64) << np.arange(self.lanes, dtype=np.uint64)))
        self.s[first] = bits & 0xFFFFFFFF
        if self.lanes == 64:
            self.s[first + 1] = bits >> 32

    @property
    def exec(self) -> np.ndarray:
        return self.mask(EXEC)

    # -- scalar operands -------------------------------------------------------------------------
    def sget(self, op: Operand, bits: int = 32) -> int:
        if op.kind == "imm":
            return op.index & ((1 << bits) - 1)
        if op.kind != "s":
            raise EmulatorError(f"scalar operand {op.text!r} is not an SGPR or constant")
        value = int(self.s[op.index])
        if bits == 64:
            value |= int(self.s[op.index + 1]) << 32
        return value

    def sset(self, op: Operand, value: int, bits: int = 32) -> None:
        value &= (1 << bits) - 1
        self.s[op.index] = value & 0xFFFFFFFF
        if bits == 64:
            self.s[op.index + 1] = value >> 32

    # -- vector operands -------------------------------------------------------------------------
    def vget(self, op: Operand, bits: int = 32) -> np.ndarray:
        """Every lane's value (uint32, or uint64 for 64-bit operands)."""
        if op.kind == "v" or op.kind == "a":
            regs = self.v if op.kind == "v" else self.a
            if bits == 64:
                return regs[op.index].astype(np.uint64) | (regs[op.index + 1].astype(np.uint64) << np.uint64(32))
            if op.half:
                return (regs[op.index] >> np.uint32(16 if op.half == "h" else 0)) & np.uint32(0xFFFF)
            return regs[op.index].copy()
        if op.kind == "imm" and bits == 64:
            return np.full(self.lanes, op.index & (2 ** 64 - 1), np.uint64)
        return np.full(self.lanes, self.sget(op, bits), np.uint64 if bits == 64 else np.uint32)

    def fget(self, op: Operand) -> np.ndarray:
        x = self.vget(op).view(np.float32)
        if op.abs:
            x = np.abs(x)
        return -x if op.neg else x

    def vset(self, op: Operand, values: np.ndarray, bits: int = 32, lanes: np.ndarray | None = None) -> None:
        lanes = self.exec if lanes is None else lanes
        regs = self.v if op.kind == "v" else self.a
        if op.kind not in ("v", "a"):
            raise EmulatorError(f"vector result {op.text!r} is not a VGPR")
        if values.dtype == np.float32:
            values = values.view(np.uint32)
        if bits == 64:
            values = values.astype(np.uint64)
            regs[op.index, lanes] = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)[lanes]
            regs[op.index + 1, lanes] = (values >> np.uint64(32)).astype(np.uint32)[lanes]
        elif bits > 64:
            raise EmulatorError("wide vector writes go through store_block")
        elif op.half:  # the other half kept
            shift, keep = (16, 0x0000FFFF) if op.half == "h" else (0, 0xFFFF0000)
            half = (values.astype(np.uint32) & np.uint32(0xFFFF)) << np.uint32(shift)
            regs[op.index, lanes] = ((regs[op.index] & np.uint32(keep)) | half)[lanes]
        else:
            regs[op.index, lanes] = values.astype(np.uint32)[lanes]


def _u32(x) -> np.ndarray:
    """Signed integers as their 32-bit two's complement patterns."""
    return (np.asarray(x).astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)


def _fma(a, b, c) -> np.ndarray:
    # f32 products are exact in f64; one rounding of the sum to f64, one to f32
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _signed(x: np.ndarray, bits: int) -> np.ndarray:
    x = x.astype(np.int64) & ((1 << bits) - 1)
    return np.where(x >= 1 << (bits - 1), x - (1 << bits), x)


def _select(x: np.ndarray, sel: str | None) -> np.ndarray:
    """An SDWA source select: a byte or word of the register, zero-extended."""
    if not sel or sel == "DWORD":
        return x
    kind, _, n = sel.partition("_")
    width = 8 if kind == "BYTE" else 16
    return (x >> np.uint32(width * int(n))) & np.uint32((1 << width) - 1)


# --- vector ALU ----------------------------------------------------------------------------------
def _float_binary(fn):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b = i.operands
        w.vset(d, fn(w.fget(a), w.fget(b)))
    return run


def _float_unary(fn):
    def run(w: Wave, i: Instruction) -> None:
        d, a = i.operands
        w.vset(d, np.asarray(fn(w.fget(a)), np.float32))
    return run


def _maxmin(pick):
    def fn(a, b):  # IEEE maxNum / minNum: a NaN operand gives the other one
        out = pick(a, b)
        return np.where(np.isnan(a), b, np.where(np.isnan(b), a, out)).astype(np.float32)
    return _float_binary(fn)


def _int_binary(fn, bits: int = 32, zero_high: bool = False):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b = i.operands[0], i.operands[-2], i.operands[-1]
        x = _select(w.vget(a), i.modifiers.get("src0_sel"))
        y = _select(w.vget(b), i.modifiers.get("src1_sel"))
        out = fn(x.astype(np.uint64), y.astype(np.uint64)) & ((1 << bits) - 1)
        if bits == 16 and not zero_high and not d.half and w.lanes == 32:  # RDNA: the high half is kept
            out = out | (w.v[d.index].astype(np.uint64) & 0xFFFF0000)
        sel = i.modifiers.get("dst_sel")
        if sel and sel != "DWORD":
            raise EmulatorError(f"SDWA dst_sel:{sel} is not modelled: {i.line}")
        w.vset(d, out.astype(np.uint32))
    return run


def _int_ternary(fn):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b, c = i.operands
        w.vset(d, (fn(w.vget(a).astype(np.uint64), w.vget(b).astype(np.uint64), w.vget(c).astype(np.uint64))
                   & 0xFFFFFFFF).astype(np.uint32))
    return run


def _carry(kind: str):
    """v_add_co / v_addc_co / v_sub_co / v_subb_co / v_subrev_co: (d, carry out, a, b[, carry in])."""
    def run(w: Wave, i: Instruction) -> None:
        d, co, a, b = i.operands[:4]
        x, y = w.vget(a).astype(np.int64), w.vget(b).astype(np.int64)
        cin = w.mask(i.operands[4].index).astype(np.int64) if len(i.operands) > 4 else 0
        if kind == "add":
            r = x + y + cin
            out = r > 0xFFFFFFFF
        elif kind == "sub":
            r = x - y - cin
            out = r < 0
        else:  # subrev
            r = y - x - cin
            out = r < 0
        ex = w.exec
        w.vset(d, (r & 0xFFFFFFFF).astype(np.uint32))
        w.set_mask(co.index, out & ex)
    return run


def _mad64(signed: bool):
    def run(w: Wave, i: Instruction) -> None:
        d, co, a, b, c = i.operands
        x, y = w.vget(a), w.vget(b)
        cc = w.vget(c, 64)
        if signed:
            prod = [int(p) for p in (_signed(x, 32) * _signed(y, 32))]
        else:
            prod = [int(p) for p in (x.astype(np.uint64) * y.astype(np.uint64))]
        out = np.array([(p + int(q)) & (2 ** 64 - 1) for p, q in zip(prod, cc)], np.uint64)
        w.vset(d, out, 64)
        if co.kind == "s":
            w.set_mask(co.index, np.zeros(w.lanes, bool))
    return run


def _lshl_add_u64(w: Wave, i: Instruction) -> None:
    d, a, sh, c = i.operands
    w.vset(d, (w.vget(a, 64) << w.vget(sh).astype(np.uint64)) + w.vget(c, 64), 64)


def _shift64(left: bool):
    def run(w: Wave, i: Instruction) -> None:
        d, sh, a = i.operands
        s = w.vget(sh).astype(np.uint64) & np.uint64(63)
        x = w.vget(a, 64)
        w.vset(d, (x << s) if left else (x >> s), 64)
    return run


def _mov(w: Wave, i: Instruction) -> None:
    d, a = i.operands
    bits = 64 if d.count == 2 and i.mnemonic.startswith("v_mov_b64") else 32
    w.vset(d, w.vget(a, bits), bits)


def _pk_mov(w: Wave, i: Instruction) -> None:
    d, a, b = i.operands
    sel = _flags(i, "op_sel", 2)
    lo = w.vget(Operand(a.kind, a.index + sel[0], 1, text=a.text) if a.kind in "sva" else a)
    hi = w.vget(Operand(b.kind, b.index + sel[1], 1, text=b.text) if b.kind in "sva" else b)
    if b.kind == "imm" and sel[1]:
        hi = w.vget(b)
    w.vset(Operand(d.kind, d.index), lo)
    w.vset(Operand(d.kind, d.index + 1), hi)


def _flags(i: Instruction, name: str, n: int) -> list[int]:
    """A VOP3P modifier such as op_sel:[0,1] (all 0 when not printed)."""
    text = i.modifiers.get(name)
    return [int(x) for x in text.strip("[]").split(",")] if text else [0] * n


def _fma_mix(w: Wave, i: Instruction) -> None:
    """v_fma_mix_f32 / v_fma_mixlo_f16 / v_fma_mixhi_f16: an f32 fma whose sources are f32, or f16
    (the half op_sel picks) where op_sel_hi says so; the mixlo / mixhi result an f16 half."""
    d, *srcs = i.operands
    sel, hi = _flags(i, "op_sel", 3), _flags(i, "op_sel_hi", 3)
    values = []
    for k, op in enumerate(srcs):
        if hi[k]:
            half = (w.vget(op) >> np.uint32(16 * sel[k])) & np.uint32(0xFFFF)
            x = half.astype(np.uint16).view(np.float16).astype(np.float32)
            x = np.abs(x) if op.abs else x
            values.append(-x if op.neg else x)
        else:
            values.append(w.fget(op))
    out = _fma(*values)
    if i.mnemonic == "v_fma_mix_f32":
        w.vset(d, out)
        return
    bits = _f16_bits(out)
    old = w.v[d.index]
    w.vset(d, (old & 0xFFFF0000) | bits if i.mnemonic == "v_fma_mixlo_f16" else (old & 0xFFFF) | (bits << np.uint32(16)))


def _pk_f32(fn):
    """v_pk_{add,mul,fma}_f32 (CDNA's packed f32): the low result from each source's word
    op_sel picks (default 0), the high one from the word op_sel_hi picks (default 1)."""
    def run(w: Wave, i: Instruction) -> None:
        d, *srcs = i.operands
        sel = _flags(i, "op_sel", len(srcs))
        hi = [int(x) for x in i.modifiers["op_sel_hi"].strip("[]").split(",")] if "op_sel_hi" in i.modifiers \
            else [1] * len(srcs)
        halves = []
        for word in (sel, hi):
            values = []
            for k, op in enumerate(srcs):
                one = Operand(op.kind, op.index + word[k], 1, op.neg, op.abs, op.text) if op.kind in "sva" else op
                values.append(w.fget(one))
            halves.append(fn(*values).astype(np.float32))
        w.vset(Operand(d.kind, d.index), halves[0])
        w.vset(Operand(d.kind, d.index + 1), halves[1])
    return run


def _perm(w: Wave, i: Instruction) -> None:
    """v_perm_b32: each result byte picked from the 8 bytes of {s0 (high), s1 (low)} by a
    selector byte of s2: 0-7 a byte, 8-11 the sign of byte 1 / 3 / 5 / 7, 12 zero, 13+ 0xFF."""
    d, a, b, c = i.operands
    both = (w.vget(a).astype(np.uint64) << np.uint64(32)) | w.vget(b).astype(np.uint64)
    sel = w.vget(c)
    out = np.zeros(w.lanes, np.uint64)
    for k in range(4):
        s = (sel >> np.uint32(8 * k)) & np.uint32(0xFF)
        byte = (both >> (8 * np.minimum(s, 7)).astype(np.uint64)) & np.uint64(0xFF)
        sign = ((both >> (16 * (s.astype(np.uint64) - 8) + 15).clip(0, 63).astype(np.uint64)) & np.uint64(1)) * 0xFF
        byte = np.where(s < 8, byte, np.where(s < 12, sign, np.where(s == 12, 0, 0xFF))).astype(np.uint64)
        out |= byte << np.uint64(8 * k)
    w.vset(d, out.astype(np.uint32))


def _cndmask(w: Wave, i: Instruction) -> None:
    d, a, b, m = i.operands
    w.vset(d, np.where(w.mask(m.index), w.vget(b), w.vget(a)).astype(np.uint32) if not (a.neg or a.abs or b.neg or b.abs)
           else np.where(w.mask(m.index), w.fget(b), w.fget(a)).astype(np.float32))


def _cmp(i: Instruction, w: Wave) -> np.ndarray:
    m = re.match(r"v_cmpx?_(\w+?)_([fiu])(16|32|64)", i.mnemonic)
    if not m:
        raise EmulatorError(f"compare {i.mnemonic} is not modelled")
    op, kind, bits = m.group(1), m.group(2), int(m.group(3))
    a, b = i.operands[-2], i.operands[-1]
    if kind == "f":
        if bits == 16:
            x = w.vget(a).astype(np.uint16).view(np.float16).astype(np.float32)
            y = w.vget(b).astype(np.uint16).view(np.float16).astype(np.float32)
            x, y = (np.abs(x) if a.abs else x), (np.abs(y) if b.abs else y)
            x, y = (-x if a.neg else x), (-y if b.neg else y)
        elif bits == 32:
            x, y = w.fget(a), w.fget(b)
        else:
            raise EmulatorError(f"{i.mnemonic} is not modelled")
        with np.errstate(invalid="ignore"):
            table = {"eq": x == y, "lg": (x < y) | (x > y), "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y,
                     "o": ~np.isnan(x) & ~np.isnan(y), "u": np.isnan(x) | np.isnan(y), "neq": ~(x == y),
                     "nlg": ~((x < y) | (x > y)), "nlt": ~(x < y), "nle": ~(x <= y), "ngt": ~(x > y),
                     "nge": ~(x >= y), "f": np.zeros(w.lanes, bool), "t": np.ones(w.lanes, bool),
                     "ne": x != y}
    else:
        x, y = w.vget(a, bits), w.vget(b, bits)
        if bits == 16:
            x, y = x & 0xFFFF, y & 0xFFFF
        if kind == "i":
            x, y = _signed(x.astype(np.uint64), bits), _signed(y.astype(np.uint64), bits)
        else:
            x, y = x.astype(np.uint64), y.astype(np.uint64)
        table = {"eq": x == y, "ne": x != y, "lg": x != y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y,
                 "f": np.zeros(w.lanes, bool), "t": np.ones(w.lanes, bool)}
    if op not in table:
        raise EmulatorError(f"compare {i.mnemonic} is not modelled")
    return table[op] & w.exec


def _v_cmp(w: Wave, i: Instruction) -> None:
    result = _cmp(i, w)
    if i.mnemonic.startswith("v_cmpx"):
        if len(i.operands) == 3 and i.operands[0].kind == "s":  # CDNA also writes the pair it names
            w.set_mask(i.operands[0].index, result)
        w.set_mask(EXEC, result)
    else:
        w.set_mask(i.operands[0].index, result)


def _f16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint16).astype(np.uint32)


def _cvt(w: Wave, i: Instruction) -> None:
    d, a = i.operands
    name = i.mnemonic.split("_e32")[0].split("_e64")[0]
    x = w.vget(a)
    with np.errstate(invalid="ignore", over="ignore"):
        if name == "v_cvt_f32_f16":
            out = (x & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
            out = np.abs(out) if a.abs else out
            out = -out if a.neg else out
        elif name == "v_cvt_f16_f32":
            out = _f16_bits(w.fget(a))
            if w.lanes == 32 and not d.half:  # RDNA keeps the high half
                out = out | (w.v[d.index] & 0xFFFF0000)
        elif name == "v_cvt_f32_i32":
            out = _signed(x, 32).astype(np.float32)
        elif name == "v_cvt_f32_u32":
            out = x.astype(np.float32)
        elif name in ("v_cvt_i32_f32", "v_cvt_u32_f32"):
            f = w.fget(a).astype(np.float64)
            lo, hi = (-2.0 ** 31, 2.0 ** 31 - 1) if name == "v_cvt_i32_f32" else (0.0, 2.0 ** 32 - 1)
            out = _u32(np.clip(np.nan_to_num(np.trunc(f), nan=0.0), lo, hi).astype(np.int64))
        else:
            raise EmulatorError(f"conversion {i.mnemonic} is not modelled")
    w.vset(d, np.asarray(out))


def _pack_f16(w: Wave, i: Instruction) -> None:
    d, a, b = i.operands
    if i.modifiers.get("op_sel"):
        raise EmulatorError(f"op_sel is not modelled: {i.line}")
    w.vset(d, (w.vget(a) & 0xFFFF) | ((w.vget(b) & 0xFFFF) << np.uint32(16)))


def _div_scale(w: Wave, i: Instruction) -> None:
    d, sd, num, den, x = i.operands  # the emulator divides exactly (v_div_fixup): no scaling needed
    w.vset(d, w.fget(x))
    w.set_mask(sd.index, np.zeros(w.lanes, bool))


def _div_fmas(w: Wave, i: Instruction) -> None:
    d, a, b, c = i.operands
    w.vset(d, _fma(w.fget(a), w.fget(b), w.fget(c)))


def _div_fixup(w: Wave, i: Instruction) -> None:
    d, _, den, num = i.operands
    with np.errstate(divide="ignore", invalid="ignore"):
        w.vset(d, (w.fget(num).astype(np.float64) / w.fget(den).astype(np.float64)).astype(np.float32))


def _fma_like(form: str):
    def run(w: Wave, i: Instruction) -> None:
        ops = i.operands
        if form == "fmac":
            d, a, b = ops
            c = d
        elif form == "fmaak":  # d = a * b + K
            d, a, b, c = ops
        elif form == "fmamk":  # d = a * K + b
            d, a, c_, b_ = ops
            a, b, c = a, c_, b_
        else:  # fma, mad: d = a * b + c
            d, a, b, c = ops
        w.vset(d, _fma(w.fget(a), w.fget(b), w.fget(c)))
    return run


def _bfe(signed: bool):
    def run(w: Wave, i: Instruction) -> None:
        d, a, off, width = i.operands
        o, n = w.vget(off) & 31, w.vget(width) & 31
        x = (w.vget(a).astype(np.uint64) >> o.astype(np.uint64)) & ((np.uint64(1) << n.astype(np.uint64)) - np.uint64(1))
        if signed:
            x = np.where((n > 0) & ((x >> (n.astype(np.uint64) - np.uint64(1)).clip(0)) & np.uint64(1)).astype(bool),
                         x | ~((np.uint64(1) << n.astype(np.uint64)) - np.uint64(1)), x)
        w.vset(d, (x & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    return run


def _mul_hi(signed: bool, bits: int):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b = i.operands
        x, y = w.vget(a), w.vget(b)
        if bits == 24:
            x, y = x & 0xFFFFFF, y & 0xFFFFFF
            if signed:
                x, y = _signed(x, 24), _signed(y, 24)
        elif signed:
            x, y = _signed(x, 32), _signed(y, 32)
        prod = np.array([int(p) * int(q) for p, q in zip(x, y)], object)
        w.vset(d, np.array([(p >> 32) & 0xFFFFFFFF for p in prod], np.uint32))
    return run


def _mul24(signed: bool, add: bool):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b = i.operands[:3]
        x, y = w.vget(a) & 0xFFFFFF, w.vget(b) & 0xFFFFFF
        if signed:
            x, y = _signed(x, 24), _signed(y, 24)
        r = x.astype(np.int64) * y.astype(np.int64)
        if add:
            r = r + w.vget(i.operands[3]).astype(np.int64)
        w.vset(d, (r & 0xFFFFFFFF).astype(np.uint32))
    return run


# --- matrix cores --------------------------------------------------------------------------------
def _halves(w: Wave, op: Operand, dtype: str) -> np.ndarray:
    """[lane, element] of the 16-bit values packed in the operand's registers (low half first)."""
    regs = w.v if op.kind == "v" else w.a
    words = np.stack([regs[op.index + r] for r in range(op.count)], axis=1)  # [lane, register]
    bits = np.stack([words & 0xFFFF, words >> 16], axis=2).reshape(w.lanes, -1).astype(np.uint32)
    if dtype == "bf16":
        return (bits << np.uint32(16)).view(np.float32).astype(np.float64)
    return bits.astype(np.uint16).view(np.float16).astype(np.float64)


def _matrix(w: Wave, i: Instruction) -> None:
    """v_mfma_f32_MxNxK_{f16,bf16} (one block) and v_wmma_f32_16x16x16_{f16,bf16}, in the layouts
    of AMD's matrix instruction tables: MFMA lane l holds A[l % M][E (l / M) + e], B[E (l / N) +
    e][l % N] (E elements each) and D[row][l % N] for its items, rows 8 (r / 4) + 4 (l / 32) + r % 4
    (32x32) or 4 (l / 16) + r (16x16); WMMA lane l holds row / column l % 16 of A / B whole (both
    half-waves the same) and D[2 r + l / 16][l % 16] (IREE's nested layouts for these instructions
    agree). The products are exact, the sum is rounded once."""
    m = re.match(r"v_(mfma|wmma)_f32_(\d+)x(\d+)x(\d+)_?(f16|bf16)(_1k)?$", i.mnemonic)
    if not m:
        raise EmulatorError(f"matrix instruction {i.mnemonic} is not modelled")
    units, M, N, K, dtype = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5)
    d, a, b, c = i.operands
    xa, xb = _halves(w, a, dtype), _halves(w, b, dtype)
    lanes = np.arange(w.lanes)
    A, B = np.zeros((M, K)), np.zeros((K, N))
    if units == "mfma":
        if M * K != w.lanes * xa.shape[1] or M not in (16, 32):
            raise EmulatorError(f"{i.mnemonic} with several blocks is not modelled")
        e = xa.shape[1]
        for j in range(e):
            A[lanes % M, e * (lanes // M) + j] = xa[:, j]
            B[e * (lanes // N) + j, lanes % N] = xb[:, j]
    else:
        A[lanes[:16] % M, :] = xa[:16, :K]
        B[:, lanes[:16] % N] = xb[:16, :K].T
    acc = np.zeros((w.lanes, d.count)) if c.kind == "imm" and c.index == 0 else \
        np.stack([(w.v if c.kind == "v" else w.a)[c.index + r].view(np.float32) for r in range(d.count)], axis=1)
    items = np.arange(d.count)
    if units == "mfma" and M == 32:
        rows = 8 * (items[None, :] // 4) + 4 * (lanes[:, None] // 32) + items[None, :] % 4
    elif units == "mfma":
        rows = 4 * (lanes[:, None] // 16) + items[None, :]
    else:
        rows = 2 * items[None, :] + lanes[:, None] // 16
    D = (A @ B)[rows, (lanes % N)[:, None]] + acc
    out = D.astype(np.float32).view(np.uint32)
    regs = w.v if d.kind == "v" else w.a
    for r in range(d.count):
        regs[d.index + r] = out[:, r]  # every lane: matrix instructions ignore EXEC


def _accvgpr(w: Wave, i: Instruction) -> None:
    d, src = i.operands
    w.vset(d, w.vget(src), lanes=np.ones(w.lanes, bool))


# --- scalar ALU ----------------------------------------------------------------------------------
def _s_binary(fn, bits: int = 32, scc: str = "nonzero"):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b = i.operands
        x, y = w.sget(a, bits), w.sget(b, bits)
        r = fn(x, y, w)
        w.sset(d, r, bits)
        if scc == "nonzero":
            w.scc = (r & ((1 << bits) - 1)) != 0
    return run


def _s_add(carry_in: bool, sub: bool = False):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b = i.operands
        x, y = w.sget(a), w.sget(b)
        c = int(w.scc) if carry_in else 0
        r = x - y - c if sub else x + y + c
        w.scc = r < 0 if sub else r > 0xFFFFFFFF
        w.sset(d, r)
    return run


def _s_arith32(fn):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b = i.operands
        x, y = int(_signed(np.array([w.sget(a)]), 32)[0]), int(_signed(np.array([w.sget(b)]), 32)[0])
        w.sset(d, fn(x, y))
    return run


def _s_cmp(w: Wave, i: Instruction) -> None:
    m = re.match(r"s_cmp_(\w+)_([iu])(32|64)", i.mnemonic)
    op, kind, bits = m.group(1), m.group(2), int(m.group(3))
    a, b = i.operands
    x, y = w.sget(a, bits), w.sget(b, bits)
    if kind == "i":
        x, y = [int(_signed(np.array([v], np.uint64), bits)[0]) for v in (x, y)]
    w.scc = {"eq": x == y, "lg": x != y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y}[op]


def _saveexec(fn):
    def run(w: Wave, i: Instruction) -> None:
        d, a = i.operands
        bits = 64 if w.lanes == 64 else 32
        old = w.sget(Operand("s", EXEC, 2), bits)
        new = fn(w.sget(a, bits), old) & ((1 << bits) - 1)
        w.sset(d, old, bits)
        w.sset(Operand("s", EXEC, 2), new, bits)
        w.scc = new != 0
    return run


def _s_mov(bits: int):
    def run(w: Wave, i: Instruction) -> None:
        d, a = i.operands
        w.sset(d, w.sget(a, bits), bits)
    return run


def _s_movk(w: Wave, i: Instruction) -> None:
    d, a = i.operands
    w.sset(d, int(_signed(np.array([a.index & 0xFFFF]), 16)[0]))


def _s_k(fn):
    """s_addk_i32 / s_mulk_i32: d = d op (a sign-extended 16-bit constant)."""
    def run(w: Wave, i: Instruction) -> None:
        d, a = i.operands
        w.sset(d, fn(int(_signed(np.array([w.sget(d)]), 32)[0]), int(_signed(np.array([a.index & 0xFFFF]), 16)[0])))
    return run


def _s_cselect(bits: int):
    def run(w: Wave, i: Instruction) -> None:
        d, a, b = i.operands
        w.sset(d, w.sget(a, bits) if w.scc else w.sget(b, bits), bits)
    return run


def _s_brev(w: Wave, i: Instruction) -> None:
    d, a = i.operands
    w.sset(d, int(f"{w.sget(a):032b}"[::-1], 2))


def _s_not(bits: int):
    def run(w: Wave, i: Instruction) -> None:
        d, a = i.operands
        r = ~w.sget(a, bits) & ((1 << bits) - 1)
        w.sset(d, r, bits)
        w.scc = r != 0
    return run


def _s_load(w: Wave, i: Instruction, memory: "Memory") -> None:
    d, base, off = i.operands
    address = w.sget(base, 64) + (off.index if off.kind == "imm" else w.sget(off))
    words = memory.read(np.array([address], np.uint64), 4 * d.count, i).view(np.uint32)
    w.s[d.index:d.index + d.count] = words


# --- memory --------------------------------------------------------------------------------------
class Memory:
    """Global memory: the kernel's buffers (and its kernarg segment) at addresses above 4 GiB,
    each access checked to lie inside one of them."""

    def __init__(self):
        self.buffers: list[tuple[int, np.ndarray]] = []
        self.next = GLOBAL_BASE

    def place(self, data: bytes | np.ndarray) -> int:
        raw = np.frombuffer(bytes(data), np.uint8).copy() if not isinstance(data, np.ndarray) else \
            np.ascontiguousarray(data).view(np.uint8).reshape(-1).copy()
        address = self.next
        self.buffers.append((address, raw))
        self.next += (len(raw) + 4096 + 255) // 256 * 256
        return address

    def _buffer(self, addresses: np.ndarray, size: int, i: Instruction) -> tuple[np.ndarray, np.ndarray]:
        if len(addresses) == 0:
            return np.zeros(0, np.uint8), np.zeros(0, np.int64)
        lo, hi = int(addresses.min()), int(addresses.max()) + size
        for start, raw in self.buffers:
            if start <= lo and hi <= start + len(raw):
                return raw, addresses.astype(np.int64) - start
        bad = next(int(a) for a in addresses if not any(s <= int(a) and int(a) + size <= s + len(r)
                                                         for s, r in self.buffers))
        raise EmulatorError(f"`{i.line}` reads or writes {size} bytes at {bad:#x}, outside every buffer the kernel "
                            f"was given")

    def read(self, addresses: np.ndarray, size: int, i: Instruction) -> np.ndarray:
        raw, offsets = self._buffer(addresses, size, i)
        return raw[offsets[:, None] + np.arange(size)].reshape(len(offsets), size)

    def write(self, addresses: np.ndarray, values: np.ndarray, i: Instruction) -> None:
        raw, offsets = self._buffer(addresses, values.shape[1], i)
        raw[offsets[:, None] + np.arange(values.shape[1])] = values


LOAD_SIZES = {"dword": 4, "dwordx2": 8, "dwordx3": 12, "dwordx4": 16, "b32": 4, "b64": 8, "b96": 12, "b128": 16,
              "ushort": 2, "u16": 2, "sshort": 2, "i16": 2, "ubyte": 1, "u8": 1, "sbyte": 1, "i8": 1,
              "short": 2, "b16": 2, "byte": 1, "b8": 1, "d16_b16": 2, "short_d16": 2}


def _lanes_bytes(w: Wave, data: Operand, size: int, lanes: np.ndarray) -> np.ndarray:
    """The bytes each active lane stores: `size` from its registers at `data`."""
    words = max(1, size // 4)
    regs = np.stack([w.v[data.index + k] for k in range(words)], axis=1)[lanes]
    return regs.view(np.uint8).reshape(len(regs), -1)[:, :size]


def _load_into(w: Wave, d: Operand, raw: np.ndarray, lanes: np.ndarray, kind: str) -> None:
    size = raw.shape[1]
    if size >= 4:
        words = raw.reshape(len(raw), -1).copy().view(np.uint32)
        for k in range(size // 4):
            w.v[d.index + k, lanes] = words[:, k]
        return
    value = raw.copy()
    value = np.concatenate([value, np.zeros((len(value), 4 - size), np.uint8)], axis=1).view(np.uint32)[:, 0]
    if kind in ("sshort", "i16"):
        value = _u32(_signed(value, 16))
    elif kind in ("sbyte", "i8"):
        value = _u32(_signed(value, 8))
    elif kind in ("d16_b16", "short_d16"):  # the low half; the high half kept
        value = (w.v[d.index, lanes] & 0xFFFF0000) | value
    w.v[d.index, lanes] = value


def _scratch(w: Wave, i: Instruction) -> None:
    """scratch_load / scratch_store (flat scratch, gfx942 and RDNA3): each lane's private
    memory at vaddr + saddr + offset (either address register may be `off`)."""
    m = re.match(r"scratch_(load|store)_(\w+)", i.mnemonic)
    verb, kind = m.group(1), m.group(2)
    if kind not in LOAD_SIZES:
        raise EmulatorError(f"{i.mnemonic} is not modelled")
    size = LOAD_SIZES[kind]
    if verb == "load":
        d, vaddr, saddr = i.operands
    else:
        vaddr, d, saddr = i.operands
    offset = np.full(w.lanes, int(i.modifiers.get("offset", "0"), 0), np.int64)
    if vaddr.kind != "off":
        offset += w.vget(vaddr).astype(np.int64)
    if saddr.kind != "off":
        offset += w.sget(saddr)
    lanes = w.exec
    where = offset[lanes]
    if len(where) and (where.min() < 0 or where.max() + size > w.private.shape[1]):
        raise EmulatorError(f"`{i.line}` reaches private byte {int(where.max())}; the kernel asked for "
                            f"{w.private.shape[1]}")
    rows = np.flatnonzero(lanes)[:, None]
    columns = where[:, None] + np.arange(size)
    if verb == "load":
        _load_into(w, d, w.private[rows, columns], lanes, kind)
    else:
        w.private[rows, columns] = _lanes_bytes(w, d, size, lanes)


def _global(w: Wave, i: Instruction, memory: Memory) -> None:
    if "store" in i.mnemonic and "d16_hi" in i.mnemonic:  # the register's high half, stored
        d = i.operands[1]  # (CDNA global_store_short_d16_hi, RDNA3 global_store_d16_hi_b16)
        shifted = Instruction(i.mnemonic.replace("_d16_hi", ""), [i.operands[0], Operand("v", 255), i.operands[2]],
                              i.modifiers, i.line)
        w.v[255] = w.v[d.index] >> np.uint32(16)
        _global(w, shifted, memory)
        return
    m = re.match(r"global_(load|store)_(\w+)", i.mnemonic)
    verb, kind = m.group(1), m.group(2)
    high_load = verb == "load" and "d16_hi" in kind  # 16 bits into the register's high half
    if high_load:
        kind = "ushort"
    if kind not in LOAD_SIZES:
        raise EmulatorError(f"{i.mnemonic} is not modelled")
    size = LOAD_SIZES[kind]
    offset = int(i.modifiers.get("offset", "0"), 0)
    if verb == "load":
        d, addr, base = i.operands
    else:
        addr, d, base = i.operands
    if base.kind == "off":
        addresses = w.vget(addr, 64)
    else:
        addresses = w.sget(base, 64) + w.vget(addr).astype(np.uint64)
    lanes = w.exec
    addresses = (addresses.astype(np.int64) + offset).astype(np.uint64)[lanes]
    if high_load:
        value = np.concatenate([memory.read(addresses, 2, i), np.zeros((len(addresses), 2), np.uint8)],
                               axis=1).view(np.uint32)[:, 0]
        w.v[d.index, lanes] = (w.v[d.index, lanes] & 0xFFFF) | (value << np.uint32(16))
    elif verb == "load":
        _load_into(w, d, memory.read(addresses, size, i), lanes, kind)
    else:
        memory.write(addresses, _lanes_bytes(w, d, size, lanes), i)


def _cross_lane(w: Wave, i: Instruction) -> None:
    """ds_swizzle_b32 (its bit-mask mode within groups of 32 lanes: SWAP n is lane ^ n) and
    ds_bpermute_b32 (lane l reads the lane its address / 4 names): lanes trade values through the
    LDS crossbar, no LDS memory touched."""
    lanes = np.arange(w.lanes)
    if i.mnemonic == "ds_bpermute_b32":
        d, addr, src = i.operands
        source = ((w.vget(addr).astype(np.int64) + int(i.modifiers.get("offset", "0"), 0)) // 4) % w.lanes
    else:
        d, src = i.operands
        pattern = i.modifiers.get("offset", "0")
        m = re.match(r"swizzle\((SWAP|REVERSE),(\d+)\)$", pattern)
        if m:
            n = int(m.group(2))
            and_mask, or_mask, xor_mask = 0x1F, 0, n if m.group(1) == "SWAP" else n - 1
        elif re.match(r"^(0x)?[0-9a-fA-F]+$", pattern) and int(pattern, 0) < 0x8000:
            raw = int(pattern, 0)
            and_mask, or_mask, xor_mask = raw & 0x1F, (raw >> 5) & 0x1F, (raw >> 10) & 0x1F
        else:
            raise EmulatorError(f"ds_swizzle pattern {pattern} is not modelled")
        source = (lanes & ~0x1F) | (((lanes & and_mask) | or_mask) ^ xor_mask)
    w.vset(d, w.vget(src)[source])


def _ds(w: Wave, i: Instruction, lds: np.ndarray, log: list | None = None) -> None:
    if i.mnemonic in ("ds_swizzle_b32", "ds_bpermute_b32"):
        _cross_lane(w, i)
        return
    high = i.mnemonic.endswith("_d16_hi")  # the high half of the register: stored, or loaded into
    m = re.match(r"ds_(read|write|load|store)(2st64|2|_2addr_stride64|_2addr)?_(\w+?)(_d16_hi)?$", i.mnemonic)
    if not m or m.group(3) not in LOAD_SIZES:
        raise EmulatorError(f"{i.mnemonic} is not modelled")
    load = m.group(1) in ("read", "load")
    pair, size = m.group(2), LOAD_SIZES[m.group(3)]
    lanes = w.exec
    if load:
        d, addr = i.operands
    else:
        addr, d = i.operands[0], i.operands[1]
    base = w.vget(addr).astype(np.int64)[lanes]
    if pair:
        unit = size * (64 if "64" in pair else 1)
        offsets = [int(i.modifiers.get("offset0", "0"), 0) * unit, int(i.modifiers.get("offset1", "0"), 0) * unit]
        datas = [d, i.operands[2]] if not load else [Operand("v", d.index), Operand("v", d.index + size // 4)]
    else:
        offsets, datas = [int(i.modifiers.get("offset", "0"), 0)], [d]
    for off, data in zip(offsets, datas):
        where = base + off
        if log is not None:
            log.append(LdsAccess(i.line, size, np.flatnonzero(lanes), where.copy()))
        if len(where) and (where.min() < 0 or where.max() + size > len(lds)):
            raise EmulatorError(f"`{i.line}` reaches LDS byte {int(where.max())}; the workgroup has {len(lds)}")
        index = where[:, None] + np.arange(size)
        if load and high:
            value = np.concatenate([lds[index], np.zeros((len(index), 2), np.uint8)], axis=1).view(np.uint32)[:, 0]
            w.v[data.index, lanes] = (w.v[data.index, lanes] & 0xFFFF) | (value << np.uint32(16))
        elif load:
            _load_into(w, data, lds[index], lanes, m.group(3))
        elif high:
            lds[index] = (w.v[data.index][lanes] >> np.uint32(16)).astype(np.uint16).view(np.uint8).reshape(-1, 2)
        else:
            lds[index] = _lanes_bytes(w, data, size, lanes)


# --- the instruction table -----------------------------------------------------------------------
def _strip(mnemonic: str) -> str:
    return re.sub(r"_(e32|e64|sdwa|dpp)$", "", mnemonic)


def _table() -> dict[str, object]:
    M32 = 0xFFFFFFFF
    t: dict[str, object] = {
        "v_add_f32": _float_binary(lambda a, b: a + b), "v_sub_f32": _float_binary(lambda a, b: a - b),
        "v_subrev_f32": _float_binary(lambda a, b: b - a), "v_mul_f32": _float_binary(lambda a, b: a * b),
        "v_max_f32": _maxmin(np.maximum), "v_min_f32": _maxmin(np.minimum),
        "v_max_num_f32": _maxmin(np.maximum), "v_min_num_f32": _maxmin(np.minimum),
        "v_rcp_f32": _float_unary(lambda a: np.float32(1.0) / a), "v_trunc_f32": _float_unary(np.trunc),
        "v_floor_f32": _float_unary(np.floor), "v_sqrt_f32": _float_unary(np.sqrt),
        "v_fma_f32": _fma_like("fma"), "v_mad_f32": _fma_like("fma"), "v_fmac_f32": _fma_like("fmac"),
        "v_fmaak_f32": _fma_like("fmaak"), "v_fmamk_f32": _fma_like("fmamk"),
        "v_div_scale_f32": _div_scale, "v_div_fmas_f32": _div_fmas, "v_div_fixup_f32": _div_fixup,
        "v_mov_b32": _mov, "v_mov_b64": _mov, "v_mov_b16": _mov, "v_pk_mov_b32": _pk_mov, "v_cndmask_b32": _cndmask,
        "v_add_u32": _int_binary(lambda a, b: a + b), "v_add_nc_u32": _int_binary(lambda a, b: a + b),
        "v_sub_u32": _int_binary(lambda a, b: a - b), "v_sub_nc_u32": _int_binary(lambda a, b: a - b),
        "v_subrev_u32": _int_binary(lambda a, b: b - a), "v_subrev_nc_u32": _int_binary(lambda a, b: b - a),
        "v_mul_lo_u32": _int_binary(lambda a, b: a * b),
        "v_and_b32": _int_binary(lambda a, b: a & b), "v_or_b32": _int_binary(lambda a, b: a | b),
        "v_xor_b32": _int_binary(lambda a, b: a ^ b),
        "v_lshlrev_b32": _int_binary(lambda a, b: b << (a & 31)), "v_lshrrev_b32": _int_binary(lambda a, b: b >> (a & 31)),
        "v_ashrrev_i32": _int_binary(lambda a, b: _u32(_signed(b, 32) >> (a & 31).astype(np.int64)).astype(np.uint64)),
        "v_add_u16": _int_binary(lambda a, b: a + b, 16, True), "v_add_nc_u16": _int_binary(lambda a, b: a + b, 16),
        "v_sub_u16": _int_binary(lambda a, b: a - b, 16, True), "v_sub_nc_u16": _int_binary(lambda a, b: a - b, 16),
        "v_mul_lo_u16": _int_binary(lambda a, b: (a & 0xFFFF) * (b & 0xFFFF), 16, True),
        "v_lshlrev_b16": _int_binary(lambda a, b: (b & 0xFFFF) << (a & 15), 16, True),
        "v_lshrrev_b16": _int_binary(lambda a, b: (b & 0xFFFF) >> (a & 15), 16, True),
        "v_and_b16": _int_binary(lambda a, b: a & b, 16), "v_or_b16": _int_binary(lambda a, b: a | b, 16),
        "v_mul_u32_u24": _mul24(False, False), "v_mul_i32_i24": _mul24(True, False),
        "v_mad_u32_u24": _mul24(False, True), "v_mad_i32_i24": _mul24(True, True),
        "v_mul_hi_u32": _mul_hi(False, 32), "v_mul_hi_i32": _mul_hi(True, 32),
        "v_mul_hi_u32_u24": _mul_hi(False, 24), "v_mul_hi_i32_i24": _mul_hi(True, 24),
        "v_lshl_add_u32": _int_ternary(lambda a, b, c: (a << (b & 31)) + c),
        "v_add_lshl_u32": _int_ternary(lambda a, b, c: (a + b) << (c & 31)),
        "v_lshl_or_b32": _int_ternary(lambda a, b, c: ((a << (b & 31)) & M32) | c),
        "v_or3_b32": _int_ternary(lambda a, b, c: a | b | c), "v_and_or_b32": _int_ternary(lambda a, b, c: (a & b) | c),
        "v_bfi_b32": _int_ternary(lambda a, b, c: (a & b) | (~a & M32 & c)),
        "v_add3_u32": _int_ternary(lambda a, b, c: a + b + c),
        "v_alignbit_b32": _int_ternary(lambda a, b, c: ((a << 32) | b) >> (c & 31)),
        "v_alignbyte_b32": _int_ternary(lambda a, b, c: ((a << 32) | b) >> (8 * (c & 3))),
        "v_bfe_u32": _bfe(False), "v_bfe_i32": _bfe(True),
        "v_add_co_u32": _carry("add"), "v_addc_co_u32": _carry("add"), "v_add_co_ci_u32": _carry("add"),
        "v_sub_co_u32": _carry("sub"), "v_subb_co_u32": _carry("sub"), "v_sub_co_ci_u32": _carry("sub"),
        "v_subrev_co_u32": _carry("subrev"), "v_subbrev_co_u32": _carry("subrev"),
        "v_mad_u64_u32": _mad64(False), "v_mad_i64_i32": _mad64(True), "v_lshl_add_u64": _lshl_add_u64,
        "v_lshlrev_b64": _shift64(True), "v_lshrrev_b64": _shift64(False),
        "v_pk_add_f32": _pk_f32(lambda a, b: a + b), "v_pk_mul_f32": _pk_f32(lambda a, b: a * b),
        "v_pk_fma_f32": _pk_f32(_fma),
        "v_pack_b32_f16": _pack_f16, "v_perm_b32": _perm, "v_fma_mix_f32": _fma_mix, "v_fma_mixlo_f16": _fma_mix, "v_fma_mixhi_f16": _fma_mix,
        "s_mov_b32": _s_mov(32), "s_mov_b64": _s_mov(64), "s_movk_i32": _s_movk, "s_addk_i32": _s_k(lambda x, y: x + y),
        "s_mulk_i32": _s_k(lambda x, y: x * y),
        "s_cselect_b32": _s_cselect(32), "s_cselect_b64": _s_cselect(64), "s_brev_b32": _s_brev,
        "s_not_b32": _s_not(32), "s_not_b64": _s_not(64),
        "s_add_u32": _s_add(False), "s_addc_u32": _s_add(True), "s_sub_u32": _s_add(False, True),
        "s_subb_u32": _s_add(True, True),
        "s_add_i32": _s_arith32(lambda x, y: x + y), "s_sub_i32": _s_arith32(lambda x, y: x - y),
        "s_mul_i32": _s_arith32(lambda x, y: x * y), "s_mul_hi_i32": _s_arith32(lambda x, y: (x * y) >> 32),
        "s_mul_hi_u32": _s_binary(lambda x, y, w: (x * y) >> 32, scc="keep"),
        "s_lshl_b32": _s_binary(lambda x, y, w: x << (y & 31)), "s_lshl_b64": _s_binary(lambda x, y, w: x << (y & 63), 64),
        "s_lshr_b32": _s_binary(lambda x, y, w: x >> (y & 31)), "s_lshr_b64": _s_binary(lambda x, y, w: x >> (y & 63), 64),
        "s_ashr_i32": _s_binary(lambda x, y, w: int(_signed(np.array([x]), 32)[0]) >> (y & 31)),
    }
    for bits in (32, 64):
        logic = {"and": lambda x, y, w: x & y, "or": lambda x, y, w: x | y, "xor": lambda x, y, w: x ^ y,
                 "andn2": lambda x, y, w: x & ~y, "orn2": lambda x, y, w: x | ~y, "and_not1": lambda x, y, w: x & ~y,
                 "or_not1": lambda x, y, w: x | ~y, "nand": lambda x, y, w: ~(x & y), "nor": lambda x, y, w: ~(x | y),
                 "xnor": lambda x, y, w: ~(x ^ y)}
        for name, fn in logic.items():
            t[f"s_{name}_b{bits}"] = _s_binary(fn, bits)
        exec_logic = {"and": lambda s, e: s & e, "or": lambda s, e: s | e, "xor": lambda s, e: s ^ e,
                      "andn2": lambda s, e: s & ~e, "and_not1": lambda s, e: s & ~e, "orn2": lambda s, e: s | ~e}
        for name, fn in exec_logic.items():
            t[f"s_{name}_saveexec_b{bits}"] = _saveexec(fn)
    return t


TABLE = _table()


def _handler(i: Instruction):
    name = _strip(i.mnemonic)
    if name in TABLE:
        return TABLE[name]
    if name.startswith("v_cmp"):
        return _v_cmp
    if name.startswith("s_cmp_"):
        return _s_cmp
    if name.startswith("v_cvt_"):
        return _cvt
    if name.startswith(("v_mfma_", "v_wmma_")):
        return _matrix
    if name.startswith("v_accvgpr_"):
        return _accvgpr
    return None


def run_kernel(program: Program, lanes_per_wave: int, grid: tuple[int, int, int], block: tuple[int, int, int],
               kernarg: bytes, memory: Memory, vgprs: int, lds_log: list | None = None) -> None:
    """Run every workgroup of the launch, its waves in turn between barriers."""
    d = program.directives
    kernarg_address = memory.place(kernarg + bytes(256))  # (hidden arguments read as zeros)
    for ins in program.instructions:
        if ins.mnemonic == "v_dual":
            ins.handler = [(h, _handler(h)) for h in ins.handler] if isinstance(ins.handler[0], Instruction) \
                else ins.handler
        elif ins.handler is None:
            ins.handler = _handler(ins)
    lds_size = d.get("amdhsa_group_segment_fixed_size", 0)
    threads = block[0] * block[1] * block[2]
    n_waves = -(-threads // lanes_per_wave)
    tid = np.arange(n_waves * lanes_per_wave)
    tx, ty, tz = tid % block[0], (tid // block[0]) % block[1], tid // (block[0] * block[1])
    packed = (tx | (ty << 10) | (tz << 20)).astype(np.uint32)
    for gz in range(grid[2]):
        for gy in range(grid[1]):
            for gx in range(grid[0]):
                lds = np.zeros(max(lds_size, 4), np.uint8)
                waves = []
                for k in range(n_waves):
                    w = Wave(lanes_per_wave, vgprs)
                    user = 0
                    if d.get("amdhsa_user_sgpr_private_segment_buffer"):
                        user += 4
                    for key in ("dispatch_ptr", "queue_ptr"):
                        if d.get(f"amdhsa_user_sgpr_{key}"):
                            user += 2
                    if d.get("amdhsa_user_sgpr_kernarg_segment_ptr"):
                        w.s[user], w.s[user + 1] = kernarg_address & 0xFFFFFFFF, kernarg_address >> 32
                    s = d.get("amdhsa_user_sgpr_count", user + 2)
                    for axis, gid in zip("xyz", (gx, gy, gz)):
                        if d.get(f"amdhsa_system_sgpr_workgroup_id_{axis}", 1 if axis == "x" else 0):
                            w.s[s] = gid
                            s += 1
                    live = (k * lanes_per_wave + np.arange(lanes_per_wave)) < threads
                    w.v[0] = packed[k * lanes_per_wave:(k + 1) * lanes_per_wave]
                    w.set_mask(EXEC, live)
                    w.private = np.zeros((lanes_per_wave, d.get("amdhsa_private_segment_fixed_size", 0)), np.uint8)
                    waves.append(w)
                _run_workgroup(program, waves, lds, memory, lds_log)


def _run_workgroup(program: Program, waves: list[Wave], lds: np.ndarray, memory: Memory, log: list | None) -> None:
    instructions, labels = program.instructions, program.labels
    budget = 50_000_000
    with np.errstate(all="ignore"):  # a GPU computes inf and NaN without a word
        while not all(w.done for w in waves):
            for w in waves:
                w.at_barrier = False
                while not w.done and not w.at_barrier:
                    budget -= 1
                    if budget < 0:
                        raise EmulatorError(f"{program.name} ran 50 million instructions in one workgroup: a loop "
                                            "that does not end?")
                    if w.pc >= len(instructions):
                        raise EmulatorError(f"{program.name} ran past its last instruction without s_endpgm")
                    i = instructions[w.pc]
                    w.pc += 1
                    _step(w, i, labels, lds, memory, log)


_INDEXED = {"DST": 0, "SRC0": 1, "SRC1": 2, "SRC2": 3}  # operand positions the index mode moves


def _relative(w: Wave, i: Instruction) -> bool:
    """VGPR-relative addressing: CDNA's s_set_gpr_idx_on / _off (then a VALU instruction's chosen
    VGPR operands are moved by the index) and v_movrels / v_movreld (moved by M0). True if `i`
    was one of these and has run."""
    m = i.mnemonic
    if m == "s_set_gpr_idx_on":
        w.gpr_idx = (w.sget(i.operands[0]), set(i.operands[1].text.split(",")))
        return True
    if m == "s_set_gpr_idx_off":
        w.gpr_idx = None
        return True
    if w.gpr_idx and m.startswith("v_"):
        shift, modes = w.gpr_idx
        ops = list(i.operands)
        for mode in modes:
            k = _INDEXED[mode]
            if k < len(ops) and ops[k].kind == "v":
                ops[k] = Operand("v", ops[k].index + shift, ops[k].count, ops[k].neg, ops[k].abs, ops[k].text)
        moved = Instruction(m, ops, i.modifiers, i.line, i.handler)
        w.gpr_idx, saved = None, w.gpr_idx
        try:
            _step(w, moved, {}, np.zeros(4, np.uint8), None)
        finally:
            w.gpr_idx = saved
        return True
    rel = re.match(r"v_movrel(s|d|sd)_b32", m)
    if rel:
        d, src = i.operands
        shift = int(w.s[M0])
        if "s" in rel.group(1):
            src = Operand("v", src.index + shift)
        if rel.group(1) in ("d", "sd"):
            d = Operand("v", d.index + shift)
        w.vset(d, w.vget(src))
        return True
    return False


def _step(w: Wave, i: Instruction, labels: dict[str, int], lds: np.ndarray, memory: Memory,
          log: list | None = None) -> None:
    m = i.mnemonic
    if (w.gpr_idx or m.startswith(("s_set_gpr_idx", "v_movrel"))) and _relative(w, i):
        return
    if i.handler is not None and m != "v_dual":
        i.handler(w, i)
        return
    if m == "v_dual":  # read every source first: run the second half on a copy, then merge
        (first, h1), (second, h2) = i.handler
        for half, h in ((first, h1), (second, h2)):
            if h is None:
                raise EmulatorError(f"instruction `{half.line}` is not modelled")
        before = w.v.copy()
        h1(w, first)
        after_first = w.v
        w.v = before.copy()
        h2(w, second)
        d = second.operands[0].index
        after_first[d] = w.v[d]
        w.v = after_first
        return
    if m in IGNORED:
        return
    if m == "s_endpgm":
        w.done = True
        return
    if m == "s_barrier":
        w.at_barrier = True
        return
    if m.startswith("s_branch") or m.startswith("s_cbranch"):
        cond = {"s_branch": True, "s_cbranch_scc0": not w.scc, "s_cbranch_scc1": w.scc,
                "s_cbranch_vccz": not w.mask(VCC).any(), "s_cbranch_vccnz": w.mask(VCC).any(),
                "s_cbranch_execz": not w.exec.any(), "s_cbranch_execnz": w.exec.any()}.get(m)
        if cond is None:
            raise EmulatorError(f"branch `{i.line}` is not modelled")
        if cond:
            w.pc = labels[i.operands[0].text]
        return
    if m.startswith("global_"):
        _global(w, i, memory)
        return
    if m.startswith("ds_"):
        _ds(w, i, lds, log)
        return
    if m.startswith("scratch_"):
        _scratch(w, i)
        return
    if m.startswith("s_load_"):
        _s_load(w, i, memory)
        return
    raise EmulatorError(f"instruction `{i.line}` is not modelled by the AMD emulator")


class EmulatedHipKernel:
    """A HsacoKernelArtifact run on the emulator: kernel(*arrays) -> the result, as HipKernel
    returns it on a GPU."""

    def __init__(self, artifact, record_lds: bool = False):
        from ..doctor.capabilities import ROCM_PROFILES
        self.artifact = artifact
        self.lds_accesses: list[LdsAccess] | None = [] if record_lds else None  # every LDS access of the last call
        self.lanes = ROCM_PROFILES[artifact.chip].warp_size
        self.program = parse(artifact.asm, artifact.name)

    def __call__(self, *arrays):
        a = self.artifact
        inputs = checked_inputs(a.name, a.params, arrays)
        memory = Memory()
        pointers = [memory.place(x) for x in inputs]
        outputs = [p for p in a.params if p.output]
        for param in outputs:
            pointers.append(memory.place(np.zeros(param.shape, to_numpy(param.dtype))))
        kernarg = bytearray()
        for kind, value in a.launch_arguments(pointers):
            if kind in ("ptr", "i64"):
                kernarg += int(value).to_bytes(8, "little", signed=kind == "i64" and value < 0)
            elif kind == "f32":
                kernarg += np.float32(value).tobytes()
            elif kind == "i32":
                kernarg += int(value).to_bytes(4, "little", signed=True)
            else:
                raise EmulatorError(f"kernel argument type {kind} is not modelled")
        expected = max((o + s for o, s in self.program.args), default=0)
        if len(kernarg) != expected:
            raise EmulatorError(f"{a.name}: {len(kernarg)} bytes of arguments, the code object reads {expected}")
        if self.lds_accesses is not None:
            self.lds_accesses.clear()
        run_kernel(self.program, self.lanes, a.grid, a.block, bytes(kernarg), memory, a.vgprs, self.lds_accesses)
        results = []
        for param, address in zip(outputs, pointers[len(inputs):]):
            raw = next(r for s, r in memory.buffers if s == address)
            dtype = to_numpy(param.dtype)
            results.append(raw[:int(np.prod(param.shape)) * dtype.itemsize].view(dtype).reshape(param.shape).copy())
        return results[0] if len(results) == 1 else tuple(results)


def lds_conflicts(accesses: list[LdsAccess]) -> dict[str, int]:
    """The worst bank conflicts (extra LDS cycles, codegen/bank_conflicts' model of 32 banks of
    4 bytes, 128 bytes a cycle) of each LDS instruction over the accesses an emulated run made."""
    from ..codegen.bank_conflicts import conflicts
    worst: dict[str, int] = {}
    for a in accesses:
        worst[a.line] = max(worst.get(a.line, 0), conflicts(a.addresses.tolist(), a.width, a.lanes.tolist()))
    return worst
