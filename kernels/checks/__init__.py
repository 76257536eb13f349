"""The kernels' checks and benchmarks, apart from the kernels. `compare`: each Triton kernel against
its PyTorch reference on random inputs (the tests in Triton's interpreter, tests/compile_for_gpu.py
and the GPU check). The GPU check's kernel half (`make gpu-check`, run by sut/bench/gpu_check.py):
`gpu_cases`, every kernel against its reference on CUDA at the served shapes (`CHECKS`);
`gpu_bench`, the kernels' benchmarks against the measured peaks; `fp8`, the FP8 kernels' cases and
benchmarks; `shapes`, the served models' shapes they share. Like the rest of kernels/, it imports
nothing of ours outside kernels/."""
