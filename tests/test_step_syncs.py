"""On CUDA a host read of a device tensor waits for the device, and the step's one such wait is
`sut.sample.sampler.to_host` (the sampled tokens, once per forward, the draft model's forwards included).
Counted on CPU with the op set CUDA runs (the Triton kernels, in the interpreter): every .item(),
.tolist(), .cpu(), .numpy(), int(), float(), bool() of a tensor called from the engine's code
(sut/, kernels/) on anything but what `to_host` returned (and views of it) is a defect; so is any
in `draw`, which samples from those host copies, apart."""

import sys
from pathlib import Path

import pytest
import torch

import sut.sample.sampler
import sut.sample.verifier
import sut.spec_decode.draft_model
from sut import LLM, SamplingParams
from sut.worker.model_runner import ModelRunner
from tests.helpers import random_prompts

REPO = Path(__file__).resolve().parents[1]
OURS = (str(REPO / "sut") + "/", str(REPO / "kernels") + "/")
HOST_READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")
ON_HOST_COPIES = {"to_host", "draw"}  # sut/sample/sampler.py: they work on the host copies alone


def count_host_reads(monkeypatch) -> tuple[list[str], list[int], list[int]]:
    """(host reads outside to_host, to_host calls, forwards that wanted logits): lists that fill as
    the engine runs."""
    reads, syncs, forwards = [], [], []
    host_copies: set[int] = set()  # storages to_host returned (on CPU: the tensors themselves)
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            frame = sys._getframe(1)
            where = frame.f_code.co_filename
            if (
                where.startswith(OURS)
                and frame.f_code.co_name not in ON_HOST_COPIES
                and self.untyped_storage().data_ptr() not in host_copies
            ):
                reads.append(f"{_name}() at {Path(where).relative_to(REPO)}:{frame.f_lineno}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    to_host = sut.sample.sampler.to_host

    def counted_to_host(*tensors):
        syncs.append(len(tensors))
        copies = to_host(*tensors)
        host_copies.update(t.untyped_storage().data_ptr() for t in copies)
        return copies

    for module in (sut.sample.sampler, sut.sample.verifier, sut.spec_decode.draft_model):
        monkeypatch.setattr(module, "to_host", counted_to_host)
    execute = ModelRunner.execute

    def counted_execute(self, step, *aux_layers):
        if step.logits_indices.shape[0]:  # a forward some sequence samples from
            forwards.append(len(step.query_lens_host))
        return execute(self, step, *aux_layers)

    monkeypatch.setattr(ModelRunner, "execute", counted_execute)
    return reads, syncs, forwards


@pytest.mark.parametrize(
    "spec", [None, {"method": "ngram", "num_speculative_tokens": 3}, "draft"], ids=["plain", "ngram", "draft"]
)
@pytest.mark.slow
def test_each_forward_reads_the_device_once(tiny_llama, monkeypatch, spec):
    if spec == "draft":
        spec = {"method": "draft_model", "model": str(tiny_llama[0]), "num_speculative_tokens": 2}
    llm = LLM(
        tiny_llama[0],
        kernels="triton",
        num_kv_blocks=32,
        block_size=8,
        max_num_batched_tokens=16,
        device="cpu",
        speculative_config=spec,
    )
    prompts = [(p * 3)[:20] for p in random_prompts([4, 11, 6], seed=5)]
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.9, seed=3),
        SamplingParams(max_tokens=6, temperature=0.5, top_k=5, seed=4),
    ]
    reads, syncs, forwards = count_host_reads(monkeypatch)
    outputs = llm.generate(prompts, params)
    assert all(len(o.token_ids) == 6 or o.finish_reason == "stop" for o in outputs)
    assert reads == [], "host reads of tensors outside sut.sample.sampler.to_host:\n" + "\n".join(reads)
    assert len(syncs) == len(forwards) > 0, "not one to_host a forward that samples"
