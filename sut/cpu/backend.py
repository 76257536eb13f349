"""The CPU backend's one entry for the runner: `setup_cpu_backend(model, folder, settings)` readies a
loaded model for a CPU device and returns a CpuBackend with what the runner asks of it later."""

import ctypes
import sys
from pathlib import Path

import torch
from torch import nn

from kernels import KernelOps
from sut.config.cpu import CpuSettings
from sut.cpu.build import library
from sut.cpu.layer import CpuDecoder
from sut.cpu.linear import pack_linears
from sut.cpu.ops import c_ops
from sut.cpu.quant import attach_gguf_blocks
from sut.model.loader import forward_weight_bytes

KV_CACHE_GB = 2.0  # the KV cache's size unless the engine settings give one


def keep_freed_memory_in_heap() -> None:
    """glibc serves large allocations with mmap and returns them on free, so every step's big
    temporaries (gathered K/V, activations) page-fault afresh; on CPU that doubled decode time.
    Raise the mmap and trim thresholds so freed memory is reused instead (process-wide)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 512 << 20)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


class CpuBackend:
    """`ops`: the C op set for the runner to offer kernels.select_ops (None when the C kernels cannot
    be built here); `kv_cache_bytes`: the KV cache's default size; `decoder()`: the one-call decode
    path, once the KV cache is in place; `weight_bytes_read`: the fewest weight bytes a forward reads
    (sut.model.loader.forward_weight_bytes, taken before packing)."""

    def __init__(self, model: nn.Module, lib, sliced: bool = False, weight_bytes_read: int = 0):
        self.model, self.lib, self.sliced = model, lib, sliced
        self.weight_bytes_read = weight_bytes_read
        self.ops: KernelOps | None = None if lib is None else c_ops(lib)
        self.kv_cache_bytes = int(KV_CACHE_GB * 2**30)

    def decoder(self, max_query_len: int = 1) -> CpuDecoder | None:
        """Decode-only steps in one C call (layer.py), when the model runs this backend's ops in fp32
        and every linear computes from its blocks; else None. Call after the KV cache is in place:
        the decoder holds pointers to it. `max_query_len`: the most query rows of a sequence it takes
        (1: decodes only; 1 + k to verify k drafts)."""
        model = self.model
        if (
            self.sliced
            or self.ops is None
            or model.ops is not self.ops
            or model.model.embed_tokens.weight.dtype != torch.float32
            or not CpuDecoder.applies(model)
        ):
            return None
        return CpuDecoder(model, self.lib, max_query_len)


def setup_cpu_backend(
    model: nn.Module, folder: str | Path | None, settings: CpuSettings, sliced: bool = False
) -> CpuBackend:
    """Ready `model`, just loaded from `folder` onto the CPU: keep freed memory in the heap, compute its
    linears from the folder's GGUF blocks where `settings` ask for it, and pack the rest for oneDNN.
    `sliced`: a tensor-parallel rank's slices of the model (or `folder` None: random weights), for
    which the GGUF blocks (whole layers' rows) and the one-call decoder (every layer, without the
    ranks' all-reduces between them) do not apply."""
    keep_freed_memory_in_heap()
    if settings.quantized_weights and folder is not None and not sliced:
        attach_gguf_blocks(model, folder, settings.int16_activations)  # before packing: it checks the dense weights
    weight_bytes_read = forward_weight_bytes(model)
    pack_linears(model)
    return CpuBackend(model, library(), sliced, weight_bytes_read)
