"""Host machine code from the LLVM dialect, through llvmlite's LLVM (22, the major version of the
MLIR bindings, so the translated IR text is understood as is).

Why not MLIR's ExecutionEngine: it always runs LLVM's -O pipeline, loop vectorizer included, on
kernels that arrive tiled, vectorized and unrolled; that was 40-60 % of a kernel's compile time
and made no measured difference to the GEMM and conv kernels. Here a kernel gets the clean-up
its lowering needs (folding the memref descriptors, simplifying the control flow) and the full
code generator, and the object code is kept: it is what `Kernel.export` links.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import mlir.ir as ir

from ...errors import CompileError
from ...runtime.faults import FAULTS

PACKED_PREFIX = "_mlir_"  # the packed entry of `f` (one void** argument array) is `_mlir_f`
OBJECTS_PREFIX = "_tracea_objects_"  # `f`'s entry taking numpy arrays (Python objects): objects_entry


# f32 -> bf16 (round to nearest even, NaN stays a quiet NaN). LLVM calls it for fptrunc where
# the CPU has no bf16 conversion; defined here so neither the JIT nor an exported library needs
# a compiler runtime that has it (libgcc has it from GCC 13 only).
TRUNCATE_TO_BF16 = """
define weak hidden bfloat @__truncsfbf2(float %x) {
  %bits = bitcast float %x to i32
  %magnitude = and i32 %bits, 2147483647
  %is_nan = icmp ugt i32 %magnitude, 2139095040
  %high = lshr i32 %bits, 16
  %odd = and i32 %high, 1
  %bias = add i32 %odd, 32767
  %rounded = add i32 %bits, %bias
  %nearest = lshr i32 %rounded, 16
  %quiet_nan = or i32 %high, 64
  %result = select i1 %is_nan, i32 %quiet_nan, i32 %nearest
  %half = trunc i32 %result to i16
  %value = bitcast i16 %half to bfloat
  ret bfloat %value
}
"""


@functools.cache
def _llvm():
    try:
        import llvmlite.binding as llvm
    except ImportError:
        raise CompileError("generating CPU code needs llvmlite (pip install llvmlite==0.50.0)") from None
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    _hold_llvm_across_fork(llvm)
    return llvm


def _hold_llvm_across_fork(llvm) -> None:
    """llvmlite serializes calls into LLVM with one process-wide lock. A fork (the compiler child)
    while another thread is inside such a call would leave the child waiting on that lock for
    ever, so the forking thread takes it first (waiting for the call in flight) and both
    processes release it after the fork."""
    lock = getattr(getattr(getattr(llvm, "ffi", None), "lib", None), "_lock", None)
    inner = getattr(lock, "_lock", None)  # llvmlite's _LLVMLock wraps an RLock
    if inner is not None:
        os.register_at_fork(before=inner.acquire, after_in_parent=inner.release, after_in_child=inner.release)


@functools.cache
def _translation_api():
    """MLIR's C API for the LLVM translation, called directly: the Python binding
    (`translate_module_to_llvmir`) prints the translated module without checking that the
    translation succeeded, so a module it cannot translate (an op no lowering converted, say)
    segfaulted the compiler in LLVM's Module::print instead of reporting the op."""
    import mlir
    libs = Path(mlir.__path__[0]) / "_mlir_libs"
    # PyDLL: the GIL stays held, since a diagnostic the translation emits runs Python handlers
    capi = ctypes.PyDLL(str(libs / "libMLIRPythonCAPI.so"))  # loaded already: the bindings' own copy
    llvm = ctypes.CDLL(str(libs.parent.parent / "llvm" / "lib" / "libLLVM.so"))  # the LLVM it links
    capi.mlirTranslateModuleToLLVMIR.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    capi.mlirTranslateModuleToLLVMIR.restype = ctypes.c_void_p
    llvm.LLVMContextCreate.argtypes, llvm.LLVMContextCreate.restype = [], ctypes.c_void_p
    llvm.LLVMContextDispose.argtypes, llvm.LLVMContextDispose.restype = [ctypes.c_void_p], None
    llvm.LLVMDisposeModule.argtypes, llvm.LLVMDisposeModule.restype = [ctypes.c_void_p], None
    llvm.LLVMPrintModuleToString.argtypes = [ctypes.c_void_p]
    llvm.LLVMPrintModuleToString.restype = ctypes.c_void_p  # freed with LLVMDisposeMessage
    llvm.LLVMDisposeMessage.argtypes, llvm.LLVMDisposeMessage.restype = [ctypes.c_void_p], None
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.argtypes, get_pointer.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p
    return capi, llvm, get_pointer


# What MLIR's LLVM translation takes: the LLVM and OpenMP dialects in a builtin module.
_TRANSLATABLE = ("llvm.", "omp.")


def _untranslatable_ops(operation) -> list[str]:
    found: dict[str, str] = {}

    def visit(op):
        name = op.operation.name
        if name != "builtin.module" and not name.startswith(_TRANSLATABLE) and name not in found:
            found[name] = str(op.operation.location)
        return ir.WalkResult.ADVANCE

    operation.walk(visit)
    return [f"{name} ({loc})" for name, loc in found.items()]


def translate_to_llvm_ir(operation) -> str:
    """LLVM IR text of an LLVM-dialect module; CompileError (never a crash) when MLIR cannot
    translate it, naming the ops the LLVM lowering left unconverted."""
    capi, llvm, get_pointer = _translation_api()
    op_pointer = get_pointer(operation._CAPIPtr, b"mlir.ir.Operation._CAPIPtr")
    context = llvm.LLVMContextCreate()
    try:
        module = capi.mlirTranslateModuleToLLVMIR(op_pointer, context)
        if not module:  # MLIR emitted a diagnostic on the first op at fault
            leftover = _untranslatable_ops(operation)  # walked only here: a success costs nothing
            if leftover:
                raise CompileError("the LLVM lowering left ops no conversion took, which cannot become LLVM IR: "
                                   + ", ".join(leftover[:8]) + (" ..." if len(leftover) > 8 else ""))
            raise CompileError("translating the LLVM dialect to LLVM IR failed (see the diagnostics)")
        try:
            text = llvm.LLVMPrintModuleToString(module)
            try:
                return ctypes.string_at(text).decode()
            finally:
                llvm.LLVMDisposeMessage(text)
        finally:
            llvm.LLVMDisposeModule(module)
    finally:
        llvm.LLVMContextDispose(context)


# x86 features above each narrower ISA (name prefixes; LLVM turns back on what an enabled feature
# implies, so SSE must also drop the VEX-encoded crypto ones): what a kernel planned for that ISA
# (TRACEA_CPU) must not use
_WIDER_THAN = {"avx2": ("avx512", "avx10", "amx", "evex512", "avxvnni", "avxifma", "avxneconvert"),
               "sse": ("avx", "fma", "f16c", "amx", "evex512", "vaes", "vpclmulqdq", "xop", "sha512", "sm3", "sm4")}


def host_machine():
    """The target machine kernels are compiled for: the host's CPU and features as LLVM detects
    them (never assumed), position-independent code, so an object links into a shared library as
    is. When TRACEA_CPU plans for a narrower x86 ISA than the host's (AVX2 on an AVX-512 host),
    the host's features above that ISA are turned off: the kernel is then that ISA's machine code
    (VEX only, 16 vector registers), not the host's with narrower vectors, and times as it would
    there."""
    from ...doctor.capabilities import host_cpu, probe_cpu
    planned, host = host_cpu(), probe_cpu()
    return _machine(_WIDER_THAN.get(planned.isa, ()) if planned.arch == host.arch else ())


@functools.cache
def _machine(turned_off: tuple[str, ...]):
    """The host's machine without the features whose names start with `turned_off`."""
    llvm = _llvm()
    features = llvm.get_host_cpu_features()
    for name in features:
        if name.startswith(turned_off):
            features[name] = False
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=features.flatten(), opt=2, reloc="pic")


@functools.cache
def warm_up() -> None:
    """Compile a tiny module once in this process: LLVM's first code generation sets up tables
    worth ~0.1 s, which every forked compiler child then inherits instead of redoing."""
    from ...dialects.context import pipeline_lock, shared_context

    with pipeline_lock, shared_context("pipeline"):
        module = ir.Module.parse("llvm.func @tracea_warm_up(%x: vector<4xf32>, %p: !llvm.ptr) {\n"
                                 "  %y = llvm.fmul %x, %x : vector<4xf32>\n"
                                 "  llvm.store %y, %p : vector<4xf32>, !llvm.ptr\n  llvm.return\n}")
        object_code(module, [])


def packed_entry(llvm_ir: str, function: str) -> str:
    """An `int32_t _mlir_<function>(void **args)` wrapper: args[i] points to the i-th argument,
    which is a pointer (to a memref descriptor). Kernels are called through it with one ctypes
    array. It returns a status, bit i set when fault counter i (runtime/faults.py) moved during
    the call; the runtime raises the matching error. A counter belongs to the kernel, not to the
    call: while two threads run the same kernel, one's fault may raise in both."""
    match = re.search(rf"^define void @{re.escape(function)}\(([^)]*)\)", llvm_ir, re.MULTILINE)
    if match is None:
        raise CompileError(f"the translated module has no function @{function} returning void")
    params = [p.strip() for p in match.group(1).split(",") if p.strip()]
    if any(not p.startswith("ptr") for p in params):
        raise CompileError(f"@{function} takes non-pointer arguments ({match.group(1)}); its packed entry "
                           "expects memref descriptors passed by pointer")
    counters = [(bit, name) for bit, (name, _, _) in enumerate(FAULTS)
                if re.search(rf"^@{name} = ", llvm_ir, re.MULTILINE)]
    lines = [f"define i32 @{PACKED_PREFIX}{function}(ptr %args) {{"]
    for i in range(len(params)):
        lines += [f"  %slot{i} = getelementptr ptr, ptr %args, i64 {i}",
                  f"  %ref{i} = load ptr, ptr %slot{i}",
                  f"  %arg{i} = load ptr, ptr %ref{i}"]
    for bit, name in counters:
        lines.append(f"  %before{bit} = load atomic i32, ptr @{name} monotonic, align 4")
    lines.append(f"  call void @{function}({', '.join(f'ptr %arg{i}' for i in range(len(params)))})")
    status = "0"
    for bit, name in counters:
        lines += [f"  %after{bit} = load atomic i32, ptr @{name} monotonic, align 4",
                  f"  %moved{bit} = icmp ne i32 %after{bit}, %before{bit}",
                  f"  %flag{bit} = select i1 %moved{bit}, i32 {1 << bit}, i32 0",
                  f"  %status{bit} = or i32 {status}, %flag{bit}"]
        status = f"%status{bit}"
    lines += [f"  ret i32 {status}", "}", ""]
    return llvm_ir + "\n" + "\n".join(lines) + objects_entry(function, len(params))


def objects_entry(function: str, count: int) -> str:
    """An `int32_t _tracea_objects_<function>(void **args, int64_t data_offset, PyObject *a0, ...)`
    wrapper around the packed entry: it points each memref descriptor args[i] at array i's data,
    read from the array object itself at `data_offset` (where numpy keeps its data pointer;
    runtime/kernel.py finds it). Python then passes the arrays as they are: pointing the
    descriptors from Python (an address and two ctypes fields per array) cost more than the
    call itself (1.5 of a 1x64x64 GEMM's 4.9 us), and a model's kernel takes every weight."""
    objects = ", ".join(f"ptr %o{i}" for i in range(count))
    lines = [f"define i32 @{OBJECTS_PREFIX}{function}(ptr %args, i64 %data_offset{', ' if count else ''}{objects}) {{"]
    for i in range(count):
        lines += [f"  %field{i} = getelementptr i8, ptr %o{i}, i64 %data_offset",
                  f"  %data{i} = load ptr, ptr %field{i}",
                  f"  %slot{i} = getelementptr ptr, ptr %args, i64 {i}",
                  f"  %ref{i} = load ptr, ptr %slot{i}",  # args[i] points to the descriptor's pointer
                  f"  %desc{i} = load ptr, ptr %ref{i}",
                  f"  store ptr %data{i}, ptr %desc{i}",  # allocated
                  f"  %aligned{i} = getelementptr ptr, ptr %desc{i}, i64 1",
                  f"  store ptr %data{i}, ptr %aligned{i}"]
    lines += [f"  %status = call i32 @{PACKED_PREFIX}{function}(ptr %args)", "  ret i32 %status", "}", ""]
    return "\n".join(lines)


def object_code(module, entries: list[str], optimize: bool = False) -> bytes:
    """Compile an LLVM-dialect module (an ir.Module or its operation) to a host object file with
    a packed entry for each function named in `entries`. optimize=True runs LLVM's -O1 (without
    its vectorizers) instead of the clean-up: loop nests MLIR lowered generically (elementwise
    chains, reductions) ran 5-10 % faster with it; Tracea's kernels did not. A large module is
    compiled in parts on several cores (parallel_parts)."""
    llvm_ir = translate_to_llvm_ir(getattr(module, "operation", module))
    parts = parallel_parts(llvm_ir, entries)
    if parts is not None:
        code = _compile_parts(parts, entries, optimize)
        if code is not None:
            return code
    return compile_llvm_ir(llvm_ir, entries, optimize)


def compile_llvm_ir(llvm_ir: str, entries: list[str], optimize: bool) -> bytes:
    """object_code's work on LLVM IR text."""
    llvm = _llvm()
    for entry in entries:
        llvm_ir = packed_entry(llvm_ir, entry)
    if "bfloat" in llvm_ir:
        llvm_ir += TRUNCATE_TO_BF16
    machine = host_machine()
    try:
        parsed = llvm.parse_assembly(llvm_ir)
        parsed.triple = machine.triple
        parsed.data_layout = str(machine.target_data)
        parsed.verify()
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected the translated module: {e}") from None
    if optimize:
        options = llvm.create_pipeline_tuning_options(speed_level=1)
        options.loop_vectorization = options.slp_vectorization = False  # measured no faster
        builder = llvm.create_pass_builder(machine, options)
        builder.getModulePassManager().run(parsed, builder)
    else:
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=1))
        passes = llvm.create_new_module_pass_manager()
        # what the MLIR lowering leaves behind: descriptor structs built and taken apart (sroa,
        # instcombine), constant branches and empty blocks (simplifycfg), dead address arithmetic
        passes.add_sroa_pass()
        passes.add_instruction_combine_pass()
        passes.add_simplify_cfg_pass()
        passes.add_dead_code_elimination_pass()
        passes.run(parsed, builder)
    if "@llvm.coro." in llvm_ir:  # MLIR's async runtime: coroutines need LLVM's coroutine lowering,
        # which llvmlite offers only inside a default pipeline (its -O0 one: nothing else)
        options = llvm.create_pipeline_tuning_options(speed_level=0)
        coroutines = llvm.create_pass_builder(machine, options)
        coroutines.getModulePassManager().run(parsed, coroutines)
    return machine.emit_object(parsed)


# -- compiling a large module on several cores ---------------------------------------------------
# A model's kernel is a few hundred functions (one per loop nest, tracea-outline-loops); LLVM
# compiles each on its own, so the module is cut into one part per core, each compiled in a
# forked child, and the objects are joined into one by a relocatable link (`cc -r`). Each part
# holds its functions and declares the others'; functions of internal linkage become hidden, so
# that the parts can call each other and the library still exports nothing new; constants are
# copied into every part, and a mutable global (the division-by-zero counter) is defined in the
# first and declared in the others. Anything else unusual, a child's crash, no linker: the module
# is compiled whole, as before.
PARALLEL_MIN_BYTES = 256 * 1024  # smaller modules compile in ~0.2 s: a fork and a link cost more


def parallel_parts(llvm_ir: str, entries: list[str]) -> list[str] | None:
    """The module cut into one part per core (the entries and their callers' glue in the first),
    or None when it is small, the compiler is not isolated (forking the caller's threads is not
    safe) or it holds a construct the cut does not handle."""
    from ... import knobs
    from ...doctor.capabilities import machine_cores
    cores = machine_cores()
    if cores < 2 or len(llvm_ir) < PARALLEL_MIN_BYTES or not knobs.isolate_compiler():
        return None
    functions, preamble, mutable = [], [], []
    lines = iter(llvm_ir.split("\n"))
    for line in lines:
        if line.startswith("define "):
            body = [line]
            for inner in lines:
                body.append(inner)
                if inner == "}":
                    break
            functions.append(body)
        elif line.startswith("@") and " = " in line:
            if not re.search(r" = (private |internal )?(unnamed_addr )?constant ", line):
                mutable.append(line)
            preamble.append(line)
        else:
            preamble.append(line)
    if len(functions) < 2 or any(not re.match(r"@[\w.$]+ = (internal )?global (i\d+|\[\d+ x i\d+\]) ", g)
                                 for g in mutable):
        return None
    groups: dict[str, list[list[str]]] = {}
    for body in functions:
        name = _defined_name(body[0])
        groups.setdefault(name.split("..omp_par")[0], []).append(body)  # OpenMP regions with their loop
    first = {name for name in groups if any(e in name for e in entries) or "_tracea_entry_" in name}
    loads = [0] * min(cores, 8)
    assigned: dict[str, int] = {name: 0 for name in first}
    loads[0] = sum(len(b) for name in first for b in groups[name])
    for name in sorted(set(groups) - first, key=lambda n: -sum(len(b) for b in groups[n])):
        part = loads.index(min(loads))
        assigned[name] = part
        loads[part] += sum(len(b) for b in groups[name])
    parts = []
    for part in range(len(loads)):
        text = [_exported_global(g, part) if g in mutable else g for g in preamble]
        for name, bodies in groups.items():
            for body in bodies:
                header = body[0].replace("define internal ", "define hidden ", 1)
                text += [header] + body[1:] if assigned[name] == part else [_declaration(header)]
        parts.append("\n".join(text))
    return parts


def _defined_name(header: str) -> str:
    return re.search(r"@([\w.$]+)\(", header).group(1)


def _declaration(header: str) -> str:
    """`declare` for a `define` line: the same return type, name and parameters."""
    start = header.index("@" + _defined_name(header) + "(")
    depth, end = 0, start
    for end in range(header.index("(", start), len(header)):
        depth += {"(": 1, ")": -1}.get(header[end], 0)
        if depth == 0:
            break
    prefix = header[len("define "):start].split()
    kept = [w for w in prefix if w not in ("internal", "private", "dso_local", "weak", "linkonce_odr")]
    return "declare " + " ".join(kept) + " " + header[start:end + 1]


def _exported_global(line: str, part: int) -> str:
    """A mutable global: defined (hidden) in part 0, declared in the others."""
    name, definition = line.split(" = ", 1)
    definition = definition.removeprefix("internal ")
    if part == 0:
        return f"{name} = hidden {definition}"
    kind = re.match(r"global (i\d+|\[\d+ x i\d+\]) ", definition).group(1)
    return f"{name} = external hidden global {kind}"


def _compile_parts(parts: list[str], entries: list[str], optimize: bool) -> bytes | None:
    from ...errors import TraceaError
    from ...passes.isolation import ChildDied, start_in_fork
    from ...runtime.aot import linker
    try:
        link = linker()
    except TraceaError:
        return None
    waits = [start_in_fork(compile_llvm_ir, (part, [], optimize)) for part in parts[1:]]
    first = compile_llvm_ir(parts[0], entries, optimize)
    objects = [first]
    for wait in waits:
        try:
            objects.append(wait()[0])
        except ChildDied:
            return None  # compiled whole: a real error then surfaces where it belongs
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, code in enumerate(objects):
            paths.append(Path(tmp) / f"part{i}.o")
            paths[-1].write_bytes(code)
        done = subprocess.run([link, "-r", "-nostdlib", "-o", str(Path(tmp) / "kernel.o"), *map(str, paths)],
                              capture_output=True, text=True)
        if done.returncode:
            return None
        return (Path(tmp) / "kernel.o").read_bytes()


class JitLibrary:
    """Object code linked into this process (LLVM's ORC JIT), its symbols resolved against the
    process, where the runtime libraries kernels call into were loaded globally. Each has its
    own JIT session, so its library name need not be unique."""

    def __init__(self, obj: bytes, exported: list[str], also: Sequence[bytes] = ()):
        """`also`: more objects linked into the same library, whose definitions take precedence
        over the process's (runtime/gnu_openmp.py's OpenMP entry points)."""
        llvm = _llvm()
        self._jit = llvm.create_lljit_compiler()
        builder = llvm.JITLibraryBuilder().add_object_img(obj)
        for other in also:
            builder.add_object_img(other)
        builder.add_current_process()
        for name in exported:
            builder.export_symbol(name)
        try:
            self._tracker = builder.link(self._jit, "tracea_kernel")
        except RuntimeError as e:
            raise CompileError(f"linking the kernel's object code failed: {e}") from None
        self.addresses = {name: self._tracker[name] for name in exported}
        from ... import knobs
        if knobs.perf_map() and exported:
            write_perf_map(obj, exported[0], self.addresses[exported[0]])


def elf_functions(obj: bytes) -> list[tuple[str, int, int, int]]:
    """(name, section index, offset, size) of each function an ELF64 little-endian object defines."""
    import struct
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    found = []
    for kind, link, offset, size, entsize in ((s[1], s[6], s[4], s[5], s[9]) for s in sections):
        if kind != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name_at, info, _, shndx, value, sym_size = struct.unpack_from("<IBBHQQ", obj, at)
            if info & 0xF == 2 and shndx:  # STT_FUNC, defined here
                name = obj[strtab + name_at:obj.index(b"\0", strtab + name_at)].decode()
                found.append((name, shndx, value, sym_size))
    return found


def write_perf_map(obj: bytes, known: str, address: int) -> None:
    """Append the object's functions to /tmp/perf-<pid>.map, placed by `known`'s address (the
    JIT loads each section whole, so functions keep their offsets within it)."""
    functions = elf_functions(obj)
    anchor = next((f for f in functions if f[0] == known), None)
    if anchor is None:
        return
    with open(f"/tmp/perf-{os.getpid()}.map", "a") as out:
        for name, section, offset, size in functions:
            if section == anchor[1]:
                out.write(f"{address - anchor[2] + offset:x} {size:x} tracea:{name}\n")
