"""The SIMT (FMA) GEMM for NVIDIA GPUs: the f32 path and the fallback where no matrix
instruction applies (f16 / bf16 whose K or N are not multiples of 8). A gpu.module text,
lowered by targets/nvvm/target.py.

    block (bx, by) computes C[by BM : +BM, bx BN : +BN]; thread (tx, ty) its TM x TN sub-tile
    for each K block of BK:
        the threads copy A[., k0 : k0 + BK] (transposed, As[kk][m]) and B[k0 : k0 + BK, .] (Bs[kk][n];
        from B[n][k] for nn.Linear's B^T) into shared memory as f32, zero outside the matrices; barrier
        for kk < BK: a[TM] = As[kk][ty TM + i], b[TN] = Bs[kk][tx TN + j]; acc[i][j] += a[i] b[j]
        barrier
    the fused_gemm epilogue on each accumulator, cast, stored inside C

tracea-gpu-kernels (targets/nvvm/kernels.py) uses it for f32 GEMMs; f16 / bf16 go to the Tensor Core
kernels when their shapes allow.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...codegen.loop_text import LoopText, memref_text
from .mma import MmaGemm, collapse_views, gpu_module_text, kernel_params
from ...codegen.kernel_text import fused_epilogue


@dataclass(frozen=True)
class SimtTiles:
    block_m: int = 64
    block_n: int = 64
    block_k: int = 16
    thread_m: int = 4
    thread_n: int = 4

    @property
    def threads(self) -> tuple[int, int]:
        """(x, y) threads per block: x along N, y along M."""
        return self.block_n // self.thread_n, self.block_m // self.thread_m

    def validate(self, max_threads: int = 1024) -> None:
        if self.block_m % self.thread_m or self.block_n % self.thread_n:
            raise ValueError(f"block tile {self.block_m}x{self.block_n} must be a multiple of the thread tile "
                             f"{self.thread_m}x{self.thread_n}")
        x, y = self.threads
        if x * y > max_threads:
            raise ValueError(f"{x * y} threads per block ({self.block_m}/{self.thread_m} x {self.block_n}/"
                             f"{self.thread_n}); at most {max_threads}")


def simt_gemm_module_text(g: MmaGemm, tiles: SimtTiles = SimtTiles(), name: str = "gemm", spirv: bool = False) -> str:
    """A gpu.module with kernel @name(A, B[, bias][, residual], C) (the parameters of
    gpu_mma.kernel_params), any float inputs, f32 accumulation. The kernel is plain gpu dialect,
    so the Vulkan target runs it too (`spirv`: its shared tiles are allocations in address space
    3, as MLIR's SPIR-V conversion takes them, and it has the entry point's workgroup size)."""
    tiles.validate()
    m, n, k = g.m, g.n, g.k
    BM, BN, BK, TM, TN = tiles.block_m, tiles.block_n, tiles.block_k, tiles.thread_m, tiles.thread_n
    TX, TY = tiles.threads
    nthreads = TX * TY
    ws = workgroup_space(spirv)
    As_t, Bs_t = f"memref<{BK}x{BM}xf32, {ws}>", f"memref<{BK}x{BN}xf32, {ws}>"
    A_t, B_t, C_t = g.matrix_type("A", g.dtype), g.matrix_type("B", g.dtype), g.matrix_type("C", g.out_dtype)
    if g.conv is not None:
        A_t = memref_text(g.conv.image.shape, g.dtype)
    t = LoopText()
    t.depth = 3
    shared_buffer(t, spirv, "%As", As_t)
    shared_buffer(t, spirv, "%Bs", Bs_t)
    for line in collapse_views(g):
        t.line(line)
    zero = t.op("arith.constant 0.0 : f32", "z")
    t.line("%tx = gpu.thread_id x")
    t.line("%ty = gpu.thread_id y")
    t.line("%bx = gpu.block_id x")
    t.line("%by = gpu.block_id y")
    tid = t.add(t.mul("%ty", t.c(TX)), "%tx")
    row0 = t.mul("%by", t.c(BM))
    col0 = t.mul("%bx", t.c(BN))

    def guarded_load(mem: str, mem_t: str, r: str, c: str, rows: int, cols: int) -> str:
        inside = t.op(f"arith.andi {t.cmp('ult', r, t.c(rows))}, {t.cmp('ult', c, t.c(cols))} : i1", "p")
        return t.load_f32_if(inside, mem, mem_t, [r, c], g.dtype, zero)

    accs = [f"%acc{i}_{j}" for i in range(TM) for j in range(TN)]
    acc_types = ", ".join(["f32"] * len(accs))
    t.open(f"%res:{len(accs)} = scf.for %k0 = {t.c(0)} to {t.c(k)} step {t.c(BK)} iter_args("
           + ", ".join(f"{a} = {zero}" for a in accs) + f") -> ({acc_types})")
    # cooperative copies: element e of the tile for e = tid, tid + threads, ...
    t.for_("%e", tid, t.c(BM * BK), t.c(nthreads))
    mm, kk = t.op(f"arith.divui %e, {t.c(BK)} : index", "i"), t.op(f"arith.remui %e, {t.c(BK)} : index", "i")
    if g.conv is not None:
        a = gathered_load(t, g, A_t, t.add(row0, mm), t.add("%k0", kk), zero)
    elif g.transpose_a:
        a = guarded_load("%A", A_t, t.add("%k0", kk), t.add(row0, mm), k, m)
    else:
        a = guarded_load("%A", A_t, t.add(row0, mm), t.add("%k0", kk), m, k)
    t.line(f"memref.store {a}, %As[{kk}, {mm}] : {As_t}")
    t.close()
    t.for_("%e", tid, t.c(BK * BN), t.c(nthreads))
    kk, nn = t.op(f"arith.divui %e, {t.c(BN)} : index", "i"), t.op(f"arith.remui %e, {t.c(BN)} : index", "i")
    if g.transpose_b:
        b = guarded_load("%B", B_t, t.add(col0, nn), t.add("%k0", kk), n, k)
    else:
        b = guarded_load("%B", B_t, t.add("%k0", kk), t.add(col0, nn), k, n)
    t.line(f"memref.store {b}, %Bs[{kk}, {nn}] : {Bs_t}")
    t.close()
    t.line("gpu.barrier")
    inner = [f"%in{i}_{j}" for i in range(TM) for j in range(TN)]
    t.open(f"%acck:{len(accs)} = scf.for %kk = {t.c(0)} to {t.c(BK)} step {t.c(1)} iter_args("
           + ", ".join(f"{x} = {a}" for x, a in zip(inner, accs)) + f") -> ({acc_types})")
    av = [t.op(f"memref.load %As[%kk, {t.add(t.mul('%ty', t.c(TM)), t.c(i))}] : {As_t}", "a") for i in range(TM)]
    bv = [t.op(f"memref.load %Bs[%kk, {t.add(t.mul('%tx', t.c(TN)), t.c(j))}] : {Bs_t}", "b") for j in range(TN)]
    new = [t.op(f"math.fma {av[i]}, {bv[j]}, {inner[i * TN + j]} : f32", "f") for i in range(TM) for j in range(TN)]
    t.line(f"scf.yield {', '.join(new)} : {acc_types}")
    t.close()
    t.line("gpu.barrier")
    t.line(f"scf.yield {', '.join(f'%acck#{i}' for i in range(len(accs)))} : {acc_types}")
    t.close()
    for i in range(TM):
        for j in range(TN):
            r = t.add(row0, t.add(t.mul("%ty", t.c(TM)), t.c(i)))
            c = t.add(col0, t.add(t.mul("%tx", t.c(TN)), t.c(j)))
            inside = t.op(f"arith.andi {t.cmp('ult', r, t.c(m))}, {t.cmp('ult', c, t.c(n))} : i1", "p")
            t.open(f"scf.if {inside}")
            operands = {}
            if g.bias_dtype:
                operands["bias_add"] = (t.op(f"memref.load %bias[{c}] : {memref_text((n,), g.bias_dtype)}", "e"), g.bias_dtype)
            if g.residual_dtype:
                operands["residual_add"] = (t.op(f"memref.load %residual[{r}, {c}] : "
                                                 f"{g.matrix_type('residual', g.residual_dtype)}", "e"), g.residual_dtype)
            lines, x = fused_epilogue(f"%res#{i * TN + j}", g.epilogue, operands, g.out_dtype, None, f"%ep{i}_{j}_")
            for line in lines:
                t.line(line)
            t.line(f"memref.store {x}, %C[{r}, {c}] : {C_t}")
            t.close()
    if spirv:
        return gpu_module_text(t, name, kernel_params(g), (TX, TY), attributes=spirv_entry_point((TX, TY, 1)))
    return gpu_module_text(t, name, kernel_params(g), (TX, TY), f"%As: {As_t}, %Bs: {Bs_t}")


def gathered_load(t: LoopText, g: MmaGemm, image_t: str, row: str, col: str, zero: str) -> str:
    """Element (row, col) of a conv's im2col matrix, read from the NHWC image %A: row (n, oy, ox),
    col (ky, kx, c); 0 past the matrix and in the padding (a negative coordinate is a huge
    unsigned one, so one unsigned compare per axis checks both sides)."""
    (_, h, w, c), (_, kw), (oh, ow) = g.conv.image.shape, g.conv.kernel, g.conv.out_hw
    (sy, sx), (dy, dx), (top, left) = g.conv.stride, g.conv.dilation, g.conv.top_left

    def divmod_(x: str, d: int) -> tuple[str, str]:
        return t.op(f"arith.divui {x}, {t.c(d)} : index", "i"), t.op(f"arith.remui {x}, {t.c(d)} : index", "i")

    n, pixel = divmod_(row, oh * ow)
    oy, ox = divmod_(pixel, ow)
    ky, rest = divmod_(col, kw * c)
    kx, ch = divmod_(rest, c)
    iy = t.op(f"arith.subi {t.add(t.mul(oy, t.c(sy)), t.mul(ky, t.c(dy)))}, {t.c(top)} : index", "i")
    ix = t.op(f"arith.subi {t.add(t.mul(ox, t.c(sx)), t.mul(kx, t.c(dx)))}, {t.c(left)} : index", "i")
    inside = t.cmp("ult", row, t.c(g.m))
    for value, bound in ((col, g.k), (iy, h), (ix, w)):
        inside = t.op(f"arith.andi {inside}, {t.cmp('ult', value, t.c(bound))} : i1", "p")
    return t.load_f32_if(inside, "%A", image_t, [n, iy, ix, ch], g.dtype, zero)


def workgroup_space(spirv: bool) -> str:
    """Shared memory's address space in a memref type: 3 for MLIR's SPIR-V conversion (which takes
    allocations), the gpu dialect's for the NVVM and ROCDL ones (which take attributions)."""
    return "3" if spirv else "#gpu.address_space<workgroup>"


def shared_buffer(t: LoopText, spirv: bool, name: str, memref_type: str) -> str:
    """A workgroup buffer: allocated in the kernel for SPIR-V (workgroup attributions abort this
    MLIR's SPIR-V conversion), else `name` is a workgroup attribution of the kernel."""
    if spirv:
        t.line(f"{name} = memref.alloc() : {memref_type}")
    return name


def spirv_entry_point(workgroup: tuple[int, int, int]) -> str:
    """The attribute MLIR's SPIR-V conversion makes a kernel's entry point (and its LocalSize) from."""
    return f", spirv.entry_point_abi = #spirv.entry_point_abi<workgroup_size = [{', '.join(map(str, workgroup))}]>"


def grid(m: int, n: int, tiles: SimtTiles = SimtTiles(), batch: int = 1) -> tuple[int, int, int]:
    return -(-n // tiles.block_n), -(-m // tiles.block_m), batch
