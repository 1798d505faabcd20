"""The ROCm target: tracea ops -> gpu-dialect kernels (stage "gpu": tracea-rocdl-kernels) -> the
LLVM dialect through ROCDL (stage "rocdl") -> LLVM IR -> AMDGPU machine code from llvmlite's
AMDGPU back end (O3: lower, the kernels would ask for hidden arguments they do not use), in the
compiler child, where an abort of LLVM's code generator is reported like a pass's -> an HSACO code
object linked by ld.lld (15 or newer: code object v5). The kernel's VGPRs, LDS and scratch are
read from the assembly's .amdhsa directives and checked against the chip before anything runs;
runtime/hip_launcher.py launches it where ROCm is, runtime/amd_emulator.py runs its assembly
anywhere."""
from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlir.ir as ir

from ...doctor.capabilities import ROCM_PROFILES
from ...errors import CompileError
from ...passes.pipeline import Pipeline, parse_pipeline
from ...runtime.gpu_artifact import HsacoKernelArtifact, buffer_params
from ..base import Build, Target, package_version, register_target
from ..cpu.native import translate_to_llvm_ir
from ..nvvm.target import KEPT_LAUNCHES

TRIPLE = "amdgcn-amd-amdhsa"


@dataclass(frozen=True)
class RocmOptions:
    chip: str  # gfx90a, gfx942, gfx1100


def rocdl_lowering(chip: str) -> str:
    # math first to LLVM's intrinsics: the ROCDL conversion would make them calls into ROCm's
    # device library (__ocml_floor_f32), which is not linked
    return (f"tracea-keep-launches, tracea-scalar-math, gpu.module(expand-strided-metadata, lower-affine, "
            f"convert-math-to-llvm, convert-scf-to-cf, convert-gpu-to-rocdl{{chipset={chip}}}, reconcile-unrealized-casts)")


def machine_code(module: ir.Operation, chip: str) -> tuple[bytes, str]:
    """(ELF object, assembly) of the module's gpu.module for `chip`."""
    from ..cpu.native import _llvm
    llvm = _llvm()
    llvm.initialize_all_targets()  # (idempotent) the AMDGPU back end beside the host's
    llvm.initialize_all_asmprinters()
    body = module.regions[0].blocks[0]
    kernels = [op.operation for op in body.operations if op.operation.name == "gpu.module"]
    if len(kernels) != 1:
        raise CompileError(f"expected one gpu.module, found {len(kernels)}")
    functions = "\n".join(str(op) for op in kernels[0].regions[0].blocks[0].operations)
    translated = translate_to_llvm_ir(ir.Module.parse(f"module {{\n{functions}\n}}", module.context).operation)
    machine = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=chip, opt=3, reloc="pic", codemodel="default")
    parsed = llvm.parse_assembly(f'target datalayout = "{machine.target_data}"\ntarget triple = "{TRIPLE}"\n'
                                 + translated)
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
    builder.getModulePassManager().run(parsed, builder)
    optimized = str(parsed)
    # each emission from its own copy: code generation rewrites the module it runs on (its
    # control-flow annotation), and a second pass over that fails to select what it added
    return machine.emit_object(parsed), machine.emit_assembly(llvm.parse_assembly(optimized))


@functools.cache
def lld() -> str | None:
    """An ld.lld of LLVM 15 or newer (older ones reject code object v5), or None."""
    for name in [f"ld.lld-{v}" for v in range(22, 14, -1)] + ["ld.lld"]:
        path = shutil.which(name)
        if path:
            done = subprocess.run([path, "--version"], capture_output=True, text=True)
            found = re.search(r"LLD (\d+)", done.stdout)
            if found and int(found.group(1)) >= 15:
                return path
    return None


def link(obj: bytes, kernel: str) -> bytes:
    tool = lld()
    if tool is None:
        raise CompileError("linking an AMD code object needs ld.lld 15 or newer: apt-get install lld-19")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernel.o", Path(tmp) / "kernel.hsaco"
        src.write_bytes(obj)
        done = subprocess.run([tool, "-shared", "--no-undefined", "-o", str(out), str(src)], capture_output=True,
                              text=True)
        if done.returncode:
            raise CompileError(f"ld.lld could not link the code object of {kernel}:\n{done.stderr.strip()}")
        return out.read_bytes()


@dataclass(frozen=True)
class Resources:
    vgprs: int  # per lane, with CDNA's accumulation registers (AGPRs)
    lds_bytes: int  # per workgroup
    scratch_bytes: int  # per lane: spills and private arrays


def resources(asm: str, kernel: str) -> Resources:
    """The kernel's resources, from the code object's metadata (the assembly's .amdgpu_metadata:
    the .amdhsa directives hold expressions over symbols since LLVM 19)."""
    start = asm.find("amdhsa.kernels:")  # (one kernel a code object)
    if start < 0:
        raise CompileError(f"the assembly of {kernel} has no code object metadata")
    metadata = asm[start:]

    def value(name: str) -> int:
        found = re.search(rf"\.{name}:\s+(\d+)", metadata)
        return int(found.group(1)) if found else 0
    return Resources(value("vgpr_count") + value("agpr_count"), value("group_segment_fixed_size"),
                     value("private_segment_fixed_size"))


def check_launch(kernel: str, chip: str, used: Resources, block: tuple[int, int, int]) -> None:
    """Refuse what the chip cannot run, naming the resource and the fix."""
    gpu = ROCM_PROFILES[chip]
    threads = block[0] * block[1] * block[2]
    if threads > gpu.threads_per_block:
        raise CompileError(f"{kernel} asks for {threads} lanes per workgroup; {chip} allows {gpu.threads_per_block}")
    if used.lds_bytes > gpu.shared_bytes_per_block:
        raise CompileError(f"{kernel} needs {used.lds_bytes / 1024:.0f} KiB of LDS; {chip} has "
                           f"{gpu.shared_bytes_per_block // 1024} KiB per workgroup: reduce the tile")
    if used.vgprs > gpu.registers_per_thread:
        raise CompileError(f"{kernel} uses {used.vgprs} VGPRs per lane; {chip} has {gpu.registers_per_thread}: "
                           "use a smaller register tile")


@register_target
class RocmTarget(Target):
    """compile(..., target="rocm") on an AMD GPU with ROCm; compile_gpu(fn, chip="gfx942")
    anywhere: the HSACO code object and its launch (HsacoKernelArtifact). One gemm / fused_gemm /
    NHWC conv2d (f32) per function."""
    name = "rocm"

    def options(self, *, strategy: str = "tiled", threads: int | None = None, chip: str | None = None) -> RocmOptions:
        if strategy != "tiled" or threads is not None:
            raise ValueError("target 'rocm' takes neither strategy= nor threads= (its kernels' workgroups come from "
                             "their variants)")
        if chip is None:
            from ... import knobs
            if knobs.amd_emulator():
                raise ValueError("TRACEA_AMD_EMULATOR=1 runs the kernels of a named chip: pass chip='gfx90a', "
                                 "'gfx942' or 'gfx1100'")
            from ...runtime.hip_launcher import HipDevice
            chip = HipDevice.get(0).chip
        if chip not in ROCM_PROFILES:
            raise ValueError(f"unsupported AMD processor {chip!r}; Tracea targets {', '.join(ROCM_PROFILES)}")
        return RocmOptions(chip)

    def stages(self, options: RocmOptions) -> dict[str, Pipeline]:
        return {"gpu": parse_pipeline(f"tracea-verify, tracea-rocdl-kernels{{chip={options.chip}}}"),
                "rocdl": parse_pipeline(rocdl_lowering(options.chip))}

    def toolchain(self, options: RocmOptions) -> tuple[str, ...]:
        return (*super().toolchain(options), package_version("llvmlite"), str(lld()))

    def device(self, options: RocmOptions):
        from ... import knobs
        if knobs.amd_emulator():
            return None
        from ...runtime.hip_launcher import HipDevice
        return HipDevice.get(0)

    def codegen(self, module: ir.Operation, options: RocmOptions) -> bytes:
        launches = ir.DictAttr(module.attributes[KEPT_LAUNCHES]) if KEPT_LAUNCHES in module.attributes else {}
        obj, asm = machine_code(module, options.chip)
        return json.dumps({"object": base64.b64encode(obj).decode(), "asm": asm,
                           "launches": {a.name: str(a.attr) for a in launches}}).encode()

    def package(self, code: bytes, signature, options: RocmOptions) -> HsacoKernelArtifact:
        from ..nvvm.kernels import Launch

        code = json.loads(code)
        kernel = f"@{signature.name}"
        hsaco = link(base64.b64decode(code["object"]), kernel)
        used = resources(code["asm"], signature.name)
        launch = Launch.of(code, signature.name)
        check_launch(kernel, options.chip, used, launch.block)
        return HsacoKernelArtifact(signature.name, options.chip, hsaco, code["asm"], launch.grid, launch.block,
                                   tuple(buffer_params(signature)), used.vgprs, used.lds_bytes, used.scratch_bytes)

    def load(self, build: Build, options: RocmOptions, device):
        from ... import knobs
        if knobs.amd_emulator():
            from ...runtime.amd_emulator import EmulatedHipKernel
            kernel = EmulatedHipKernel(build.artifact)
        else:
            from ...runtime.hip_launcher import HipKernel
            kernel = HipKernel(build.artifact, device)
        kernel.stages = build.stages
        return kernel
