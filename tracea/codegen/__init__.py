"""Target-neutral code generation: the writers of MLIR text kernels are made of (loop_text.py for
loop nests on memrefs, kernel_text.py for functions on tensors), the conv2d gather of the
implicit GEMM (conv_gather.py), the shared-memory bank model (bank_conflicts.py) and the base of
every kernel variant the Doctor chooses among (variants.py). Each backend's kernels, under
tracea/targets/<backend>/, are built from these."""
