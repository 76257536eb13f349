"""DeepSeek-V3 over 2 tensor-parallel processes on gloo (sut/parallel/): latent attention split by
heads (the latent cache whole on each rank), routed experts by expert (expert parallelism), shared
experts and dense MLPs by features. Greedy output token-identical to one process's on the tiny
configurations (with and without the query bottleneck, dense-first layers, YaRN), with chunked
prefill and preemption; each rank reads only its own experts' tensors; what does not split is
refused by name. Ranks started by torchrun (sut/worker/torchrun_entry.py) generate as one process
does, engine after engine; a rank killed under torchrun ends the run with an error, not a hang."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from sut import LLM, LLMEngine, SamplingParams
from sut.config import ModelConfig
from sut.errors import ConfigError
from sut.model import loader
from sut.parallel import COLLECTIVE_TIMEOUT, Shard, free_port, join_torchrun
from systems.schema import REPO
from tests.helpers import process_alive, random_prompts
from tests.test_deepseek_v3 import CONFIGS, DEEPSEEK_TINY, tiny_deepseek
from tests.test_gpt_oss import GPT_OSS_TINY
from tests.test_mtp import near_bigram, write_target

# A small pool and step budget: prompts go in chunks (steps mixing absorbed decodes with
# decompressed chunks), and sequences are preempted.
SETTINGS = dict(
    num_kv_blocks=24, block_size=4, max_model_len=64, max_num_batched_tokens=24, max_num_seqs=8, device="cpu"
)
PROMPTS = random_prompts([1, 5, 17, 33, 48, 7], seed=3)
PARAMS = SamplingParams(max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module", params=list(CONFIGS))
def tiny(request, tmp_path_factory):
    """A tiny DeepSeek folder, one process's greedy tokens and the weight bytes it holds."""
    folder = tmp_path_factory.mktemp(request.param)
    tiny_deepseek(folder, seed=len(request.param), **CONFIGS[request.param])
    one = LLM(folder, **SETTINGS)
    want = [o.token_ids for o in one.generate(PROMPTS, PARAMS)]
    assert one.engine.scheduler.num_preemptions > 0, "the pool is small enough to preempt"
    return folder, want, one.engine.runner.weight_bytes


@pytest.mark.slow
def test_two_ranks_give_one_process_greedy_tokens(tiny):
    folder, want, whole = tiny
    two = LLM(folder, tensor_parallel_size=2, **SETTINGS)
    try:
        assert [o.token_ids for o in two.generate(PROMPTS, PARAMS)] == want
        assert two.engine.scheduler.num_preemptions > 0
        held = two.engine.rank_weight_bytes
        # Half the experts, heads, features and vocabulary each; the router, the latent projections
        # and the norms whole on both.
        assert held[0] == held[1] and 0.5 * whole < held[0] < 0.65 * whole, (held, whole)
    finally:
        two.engine.close()
    assert not any(p.is_alive() for p in two.engine.ranks.procs)


def test_each_rank_reads_only_its_own_experts(tiny, monkeypatch):
    """A rank opens only its experts' tensors (experts [r * E/2, (r + 1) * E/2)) and holds them
    stacked in order, with its heads' rows of kv_b_proj and the latent projection whole;
    random_model's ranks hold exactly their experts of the whole model's, and the whole router."""
    folder = tiny[0]
    config = ModelConfig.from_folder(folder)
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    read = []
    read_shard = loader.read_shard
    monkeypatch.setattr(loader, "read_shard", lambda f, name, shard: read.append(name) or read_shard(f, name, shard))
    experts, half = config.moe.num_experts, config.moe.num_experts // 2
    layer = config.moe.first_dense_layers
    prefix = f"model.layers.{layer}.mlp.experts"
    whole = loader.random_model(config, torch.float32, torch.device("cpu"))
    for rank in range(2):
        read.clear()
        model = loader.load_model(folder, config, torch.float32, torch.device("cpu"), Shard(rank, 2))
        held = {int(n.split(".")[5]) for n in read if ".mlp.experts." in n}
        assert held == set(range(rank * half, (rank + 1) * half))
        stacked = model.model.layers[layer].mlp.experts
        assert stacked.gate_up_proj.shape[0] == half
        for local in (0, half - 1):
            e = rank * half + local
            assert torch.equal(
                stacked.gate_up_proj[local, : stacked.down_proj.shape[2]], tensors[f"{prefix}.{e}.gate_proj.weight"]
            )
            assert torch.equal(stacked.down_proj[local], tensors[f"{prefix}.{e}.down_proj.weight"])
        # Latent attention: this rank's heads' rows of kv_b_proj; the latent's projection whole.
        attn, at = model.model.layers[0].self_attn, "model.layers.0.self_attn"
        rows = attn.kv_b_proj.weight.shape[0]
        assert torch.equal(attn.kv_b_proj.weight, tensors[f"{at}.kv_b_proj.weight"][rank * rows : (rank + 1) * rows])
        latent = tensors[f"{at}.kv_a_proj_with_mqa.weight"]
        assert torch.equal(attn.input_proj.weight[-latent.shape[0] :], latent)
        part = loader.random_model(config, torch.float32, torch.device("cpu"), shard=Shard(rank, 2))
        mine, theirs = part.model.layers[layer].mlp, whole.model.layers[layer].mlp
        assert torch.equal(mine.experts.down_proj, theirs.experts.down_proj[rank * half : (rank + 1) * half])
        assert torch.equal(mine.gate.weight, theirs.gate.weight) and mine.gate.weight.shape[0] == experts


def config_folder(folder, config) -> str:
    """A folder holding only `config` (settings are refused before any weight is read)."""
    config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
    config.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "change, size, message",
    [
        (
            dict(n_routed_experts=9, n_group=3),
            2,
            "tensor_parallel_size=2 does not divide the model's n_routed_experts 9",
        ),
        (
            dict(n_shared_experts=3, moe_intermediate_size=30),
            4,
            "tensor_parallel_size=4 does not divide the model's n_shared_experts x moe_intermediate_size 90",
        ),
        (
            dict(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
            2,
            r"tensor_parallel_size=2: a rank's slice of the FP8 checkpoint's weights must be whole 128x128 scale "
            r"blocks; not a multiple of 128: q_b_proj rows \(num_attention_heads 4 x 48 / 2\) = 96, ",
        ),
    ],
)
def test_what_does_not_split_is_refused_by_name(tmp_path, change, size, message):
    from transformers import DeepseekV3Config

    folder = config_folder(tmp_path, DeepseekV3Config(**{**DEEPSEEK_TINY, **change}))
    with pytest.raises(ConfigError, match=message):
        LLMEngine(folder, tensor_parallel_size=size, **SETTINGS)


def test_gpt_oss_still_runs_one_replica_per_gpu(tmp_path):
    from transformers import GptOssConfig

    folder = config_folder(tmp_path, GptOssConfig(**GPT_OSS_TINY))
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2: a mixture-of-experts model \(GptOssForCausalLM\)"):
        LLMEngine(folder, tensor_parallel_size=2, **SETTINGS)


# ---- torchrun ----------------------------------------------------------------------------------

GENERATE_SCRIPT = """
import json, sys
from sut import LLM, SamplingParams
from sut.errors import ConfigError
out, prompts, *engines = sys.argv[1:]  # folder, its own settings as JSON, folder, ...
settings = {settings!r}
result = {{"outputs": [], "weights": []}}
try:
    LLM(engines[0], **settings)
except ConfigError as e:
    result["one_rank"] = str(e)
for folder, own in zip(engines[::2], engines[1::2]):  # engine after engine on the same ranks
    llm = LLM(folder, tensor_parallel_size=2, **settings, **json.loads(own))
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    result["outputs"].append([o.token_ids for o in llm.generate(json.loads(prompts), params)])
    result["weights"].append(llm.engine.rank_weight_bytes)
    llm.engine.close()
with open(out, "w") as f:
    json.dump(result, f)
"""

KILLED_SCRIPT = """
import sys, time
from sut import LLMEngine, SamplingParams
from tests.helpers import random_prompts
folder, ready = sys.argv[1:]
engine = LLMEngine(folder, tensor_parallel_size=2, **{settings!r})
for p in random_prompts([10] * 4, seed=1):
    engine.add_request(p, SamplingParams(max_tokens=240, ignore_eos=True))
engine.step()
open(ready, "w").close()
deadline = time.monotonic() + 120
while engine.has_unfinished() and time.monotonic() < deadline:
    engine.step()
print("the engine outlived its killed rank")
"""


def torchrun(script, *args, wait=True):
    """`torchrun --nproc-per-node 2 -m sut.worker.torchrun_entry script args` on this host, by
    torchrun's launcher module: (exit status, output), or with `wait=False` the running launcher."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "sut.worker.torchrun_entry",
        str(script),
        *map(str, args),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return launcher
    try:
        output = launcher.communicate(timeout=180)[0]
    finally:
        stop(launcher)
    return launcher.returncode, output


def stop(launcher: subprocess.Popen) -> None:
    """End torchrun's launcher if it still runs: SIGTERM, on which its agent ends the ranks."""
    if launcher.poll() is None:
        launcher.terminate()
        try:
            launcher.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.communicate()


@pytest.mark.slow
def test_torchrun_ranks_generate_as_one_process(tiny_llama, tmp_path):
    """DeepSeek, Llama, then DeepSeek drafting with its MTP module (on both ranks), on the two ranks
    torchrun started; an engine of one rank is refused by name."""
    deepseek = tmp_path / "deepseek"
    tiny_deepseek(deepseek, seed=5)
    with_module = write_target(tmp_path / "with-mtp", seed=2, craft=near_bigram(0.005, 0.01))
    engines = [(deepseek, {}), (tiny_llama[0], {}), (with_module.folder, {"speculative_config": with_module.spec(3)})]
    want = [[o.token_ids for o in LLM(f, **SETTINGS).generate(PROMPTS, PARAMS)] for f, _ in engines]
    script, out = tmp_path / "generate.py", tmp_path / "out.json"
    script.write_text(GENERATE_SCRIPT.format(settings=SETTINGS))
    status, output = torchrun(
        script, out, json.dumps(PROMPTS), *[x for f, own in engines for x in (f, json.dumps(own))]
    )
    assert status == 0, output
    result = json.loads(out.read_text())
    assert result["outputs"] == want
    assert all(a == b for a, b in result["weights"])
    assert "under torchrun an engine's tensor-parallel ranks are the 2 processes torchrun started" in result["one_rank"]


@pytest.mark.slow
def test_a_failing_program_under_torchrun_releases_the_other_rank(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("raise ValueError('the program failed')\n")
    start = time.monotonic()
    status, output = torchrun(script)
    assert status != 0 and "ValueError: the program failed" in output
    assert time.monotonic() - start < COLLECTIVE_TIMEOUT.total_seconds() / 2


def torchrun_ranks(launcher: int) -> dict[int, int]:
    """{RANK: pid} of the processes torchrun's launcher (pid `launcher`) started."""
    ranks = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launcher:
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if b"RANK" in env:
            ranks[int(env[b"RANK"])] = int(entry)
    return ranks


@pytest.mark.slow
def test_a_killed_rank_under_torchrun_ends_the_run(tiny_llama, tmp_path):
    script, ready = tmp_path / "killed.py", tmp_path / "ready"
    script.write_text(KILLED_SCRIPT.format(settings={**SETTINGS, "num_kv_blocks": 256, "max_model_len": 256}))
    launcher = torchrun(script, tiny_llama[0], ready, wait=False)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), launcher.communicate()[0] if launcher.poll() is not None else "no step in 120 s"
        ranks = torchrun_ranks(launcher.pid)
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGKILL)
        start = time.monotonic()
        output = launcher.communicate(timeout=COLLECTIVE_TIMEOUT.total_seconds() / 2)[0]
        assert time.monotonic() - start < COLLECTIVE_TIMEOUT.total_seconds() / 2
    finally:
        stop(launcher)
    assert launcher.returncode != 0 and "the engine outlived" not in output
    assert f"pid: {ranks[1]}" in output, output  # torchrun's report names the killed rank
    deadline = time.monotonic() + 10
    while any(process_alive(pid) for pid in ranks.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(pid) for pid in ranks.values())


def test_the_entry_outside_torchrun_names_what_is_missing(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set: torchrun"):
        join_torchrun()
