"""kernels.select_ops, the one backend switch: Triton on CUDA, the CPU backend's op set on CPU when
it has one (else the PyTorch ops), a forced setting, and Triton refused off CUDA outside the
interpreter."""

import pytest

import kernels
from kernels import TORCH_OPS, TRITON_OPS, KernelOps, select_ops

C_OPS = KernelOps("c", *[lambda *a: None] * 6)


@pytest.mark.parametrize(
    "device, setting, cpu_ops, expected",
    [
        ("cuda", "auto", None, TRITON_OPS),
        ("cuda", "torch", None, TORCH_OPS),
        ("cuda", "triton", None, TRITON_OPS),
        ("cpu", "auto", C_OPS, C_OPS),
        ("cpu", "auto", None, TORCH_OPS),  # no C kernels here
        ("cpu", "torch", C_OPS, TORCH_OPS),
    ],
)
def test_the_op_set_follows_device_and_setting(device, setting, cpu_ops, expected):
    assert select_ops(device, setting, cpu_ops) is expected


def test_triton_off_cuda_only_in_the_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "interpreting", lambda: True)
    assert select_ops("cpu", "triton", C_OPS) is TRITON_OPS
    monkeypatch.setattr(kernels, "interpreting", lambda: False)
    with pytest.raises(ValueError, match=r"kernels='triton' needs a CUDA device, or TRITON_INTERPRET=1"):
        select_ops("cpu", "triton", C_OPS)


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match=r"kernels must be one of \['auto', 'triton', 'torch'\], got 'cuda'"):
        select_ops("cuda", "cuda")


def test_the_engine_says_which_setting_failed(tiny_llama, monkeypatch):
    from sut import LLM
    from sut.errors import ConfigError

    monkeypatch.setattr(kernels, "interpreting", lambda: False)
    with pytest.raises(ConfigError, match=r"engine setting kernels='triton' needs a CUDA device"):
        LLM(tiny_llama[0], num_kv_blocks=32, device="cpu", kernels="triton")
