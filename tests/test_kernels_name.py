"""`kernels` is also the name of a Hugging Face library that transformers probes for: importing
both must give each its own, in either order."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import importlib, sys
first, second = sys.argv[1:]
importlib.import_module(first); importlib.import_module(second)
import kernels, transformers
from transformers.utils.import_utils import is_kernels_available
from transformers import LlamaConfig, LlamaForCausalLM
LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2))
print(kernels.__file__, is_kernels_available(), hasattr(kernels, "paged_attention"))
"""


@pytest.mark.slow
def test_transformers_and_our_kernels_coexist():
    for order in (["transformers", "kernels"], ["kernels", "transformers"]):
        out = subprocess.run([sys.executable, "-c", CHECK, *order], cwd=REPO, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        path, hf_sees_kernels, ours = out.stdout.split()
        assert Path(path).resolve() == REPO / "kernels" / "__init__.py"
        assert hf_sees_kernels == "False", "transformers took our kernels package for the HF kernels library"
        assert ours == "True"
