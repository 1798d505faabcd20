"""Functions made GPU kernels, for every GPU target: each function computing one kernel op
becomes a `gpu.func` (named after it, parameters: the op's operands, then the result buffer) in
the module's `gpu.module @kernels`, with its launch configuration as `tracea.launch`; the host
function is removed (Tracea's runtimes launch kernels from that attribute)."""
from __future__ import annotations

import math
from typing import Callable

import mlir.ir as ir

from ..dialects.ops import OpView, view
from ..dialects.verify import tracea_ops
from ..doctor.capabilities import Capabilities
from ..doctor.engine import PlanError
from ..errors import OpError
from ..passes.registry import PassFailed
from ..passes.select_variant import select


def fits_in_memory(v: OpView, caps: Capabilities) -> None:
    """Operands a GPU cannot hold, or of sizes known at run time only, are an input error (their
    tile loops would also be absurdly long, or impossible, to plan)."""
    for name, spec in [*v.operands.items(), ("result", v.result)]:
        if None in spec.shape:
            raise OpError(f"operand {name!r} ({spec}) has a size known at run time only; GPU kernels are "
                          "planned for static shapes (the CPU's attention kernel takes a run-time key length)")
        size = math.prod(spec.shape) * {"f16": 2, "bf16": 2}.get(spec.dtype, 4)
        if size > caps.gpu.memory_bytes:
            raise OpError(f"{'the result' if name == 'result' else f'operand {name!r}'} ({spec}) takes "
                          f"{size / 2 ** 30:,.0f} GiB; the {caps.gpu.name} ({caps.gpu.arch}) has "
                          f"{caps.gpu.memory_bytes / 2 ** 30:,.0f} GiB: split the problem")


def single_kernel_op(func: ir.Operation, kinds: tuple[str, ...], target: str) -> ir.Operation:
    """The one op of `kinds` a function computes, its operands the function's arguments in order."""
    ops = tracea_ops(func)
    kernels = [op for op in ops if op.name in kinds]
    if len(ops) != 1 or len(kernels) != 1:
        article = "an" if target[0] in "AEIOUN" else "a"  # (an NVIDIA, a Vulkan)
        raise OpError(f"{article} {target} kernel is made from a function computing one "
                      f"{' / '.join(k.removeprefix('tracea.') for k in kinds)}; "
                      f"@{ir.StringAttr(func.attributes['sym_name']).value} has "
                      f"{', '.join(op.name for op in ops) or 'no tracea op'}")
    op = kernels[0]
    args = list(func.regions[0].blocks[0].arguments)
    operands = list(op.operands)
    if len(operands) != len(args) or any(not (x == arg) for x, arg in zip(operands, args)):
        raise OpError(f"{op.name}'s operands must be the function's arguments, in order: they become the "
                      "kernel's parameters (then the result buffer)")
    return op


def functions_to_kernels(module: ir.Operation, caps: Capabilities, kinds: tuple[str, ...], target: str,
                         emitters: dict[str, Callable], pass_name: str) -> None:
    """Replace every function of `module` by the kernel the emitter of its op's variant writes
    (emitter(view, name, caps) -> (gpu.module text, launch with to_attr())). Errors are emitted at the
    functions, then PassFailed."""
    body = module.regions[0].blocks[0]
    funcs = [op.operation for op in body.operations if op.operation.name == "func.func"]
    kernels, failed = [], False
    for func in funcs:
        name = ir.StringAttr(func.attributes["sym_name"]).value
        try:
            op = single_kernel_op(func, kinds, target)
            fits_in_memory(view(op), caps)
            variant_id = select(op, caps)
            text, launch = emitters[variant_id](view(op), name, caps)
        except (OpError, PlanError) as e:
            func.location.emit_error(f"{pass_name}: {e}")
            failed = True
            continue
        kernels.append((func, text, launch))
    if failed:
        raise PassFailed()  # each function's error was emitted at it
    with module.context, module.location:
        module.attributes["gpu.container_module"] = ir.UnitAttr.get()
        previous = None  # the kernels go into the first gpu.module, in the functions' order
        for func, text, launch in kernels:
            parsed = ir.Module.parse(text)
            generated = parsed.body.operations[0].operation  # gpu.module @kernels
            kernel = generated.regions[0].blocks[0].operations[0].operation
            kernel.attributes["tracea.launch"] = launch.to_attr()
            if previous is None:
                generated.move_before(func)
            else:
                kernel.move_after(previous)
            previous = kernel
            func.erase()
