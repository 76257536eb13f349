"""Bad input gets a clear error naming what was wrong; in the online engine it fails alone."""

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sut import LLM, CheckpointError, ConfigError, InvalidRequestError, LLMEngine, SamplingParams, UnsupportedModelError
from sut.errors import WorkerError
from tests.helpers import random_prompts

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(tiny_llama[0], num_kv_blocks=64, max_model_len=128)


@pytest.mark.slow
def test_empty_prompt(engine):
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        engine.add_request([])


def test_prompt_longer_than_model_maximum(engine):
    with pytest.raises(InvalidRequestError, match=r"prompt has 128 tokens; the maximum is 127"):
        engine.add_request([5] * 128)


@pytest.mark.parametrize("bad", [256, -1, 10**9])
def test_token_id_outside_vocabulary(engine, bad):
    with pytest.raises(
        InvalidRequestError, match=rf"token id {bad} at position 2 is outside the vocabulary \[0, 256\)"
    ):
        engine.add_request([5, 6, bad, 7])


@pytest.mark.parametrize("bad", [1.5, "7", None, True])
def test_token_that_is_not_an_integer(engine, bad):
    with pytest.raises(InvalidRequestError, match="at position 1 is not an integer token id"):
        engine.add_request([5, bad])


def test_integer_like_token_ids_are_accepted(engine):
    """numpy and 0-d torch integers are token ids: taken as plain ints (what the cache and the
    scheduler index with), and the request runs."""
    import numpy as np
    import torch

    seq = engine.make_sequence([np.int64(5), torch.tensor(6), 7], SamplingParams(max_tokens=1))
    assert seq.prompt_token_ids == [5, 6, 7] and all(type(t) is int for t in seq.prompt_token_ids)
    rid = engine.add_request([np.int64(5), torch.tensor(6), 7], SamplingParams(max_tokens=1))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    [out] = outputs
    assert out.request_id == rid and out.finish_reason == "length" and len(out.token_ids) == 1


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_max_tokens_below_one(max_tokens):
    with pytest.raises(InvalidRequestError, match=rf"max_tokens must be an integer >= 1, got {max_tokens}"):
        SamplingParams(max_tokens=max_tokens)


def test_bad_sampling_values():
    with pytest.raises(InvalidRequestError, match=r"top_p must be a number in \(0, 1\] \(1: off\), got 0"):
        SamplingParams(top_p=0)
    with pytest.raises(InvalidRequestError, match=r"temperature must be a finite number >= 0 \(0: greedy\), got -1"):
        SamplingParams(temperature=-1)


def test_text_prompt_without_tokenizer(engine):
    with pytest.raises(InvalidRequestError, match="needs a tokenizer"):
        engine.add_request("hello")


def copy_model(tiny_llama, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama[0], folder)
    return folder


def test_missing_safetensors(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors checkpoint"):
        LLM(folder)


def test_truncated_safetensors(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: not a readable safetensors file, truncated or corrupt"
    ):
        LLM(folder)


def test_missing_shard(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="missing: \\['model-00001-of-00002.safetensors'\\]"):
        LLM(folder)


def test_tensor_shape_mismatch(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"'model.layers.0.mlp.\w+_proj.weight' has shape"):
        LLM(folder)


def test_unsupported_architecture(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=r"architecture \['GPT2LMHeadModel'\] is not supported"):
        LLM(folder)


def test_malformed_config(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not valid JSON"):
        LLM(folder)
    config = json.loads((tiny_llama[0] / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="missing required key 'hidden_size'"):
        LLM(folder)


def test_missing_model_folder(tmp_path):
    with pytest.raises(CheckpointError, match="model folder does not exist"):
        LLM(tmp_path / "nowhere")


def test_unknown_or_bad_engine_setting(tiny_llama):
    with pytest.raises(ConfigError, match=r"unknown engine setting\(s\) \['max_batch'\]"):
        LLM(tiny_llama[0], max_batch=3)
    with pytest.raises(ConfigError, match="block_size must be a power of two, got 12"):
        LLM(tiny_llama[0], block_size=12)
    with pytest.raises(ConfigError, match="cannot hold one sequence"):
        LLM(tiny_llama[0], num_kv_blocks=2, block_size=4)
    for bad in (0, -5, "88", True):
        with pytest.raises(ConfigError, match="tpot_target_ms must be a positive finite number"):
            LLM(tiny_llama[0], tpot_target_ms=bad)
    with pytest.raises(ConfigError, match="tpot_cap_ms and ttft_patience_ms go together"):
        LLM(tiny_llama[0], tpot_target_ms=88, tpot_cap_ms=96)
    with pytest.raises(ConfigError, match=r"tpot_cap_ms \(80\) needs a tpot_target_ms at most as large, got 88"):
        LLM(tiny_llama[0], tpot_target_ms=88, tpot_cap_ms=80, ttft_patience_ms=500)
    with pytest.raises(ConfigError, match="ttft_patience_ms must be a positive finite number"):
        LLM(tiny_llama[0], tpot_target_ms=88, tpot_cap_ms=96, ttft_patience_ms=-1)
    with pytest.raises(ConfigError, match="cpu.quantized_weights must be true or false, got 'yes'"):
        LLM(tiny_llama[0], cpu={"quantized_weights": "yes"})
    with pytest.raises(ConfigError, match="cpu.int16_activations must be true or false, got 1"):
        LLM(tiny_llama[0], cpu={"int16_activations": 1})
    with pytest.raises(ConfigError, match="cpu.int16_activations needs cpu.quantized_weights"):
        LLM(tiny_llama[0], cpu={"int16_activations": True, "quantized_weights": False})
    with pytest.raises(ConfigError, match=r"unknown engine setting\(s\) \['cpu.int8'\]"):
        LLM(tiny_llama[0], cpu={"int8": True})
    with pytest.raises(ConfigError, match="engine setting cpu must be an object"):
        LLM(tiny_llama[0], cpu=True)
    for old in ("gguf_blocks", "int16_activations"):  # the spelling before the cpu object
        with pytest.raises(ConfigError, match=rf"unknown engine setting\(s\) \['{old}'\]"):
            LLM(tiny_llama[0], **{old: True})


def test_generate_validates_everything_before_running(tiny_llama):
    llm = LLM(tiny_llama[0], num_kv_blocks=64)
    with pytest.raises(InvalidRequestError, match="prompt 1 of 2: prompt is empty"):
        llm.generate([[5, 6], []])
    assert not llm.engine.has_unfinished()


def test_a_stop_token_outside_the_vocabulary_is_refused_up_front(tiny_llama):
    """It used to pass validation and then raise IndexError inside a step (the sampler masks stop
    tokens by index under min_tokens), and every later generate() on that LLM raised it again."""
    llm = LLM(tiny_llama[0], num_kv_blocks=64)
    prompts = random_prompts([6, 9])
    poison = SamplingParams(stop_token_ids=[10**6], min_tokens=2)
    with pytest.raises(InvalidRequestError, match=r"prompt 1 of 2: stop token id 1000000 is outside the vocabulary"):
        llm.generate(prompts, [SamplingParams(), poison])
    assert not llm.engine.has_unfinished()
    fresh = LLM(tiny_llama[0], num_kv_blocks=64).generate(prompts, SamplingParams(max_tokens=8))
    assert [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=8))] == [o.token_ids for o in fresh]


def test_a_step_that_raises_fails_that_call_alone(tiny_llama, monkeypatch):
    """A fault inside a step gives the requests in flight error outputs (one that finished before it
    keeps its own), in input order; the next call on the same LLM is answered as a fresh one's."""
    import sut.worker.model_runner

    llm = LLM(tiny_llama[0], num_kv_blocks=64)
    prompts = random_prompts([6, 13, 4])
    params = [
        SamplingParams(max_tokens=10, ignore_eos=True),
        SamplingParams(max_tokens=2, ignore_eos=True),
        SamplingParams(max_tokens=10, ignore_eos=True),
    ]
    sample, calls = sut.worker.model_runner.sample, []

    def sample_failing_at_the_fourth(*args):
        calls.append(1)
        if len(calls) == 4:  # the short request has finished; the others hold KV blocks mid-decode
            raise RuntimeError("injected fault")
        return sample(*args)

    monkeypatch.setattr(sut.worker.model_runner, "sample", sample_failing_at_the_fourth)
    outputs = llm.generate(prompts, params)
    assert [o.finish_reason for o in outputs] == ["error", "length", "error"]
    assert outputs[0].error == "engine step failed: RuntimeError('injected fault')" == outputs[2].error
    assert len(outputs[1].token_ids) == 2
    assert not llm.engine.has_unfinished() and llm.engine.block_manager.num_free_blocks == 64
    monkeypatch.setattr(sut.worker.model_runner, "sample", sample)
    fresh = LLM(tiny_llama[0], num_kv_blocks=64).generate(prompts, params)
    again = llm.generate(prompts, params)
    assert [o.token_ids for o in again] == [o.token_ids for o in fresh]
    assert all(o.finish_reason == "length" for o in again)


def test_a_fault_in_execute_fails_the_call_and_a_dead_worker_stays_fatal(tiny_llama, monkeypatch):
    llm = LLM(tiny_llama[0], num_kv_blocks=64)
    prompt = random_prompts([7])[0]
    execute = llm.engine.runner.execute

    def explode(step):
        raise RuntimeError("device fault")

    monkeypatch.setattr(llm.engine.runner, "execute", explode)
    [out] = llm.generate(prompt, SamplingParams(max_tokens=5))
    assert out.finish_reason == "error" and "RuntimeError('device fault')" in out.error

    def die(step):
        raise WorkerError("tensor-parallel rank 1 (pid 1) died (exit code -9)")

    monkeypatch.setattr(llm.engine.runner, "execute", die)
    with pytest.raises(WorkerError, match="rank 1"):
        llm.generate(prompt, SamplingParams(max_tokens=5))
    monkeypatch.setattr(llm.engine.runner, "execute", execute)
    llm.engine.fail_all("stopped")  # what the caller of a fatal error does before it goes on
    [out] = llm.generate(prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def run_until_done(engine):
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] = out
    return outputs


def test_online_bad_request_fails_alone(tiny_llama):
    engine = LLMEngine(tiny_llama[0], num_kv_blocks=64)
    prompts = random_prompts([6, 20, 11])
    reference = LLM(tiny_llama[0], num_kv_blocks=64).generate(prompts, SamplingParams(max_tokens=10))
    ids = [engine.add_request(prompts[0], SamplingParams(max_tokens=10))]
    with pytest.raises(InvalidRequestError):
        engine.add_request([3, 999])
    ids.append(engine.add_request(prompts[1], SamplingParams(max_tokens=10)))

    def explode(token):
        raise RuntimeError("client went away")

    bad = engine.add_request(prompts[2], SamplingParams(max_tokens=10), on_token=explode)
    ids.append(engine.add_request(prompts[2], SamplingParams(max_tokens=10)))
    outputs = run_until_done(engine)
    assert outputs[bad].finish_reason == "error" and "client went away" in outputs[bad].error
    assert [outputs[i].token_ids for i in ids] == [r.token_ids for r in reference]
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == 64


def test_abort_and_duplicate_id(tiny_llama):
    engine = LLMEngine(tiny_llama[0], num_kv_blocks=64)
    a = engine.add_request([5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True), request_id="a")
    with pytest.raises(InvalidRequestError, match="request id 'a' is already in use"):
        engine.add_request([5], request_id="a")
    b = engine.add_request([8, 9], SamplingParams(max_tokens=5, ignore_eos=True), request_id="b")
    engine.step()
    engine.step()
    engine.abort(a)
    outputs = run_until_done(engine)
    assert outputs[a].finish_reason == "abort" and len(outputs[a].token_ids) == 2
    assert outputs[b].finish_reason == "length" and len(outputs[b].token_ids) == 5
    assert engine.block_manager.num_free_blocks == 64


def test_requests_from_another_thread(tiny_llama):
    """A client thread adds requests while the engine loop runs in this one; all finish, each token
    reaches its callback as it is sampled, in order."""
    engine = LLMEngine(tiny_llama[0], num_kv_blocks=64)
    prompts = random_prompts([4, 9, 15, 30, 2, 12])
    seen = {i: [] for i in range(len(prompts))}

    def client():
        for i, p in enumerate(prompts):
            engine.add_request(p, SamplingParams(max_tokens=8), request_id=i, on_token=seen[i].append)

    thread = threading.Thread(target=client)
    thread.start()
    outputs = {}
    while thread.is_alive() or engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] = out
    thread.join()
    reference = LLM(tiny_llama[0], num_kv_blocks=64).generate(prompts, SamplingParams(max_tokens=8))
    assert sorted(outputs) == list(range(len(prompts)))
    for i, ref in enumerate(reference):
        assert outputs[i].token_ids == ref.token_ids == seen[i]


@pytest.mark.parametrize(
    "command",
    [
        ["sut.bench.throughput", "--model", "MISSING", "--skip-hf"],
        ["sut.bench.steps", "--model", "MISSING"],
        ["sut.bench.steps", "--model", "TINY", "--int16", "--no-quantized-weights"],
    ],
)
@pytest.mark.slow
def test_benchmarks_end_a_user_error_in_one_line(command, tiny_llama, tmp_path):
    """A missing model folder or a setting the engine refuses: one `error:` line naming it, exit 2."""
    args = [str(tmp_path / "nope") if a == "MISSING" else str(tiny_llama[0]) if a == "TINY" else a for a in command]
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    want = (
        "model folder does not exist" if "MISSING" in command else "cpu.int16_activations needs cpu.quantized_weights"
    )
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and want in last, done.stderr


def plant(folder: Path, name: str, value: float) -> None:
    """Set every element of checkpoint tensor `name` in folder's model.safetensors to `value`."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    tensors[name].fill_(value)
    save_file(tensors, path, metadata={"format": "pt"})


def test_logits_that_are_nan_or_inf_fail_the_request(tiny_llama, tmp_path):
    """A norm weight far out of range (finite: NaN and inf in a weight are refused at load) overflows
    the attention scores, and the logits come out NaN: the requests fail by name, rather than every
    output being token 0 (argmax of NaN); greedy and sampled rows alike (multinomial refuses NaN)."""
    from sut.sample.sampler import NONFINITE_LOGITS
    from tests.helpers import hf_greedy

    folder = copy_model(tiny_llama, tmp_path)
    plant(folder, "model.layers.0.input_layernorm.weight", 3e38)
    bad = LLM(folder, num_kv_blocks=64)
    prompts = random_prompts([5, 9])
    outputs = bad.generate(prompts, [SamplingParams(max_tokens=4), SamplingParams(max_tokens=4, temperature=0.8)])
    for out in outputs:
        assert (out.finish_reason, out.error, out.token_ids) == ("error", NONFINITE_LOGITS, [])
    assert not bad.engine.has_unfinished() and bad.engine.block_manager.num_free_blocks == 64
    [good] = LLM(tiny_llama[0], num_kv_blocks=64).generate(prompts[0], SamplingParams(max_tokens=6, ignore_eos=True))
    assert good.token_ids == hf_greedy(tiny_llama[1], prompts[0], 6, eos_token_id=None)


class RepeatProposer:
    """Drafts a sequence's last token k times: every decode verifies k + 1 rows (n-gram lookup drafts
    only now and then on random prompts)."""

    def propose(self, seqs, counts, block_tables=None):
        return [([seq.token_ids[-1]] * k, None) for seq, k in zip(seqs, counts)]


@pytest.mark.parametrize("speculate", [False, True], ids=["sample", "verify"])
def test_a_row_of_bad_logits_fails_its_sequence_alone(tiny_llama, monkeypatch, speculate):
    """One sequence's logits turn NaN mid-decode (with speculation in its last row of several); it
    fails, and the others in the batch go on to the outputs they get without it."""
    from sut.sample.sampler import NONFINITE_LOGITS

    params = {
        "bad": SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=1),
        "greedy": SamplingParams(max_tokens=12, ignore_eos=True),
        "seeded": SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=2),
    }
    prompts = dict(zip(params, random_prompts([5, 9, 4], seed=3)))
    spec = {"method": "ngram", "num_speculative_tokens": 3} if speculate else None

    def engine_for(rids):
        engine = LLMEngine(tiny_llama[0], num_kv_blocks=64, speculative_config=spec)
        if speculate:
            engine.proposer = RepeatProposer()
        for rid in rids:
            engine.add_request(prompts[rid], params[rid], request_id=rid)
        return engine

    engine = engine_for(params)
    schedule, execute, batches, poisoned = engine.scheduler.schedule, engine.runner.execute, [], []

    def scheduled(now):
        batches.append(schedule(now))
        return batches[-1]

    def poison(step):
        logits, row = execute(step), 0
        for seq, k in zip(batches[-1].seqs, batches[-1].num_logits):
            if seq.request_id == "bad" and len(seq.output_token_ids) >= 2 and k:
                logits[row + k - 1, 7] = float("nan")
                poisoned.append(k)
            row += k
        return logits

    monkeypatch.setattr(engine.scheduler, "schedule", scheduled)
    monkeypatch.setattr(engine.runner, "execute", poison)
    outputs = run_until_done(engine)
    assert poisoned == [4 if speculate else 1]
    assert outputs["bad"].finish_reason == "error" and outputs["bad"].error == NONFINITE_LOGITS
    assert len(outputs["bad"].token_ids) >= 2
    expected = run_until_done(engine_for(["greedy", "seeded"]))
    for rid in ("greedy", "seeded"):
        assert outputs[rid].finish_reason == "length" and outputs[rid].token_ids == expected[rid].token_ids
    assert engine.block_manager.num_free_blocks == 64


def write_sums(folder: Path) -> None:
    from sut.model.checksums import sha256_of

    (folder / "SHA256SUMS").write_text(
        "".join(
            f"{sha256_of(p)}  {p.name}\n" for p in sorted(folder.iterdir()) if p.is_file() and p.name != "SHA256SUMS"
        )
    )


def test_a_folder_whose_files_changed_since_its_sha256sums_is_refused(tiny_llama, tmp_path):
    """A changed tensor that would load (a norm weight: finite values, right shape) is caught by the
    folder's SHA256SUMS, which names the file; verify_checksums=false loads it as it is."""
    folder = copy_model(tiny_llama, tmp_path)
    write_sums(folder)
    LLM(folder, num_kv_blocks=16)  # intact: loads
    plant(folder, "model.layers.0.input_layernorm.weight", 0.5)
    with pytest.raises(
        CheckpointError,
        match=rf"{folder}/model.safetensors: its SHA-256 is [0-9a-f]{{64}}, and "
        r"SHA256SUMS says [0-9a-f]{64}: the file changed since it was written",
    ):
        LLM(folder, num_kv_blocks=16)
    with pytest.raises(CheckpointError, match="the file changed since it was written"):  # checked before replicas start
        LLM(folder, num_kv_blocks=16, data_parallel_size=2)
    LLM(folder, num_kv_blocks=16, verify_checksums=False)
    with (folder / "SHA256SUMS").open("a") as f:
        f.write(f"{'0' * 64}  tokenizer.json\n")
    with pytest.raises(CheckpointError, match="SHA256SUMS lists tokenizer.json, which is missing from the folder"):
        LLM(folder, num_kv_blocks=16)
    (folder / "SHA256SUMS").write_text("not a checksum line\n")
    with pytest.raises(CheckpointError, match="SHA256SUMS: line 1 is not '<sha256>  <file in the folder>'"):
        LLM(folder, num_kv_blocks=16)
    (folder / "SHA256SUMS").write_text(f"{'0' * 64}  ../elsewhere\n")
    with pytest.raises(CheckpointError, match="line 1 is not"):
        LLM(folder, num_kv_blocks=16)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_in_a_weight_is_refused_at_load(tiny_llama, tmp_path, value):
    folder = copy_model(tiny_llama, tmp_path)
    plant(folder, "model.norm.weight", value)
    with pytest.raises(
        CheckpointError,
        match=rf"{folder}/model.safetensors: tensor 'model.norm.weight' holds NaN or "
        r"inf values \(a corrupt checkpoint\)",
    ):
        LLM(folder, num_kv_blocks=16)
