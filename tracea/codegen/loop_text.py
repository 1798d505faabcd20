"""A writer of MLIR loop nests on memrefs (scf, memref, arith, vector), the text every hand-written
kernel is made of: fresh SSA names, index constants hoisted to the top, nesting by indentation.
(codegen/kernel_text.py writes the other kind: functions on tensors for linalg lowerings.)"""
from __future__ import annotations

from ..dialects.ops import TensorSpec


class LoopText:
    """Lines of MLIR with fresh SSA names and index constants hoisted to the top."""

    def __init__(self, serial: bool = False):
        self.serial = serial  # parallel loops written as scf.for: the kernel runs on the calling thread
        self._parallel_depths: list[int] = []
        self.lines: list[str] = []
        self.consts: dict[int, str] = {}
        self._n = 0
        self.depth = 1

    def c(self, value: int) -> str:
        if value not in self.consts:
            self.consts[value] = f"%c{value}".replace("-", "m")
        return self.consts[value]

    def fresh(self, hint: str = "t") -> str:
        self._n += 1
        if hint == "c":  # "%c<n>" names the index constants
            hint = "c_"
        return f"%{hint}{self._n}"

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def op(self, text: str, hint: str = "t") -> str:
        name = self.fresh(hint)
        self.line(f"{name} = {text}")
        return name

    def add(self, x: str, y: str) -> str:
        return self.op(f"arith.addi {x}, {y} : index", "i")

    def mul(self, x: str, y: str) -> str:
        return self.op(f"arith.muli {x}, {y} : index", "i")

    def min_(self, x: str, y: str) -> str:
        return self.op(f"arith.minsi {x}, {y} : index", "i")

    def cmp(self, pred: str, x: str, y: str) -> str:
        return self.op(f"arith.cmpi {pred}, {x}, {y} : index", "p")

    def open(self, header: str) -> None:
        self.line(header + " {")
        self.depth += 1

    def close(self, trailer: str = "}") -> None:
        self.depth -= 1
        self.line(trailer)

    def else_(self) -> None:
        """Close an scf.if's then-region and open its else-region."""
        self.close("} else {")
        self.depth += 1

    def load_f32(self, mem: str, mem_t: str, idx: list[str], dtype: str) -> str:
        x = self.op(f"memref.load {mem}[{', '.join(idx)}] : {mem_t}", "x")
        return x if dtype == "f32" else self.op(f"arith.extf {x} : {dtype} to f32", "x")

    def guarded(self, inside: str, result_type: str, load, otherwise: str) -> str:
        """`load()` (it writes the ops of a value and returns its name) where `inside` holds,
        the load itself under the condition, else `otherwise`."""
        value = self.fresh("v")
        self.open(f"{value} = scf.if {inside} -> ({result_type})")
        self.line(f"scf.yield {load()} : {result_type}")
        self.else_()
        self.line(f"scf.yield {otherwise} : {result_type}")
        self.close()
        return value

    def load_f32_if(self, inside: str, mem: str, mem_t: str, idx: list[str], dtype: str, otherwise: str) -> str:
        """The element as f32 where `inside` holds (the load itself guarded), else `otherwise`."""
        return self.guarded(inside, "f32", lambda: self.load_f32(mem, mem_t, idx, dtype), otherwise)

    def batched_view(self, mem: str, spec: TensorSpec, batch: int) -> tuple[str, str]:
        """A memref holding a [..., rows, cols] tensor, viewed as [batch, rows, cols] (the leading
        dims flattened; none: a batch of 1). Returns (view, its type)."""
        mem_t = memref_text(spec.shape, spec.dtype)
        rows, cols = spec.shape[-2:]
        if spec.rank == 2:
            flat = memref_text((1, rows, cols), spec.dtype)
            size = rows if rows is not None else self.op(f"memref.dim {mem}, {self.c(0)} : {mem_t}", "n")
            return self.op(f"memref.expand_shape {mem} [[0, 1], [2]] output_shape [1, {size}, {cols}] "
                           f": {mem_t} into {flat}", "m"), flat
        flat = memref_text((batch, rows, cols), spec.dtype)
        if spec.rank == 3:
            return mem, flat
        groups = "[" + ", ".join(str(i) for i in range(spec.rank - 2)) + f"], [{spec.rank - 2}], [{spec.rank - 1}]"
        return self.op(f"memref.collapse_shape {mem} [{groups}] : {mem_t} into {flat}", "m"), flat

    def to_buffer(self, value: str, spec: TensorSpec) -> str:
        return self.op(f"bufferization.to_buffer {value} read_only : {spec} to {memref_text(spec.shape, spec.dtype)}", "m")

    def function_text(self, name: str, params: str, result_mem: str, out: TensorSpec, location: str) -> str:
        """The private function on tensors these lines make, returning the buffer `result_mem`."""
        result = self.op(f"bufferization.to_tensor {result_mem} restrict writable : "
                         f"{memref_text(out.shape, out.dtype)} to {out}", "r")
        consts = [f"  {n} = arith.constant {value} : index" for value, n in sorted(self.consts.items())]
        return (f"#src = {location}\nfunc.func private @{name}({params}) -> {out} {{\n"
                + "\n".join(consts + self.lines) + f"\n  return {result} : {out}\n}}\n")

    def for_(self, iv: str, lo: str, hi: str, step: str) -> None:
        self.open(f"scf.for {iv} = {lo} to {hi} step {step}")

    def reduction(self, lo: str, hi: str, inits: list[str], vtype: str, step, unroll: int = 1,
                  stride: int = 1, exact: bool = False) -> list[str]:
        """A loop over k in [lo, hi) by `stride` carrying `inits` (a micro-kernel's accumulators):
        step(k, values) writes one k's ops and returns the new values. With unroll > 1 an
        iteration runs `unroll` steps and a second loop the rest, one at a time (the trip
        counts here are run-time values, which LLVM does not unroll); hi - lo must be a multiple
        of `stride`, and with `exact` of unroll * stride (no second loop). Returns the final values."""
        def loop(lo: str, hi: str, inits: list[str], unroll: int) -> list[str]:
            def body(iv: str, values: list[str]) -> list[str]:
                for u in range(unroll):
                    values = step(iv if u == 0 else self.add(iv, self.c(u * stride)), values)
                return values
            return self.carried_for(lo, hi, self.c(unroll * stride), inits, vtype, body)

        if unroll == 1 or exact:
            return loop(lo, hi, inits, unroll)
        whole = self.add(lo, self.mul(self.op(f"arith.divui {self.op(f'arith.subi {hi}, {lo} : index', 'i')}, "
                                             f"{self.c(unroll * stride)} : index", "i"), self.c(unroll * stride)))
        return loop(whole, hi, loop(lo, whole, inits, unroll), 1)

    def carried_for(self, lo: str, hi: str, step: str, inits: list[str], vtype: str, body) -> list[str]:
        """scf.for over [lo, hi) by `step` carrying `inits` (all of type `vtype`): body(iv, values)
        writes one iteration's ops and returns the values carried on. Returns the final values."""
        types = ", ".join([vtype] * len(inits))
        res, iv = self.fresh("r"), self.fresh("k")
        names = [self.fresh("acc") for _ in inits]
        self.open(f"{res}:{len(inits)} = scf.for {iv} = {lo} to {hi} step {step} "
                  f"iter_args({', '.join(f'{n} = {i}' for n, i in zip(names, inits))}) -> ({types})")
        self.line(f"scf.yield {', '.join(body(iv, names))} : {types}")
        self.close()
        return [f"{res}#{i}" for i in range(len(inits))]

    def parallel(self, iv: str, lo: str, hi: str, step: str) -> None:
        self.parallel_nd([iv], [lo], [hi], [step])

    def parallel_nd(self, ivs: list[str], los: list[str], his: list[str], steps: list[str]) -> None:
        """An scf.parallel over several induction variables (serial: nested scf.for, the first outermost)."""
        self._parallel_depths.append(self.depth)
        if self.serial:
            for iv, lo, hi, step in zip(ivs, los, his, steps):
                self.for_(iv, lo, hi, step)
        else:
            self.open(f"scf.parallel ({', '.join(ivs)}) = ({', '.join(los)}) to ({', '.join(his)}) "
                      f"step ({', '.join(steps)})")

    def close_parallel(self) -> None:
        depth = self._parallel_depths.pop()
        if not self.serial:
            self.line("scf.reduce")
        while self.depth > depth:
            self.close()


def memref_text(shape, dtype: str) -> str:
    return "memref<" + "".join(f"{'?' if d is None else d}x" for d in shape) + dtype + ">"


def busiest_thread(items: list[int], threads: int) -> int:
    """The most work one thread runs when a parallel loop over `items` (each its work) runs on
    `threads` threads: OpenMP's static schedule gives each an equal contiguous run of the items,
    the first len(items) % threads one item more. Unequal items or a count the threads do not
    divide leave one thread the longest."""
    share, extra = divmod(len(items), threads)
    ends = [0]
    for i in range(threads):
        ends.append(ends[-1] + share + (i < extra))
    return max(sum(items[ends[i]:ends[i + 1]]) for i in range(threads))
