"""Small helpers shared by the Triton launchers."""

import torch
import triton


def interpreting() -> bool:
    """Whether kernels run in Triton's interpreter (TRITON_INTERPRET=1, read when a kernel module
    is imported)."""
    return bool(triton.knobs.runtime.interpret)


def upcast_dot_operands(dtype: torch.dtype) -> bool:
    """Whether to feed tl.dot fp32 operands instead of `dtype` ones. On a GPU, bf16/fp16 operands
    use the fast tensor-core path (with fp32 accumulation); the interpreter gets bf16 dots wrong,
    so there they are upcast (exact: bf16 values are fp32 values)."""
    return dtype == torch.bfloat16 and interpreting()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors to fill (a small stand-in off CUDA, where it only shapes grids)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def check_dot_dim(name: str, value: int) -> None:
    """tl.dot needs power-of-two operand dims of at least 16 (GPUs require it; the interpreter
    does not check, so check here to keep CPU tests honest)."""
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16 for tl.dot, got {value}")
