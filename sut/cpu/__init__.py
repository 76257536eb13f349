"""The CPU backend: what makes the engine fast on a CPU device, apart from the device-neutral engine.

The runner calls one entry, `sut.cpu.backend.setup_cpu_backend(model, folder, settings)`, on a model
just loaded onto the CPU. It keeps freed memory in glibc's heap (backend.py), computes small batches
of each linear from the model folder's GGUF blocks where it can (quant.py, quant.c) and packs the
other linears for oneDNN (linear.py), and returns a CpuBackend holding the C op set (ops.py: norms,
rope, KV-cache write and SiLU-and-mul in ops.c, decode attention in attention.c) for
kernels.select_ops, the KV cache's default size, and the decoder that runs a decode-only step's
layers in one C call (layer.py, layer.c). build.py compiles the C sources once per instruction-set
level (avx512, avx2, portable: every SIMD path has a portable one) and describes the CPU for run
records. The engine's `cpu` settings are sut/config/cpu.py; sut/tools/convert_gguf.py writes the
demo model's folder, the fp32 checkpoint with the GGUF blocks beside it. Without a C compiler the
engine runs on the PyTorch ops and fp32 weights alone.
"""
