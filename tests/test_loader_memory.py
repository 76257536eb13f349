"""The model is built on the meta device and filled tensor by tensor: loading SmolLM2 raises the
process's peak memory by about one copy of the weights, not two."""

import subprocess
import sys

import pytest

MEASURE = """
import resource, sys, torch
from sut.config import ModelConfig
from sut.model.loader import load_model
folder = sys.argv[1]
config = ModelConfig.from_folder(folder)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
before = rss()
model = load_model(folder, config, torch.float32, torch.device("cpu"))
for p in model.parameters():  # touch every weight: lazily mapped pages count once read
    p.sum()
# VmHWM, not getrusage's ru_maxrss: that one survives fork and exec, so it would report the
# parent's peak when the parent (this test session) is the larger process.
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
print(before, peak, weights)
"""


@pytest.mark.slow
def test_loading_peaks_at_about_one_copy_of_the_weights(smollm2_dir):
    out = subprocess.run([sys.executable, "-c", MEASURE, str(smollm2_dir)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    before, peak, weights = map(int, out.stdout.split())
    assert weights > 500e6  # SmolLM2-135M in fp32
    assert peak - before < 1.5 * weights, f"loading raised peak RSS by {(peak - before) / weights:.2f}x the weights"
