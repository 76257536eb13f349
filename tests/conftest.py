import os

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter. Triton reads the switch when a
# kernel module is imported (at @triton.jit), and test modules import the engine, hence kernels,
# as they are collected: so it is set here, before any of them. It changes nothing else: on CPU
# the engine uses the PyTorch ops unless a test asks for the Triton ones.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.manual_seed(0)

from tests.helpers import SMOLLM2_DIR, TINY_CONFIG  # noqa: E402 (after TRITON_INTERPRET)
from tests.tiny_system import build_chain  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny random Llama (GQA, 2 layers) saved as a Hugging Face folder, and the transformers model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    model = LlamaForCausalLM(LlamaConfig(**TINY_CONFIG)).to(torch.float32).eval()
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="session")
def smollm2_dir():
    if not (SMOLLM2_DIR / "model.safetensors").is_file():
        pytest.fail(f"SmolLM2 is not converted at {SMOLLM2_DIR}: run `make models` (make test does it)")
    return SMOLLM2_DIR


# Fixtures whose first user builds them for a minute or more of LoadGen runs: the tiny chain (below)
# and the report's runs (tests/test_report.py). Every test on them is slow, whichever runs first.
SLOW_FIXTURES = {"chain", "report_run"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def chain(tiny_llama, tmp_path_factory):
    """Every run of the demo chain for a tiny system (tests/tiny_system.py); returns (repo-like root,
    the packaged tree, each run's verdict). Tests that change it work on a copy."""
    return build_chain(tiny_llama[0], tmp_path_factory.mktemp("repo"))
