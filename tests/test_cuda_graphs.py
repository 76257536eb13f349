"""Decode steps through DecodeGraphs' static buffers (padding rows, the ladder, eager above it)
give the eager engine's tokens. CPU has no CUDA graphs: a stand-in capture replays by running the
captured function again on the same buffers and metadata, which is what a graph replays; the
Triton kernels (in the interpreter) read lengths and tables from those buffers as on a GPU."""

import pytest

from sut import LLM, SamplingParams
from sut.errors import ConfigError
from sut.worker.cuda_graphs import DecodeGraphs, graph_batch_sizes
from tests.helpers import random_prompts


def test_ladder_is_nano_vllms():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16]
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]


class StandInGraph:
    def __init__(self, run, out, replays, size):
        self.run, self.out, self.replays, self.size = run, out, replays, size

    def replay(self):
        self.replays.append(self.size)
        self.out.copy_(self.run())


@pytest.mark.slow
def test_decode_graphs_give_the_eager_tokens(tiny_llama):
    settings = dict(
        kernels="triton", num_kv_blocks=128, block_size=8, max_num_seqs=20, max_num_batched_tokens=256, device="cpu"
    )
    prompts = random_prompts([3 + (7 * i) % 23 for i in range(18)], seed=4)
    params = [SamplingParams(max_tokens=2 + i % 5, ignore_eos=True) for i in range(18)]
    eager = [o.token_ids for o in LLM(tiny_llama[0], **settings).generate(prompts, params)]
    llm = LLM(tiny_llama[0], **settings)
    runner, replays = llm.engine.runner, []

    def capture(run, pool):
        out = run()
        return StandInGraph(run, out, replays, len(out)), out, pool

    runner.graphs = DecodeGraphs(runner.model, 20, 64, llm.engine.max_model_len, runner.device, capture=capture)
    assert [o.token_ids for o in llm.generate(prompts, params)] == eager
    assert 16 in replays and 8 in replays, replays  # 18 decodes ran eagerly (above the ladder), then fewer on graphs


def test_cuda_graphs_refused_off_cuda(tiny_llama):
    with pytest.raises(ConfigError, match="cuda_graphs needs a CUDA device"):
        LLM(tiny_llama[0], num_kv_blocks=32, device="cpu", cuda_graphs=True)
    with pytest.raises(ConfigError, match="cuda_graphs must be true or false"):
        LLM(tiny_llama[0], num_kv_blocks=32, device="cpu", cuda_graphs="yes")
