"""Tensor parallelism over 2 processes on gloo (sut/parallel/): greedy output equals one
process's, with chunked prefill and preemption; each rank holds about half the weights; sizes that
do not divide the heads are refused by name; a rank that dies ends the engine with an error naming
it, no process left behind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from sut import LLM, LLMEngine, SamplingParams, WorkerError
from sut.errors import ConfigError
from sut.parallel import COLLECTIVE_TIMEOUT
from systems.schema import REPO
from tests.helpers import random_prompts

# A small pool and step budget: prompts go in chunks, and sequences are preempted.
SETTINGS = dict(
    num_kv_blocks=16, block_size=8, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=8, device="cpu"
)


@pytest.mark.slow
def test_two_ranks_give_one_process_greedy_tokens_with_half_the_weights_each(tiny_llama):
    prompts = random_prompts([5, 31, 12, 44, 9, 20], seed=13)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    one = LLM(tiny_llama[0], **SETTINGS)
    want = one.generate(prompts, params)
    assert one.engine.scheduler.num_preemptions > 0, "the pool is small enough to preempt"
    two = LLM(tiny_llama[0], tensor_parallel_size=2, **SETTINGS)
    try:
        got = two.generate(prompts, params)
        assert two.engine.scheduler.num_preemptions > 0
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        whole = one.engine.runner.weight_bytes
        for rank, held in enumerate(two.engine.rank_weight_bytes):
            # Half of every split tensor; the norms (whole on each rank) are a few hundred bytes more.
            assert 0.5 * whole <= held <= 0.52 * whole, (rank, held, whole)
    finally:
        two.engine.close()
    assert not any(p.is_alive() for p in two.engine.ranks.procs)


@pytest.mark.slow
def test_seeded_sampling_with_two_ranks_is_one_process_sampling(tiny_llama):
    prompts = random_prompts([7, 19], seed=2)
    params = [
        SamplingParams(max_tokens=10, temperature=0.9, seed=5),
        SamplingParams(max_tokens=10, top_k=20, temperature=1.0, seed=6),
    ]
    want = LLM(tiny_llama[0], **SETTINGS).generate(prompts, params)
    two = LLM(tiny_llama[0], tensor_parallel_size=2, **SETTINGS)
    try:
        assert [o.token_ids for o in two.generate(prompts, params)] == [o.token_ids for o in want]
    finally:
        two.engine.close()


def test_sizes_that_do_not_divide_the_heads_are_refused_by_name(tiny_llama):
    with pytest.raises(
        ConfigError,
        match="tensor_parallel_size=3 does not divide the model's num_attention_heads 4, num_key_value_heads 2",
    ):
        LLMEngine(tiny_llama[0], tensor_parallel_size=3, **SETTINGS)


@pytest.mark.slow
def test_a_killed_rank_ends_the_engine_with_its_name(tiny_llama):
    engine = LLMEngine(tiny_llama[0], tensor_parallel_size=2, **SETTINGS)
    try:
        for p in random_prompts([10] * 4, seed=1):
            engine.add_request(p, SamplingParams(max_tokens=100, ignore_eos=True))
        engine.step()
        victim = engine.ranks.procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError, match=rf"tensor-parallel rank 1 \(pid {victim.pid}\) died"):
            while engine.has_unfinished():
                engine.step()
        # Seen by the failed collective, not by its timeout: well under COLLECTIVE_TIMEOUT, with the
        # margin a loaded machine needs.
        assert time.monotonic() - start < COLLECTIVE_TIMEOUT.total_seconds() / 2
    finally:
        engine.close()
    assert not victim.is_alive()


UNGUARDED_SCRIPT = """
from sut import LLM
llm = LLM({model!r}, tensor_parallel_size=2, **{settings!r})  # no `if __name__ == "__main__":`
print("started")
llm.engine.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tensor_parallel_size=2", "data_parallel_size=2"])
def test_a_script_without_the_main_guard_is_told_what_to_do(tiny_llama, tmp_path, kind):
    """Spawned workers re-import the main script; without the guard each dies before its own code
    runs. The parent says so naming the guard (not torch's store timeout a minute later), and
    leaves no worker behind."""
    script = tmp_path / "unguarded.py"
    code = UNGUARDED_SCRIPT.format(model=str(tiny_llama[0]), settings=SETTINGS)
    script.write_text(code.replace("tensor_parallel_size=2", kind))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=COLLECTIVE_TIMEOUT.total_seconds() * 3,
    )
    assert done.returncode == 1 and "started" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("sut.errors.WorkerError: ") and 'if __name__ == "__main__":' in last, last
    assert "before it reached its own code" in last and "DistStoreError" not in done.stderr
