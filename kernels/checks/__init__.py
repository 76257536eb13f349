"""The kernels' checks, apart from the kernels: each Triton kernel against its PyTorch reference on
random inputs (`compare`: the tests in Triton's interpreter, tests/compile_for_gpu.py and the GPU
check), and the FP8 kernels' cases and benchmarks at the shapes they serve (`fp8`). Like the rest
of kernels/, it imports nothing of ours outside kernels/."""
