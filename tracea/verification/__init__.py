"""Tools that check generated code without the hardware it is for (not used at run time):
ptx_emulator.py runs NVIDIA kernels' PTX on numpy, warp by warp."""
