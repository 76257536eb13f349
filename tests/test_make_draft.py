"""`python -m sut.tools.make_draft`: a draft of a target's first N layers loads in the engine, computes what
transformers computes for the target cut to those layers, keeps the CPU backend's GGUF blocks of its
tensors and the target's tokenizer files, and a user's mistake ends in one `error:` line."""

import json
import shutil
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from sut import LLM, SamplingParams
from sut.config import ModelConfig
from sut.cpu.quant import GGUF_BLOCKS_FILE, BlockQuantLinear
from sut.errors import ConfigError
from sut.model.checksums import read_sums, verify_folder
from sut.tools.make_draft import DRAFT_KEY, cli, make_draft
from tests.helpers import TINY_CONFIG, hf_greedy, random_prompts
from tests.test_cli_errors import assert_one_error_line, run_cli
from tests.test_cpu_quant import prefill_metadata

TINY_LAYERS = TINY_CONFIG["num_hidden_layers"] - 1


def tensors(path):
    with safe_open(path, framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def truncated(folder, layers):
    """transformers' model of `folder`, cut to its first `layers` decoder layers."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return model


@pytest.fixture(scope="module")
def tiny_draft(tiny_llama, tmp_path_factory):
    return make_draft(tiny_llama[0], TINY_LAYERS, tmp_path_factory.mktemp("tiny-draft") / "draft")


def test_tiny_draft_holds_the_first_layers_and_a_config_that_says_so(tiny_llama, tiny_draft):
    target = tiny_llama[0]
    source, draft = tensors(target / "model.safetensors"), tensors(tiny_draft / "model.safetensors")
    kept = {n for n in source if not n.startswith("model.layers.") or int(n.split(".")[2]) < TINY_LAYERS}
    assert set(draft) == kept and {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} < kept
    assert all(draft[n].dtype == source[n].dtype and torch.equal(draft[n], source[n]) for n in kept)
    config, original = (json.loads((f / "config.json").read_text()) for f in (tiny_draft, target))
    assert config.pop(DRAFT_KEY) == {
        "target": str(target),
        "layers": TINY_LAYERS,
        "target_layers": TINY_CONFIG["num_hidden_layers"],
    }
    assert config == {**original, "num_hidden_layers": TINY_LAYERS}
    assert ModelConfig.from_folder(tiny_draft).num_layers == TINY_LAYERS
    assert sorted(p.name for p in tiny_draft.iterdir()) == [
        "SHA256SUMS",
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    assert not list(tiny_draft.parent.glob(".draft.*"))  # the folder it was written in is gone


def test_tiny_draft_matches_transformers_cut_to_its_layers(tiny_llama, tiny_draft):
    reference = truncated(tiny_llama[0], TINY_LAYERS)
    llm = LLM(str(tiny_draft), device="cpu", num_kv_blocks=64)
    prompts = random_prompts([7, 30, 1], seed=21)
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=16))]
    assert got == [hf_greedy(reference, p, 16) for p in prompts]
    assert got != [hf_greedy(tiny_llama[1], p, 16) for p in prompts]  # the whole target's: not what is compared
    model = llm.engine.runner.model
    assert len(model.model.layers) == TINY_LAYERS
    prompt = prompts[1]
    with torch.no_grad():
        want = reference(torch.tensor([prompt])).logits[0]
    logits = model.compute_logits(model(torch.tensor(prompt), torch.arange(len(prompt)), prefill_metadata(len(prompt))))
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)


def test_sharded_bf16_target_and_a_previous_draft_replaced(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_CONFIG, "num_hidden_layers": 3, "tie_word_embeddings": True}))
    model.to(torch.bfloat16).save_pretrained(tmp_path / "target", max_shard_size="100KB")
    assert (tmp_path / "target" / "model.safetensors.index.json").is_file()
    out = make_draft(tmp_path / "target", 2, tmp_path / "draft")
    draft = tensors(out / "model.safetensors")
    assert {t.dtype for t in draft.values()} == {torch.bfloat16} and "model.layers.1.mlp.up_proj.weight" in draft
    assert not any(n.startswith("model.layers.2.") for n in draft) and "lm_head.weight" not in draft
    assert sorted(p.name for p in out.iterdir()) == [
        "SHA256SUMS",
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    assert (
        LLM(out, device="cpu", num_kv_blocks=16, dtype="float32")
        .generate([5, 6, 7], SamplingParams(max_tokens=4))[0]
        .token_ids
    )
    make_draft(tmp_path / "target", 1, out)  # over a previous draft: replaced
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    assert not any(n.startswith("model.layers.1.") for n in tensors(out / "model.safetensors"))


def test_an_out_folder_that_is_not_a_draft_is_refused(tiny_llama, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty and not a draft"):
        make_draft(tiny_llama[0], 1, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    with pytest.raises(ConfigError, match="is the target folder itself"):
        make_draft(tiny_llama[0], 1, tiny_llama[0])


@pytest.fixture(scope="module")
def smollm2_draft(smollm2_dir, tmp_path_factory):
    start = time.perf_counter()
    out = make_draft(smollm2_dir, 4, tmp_path_factory.mktemp("smollm2-draft") / "L4")
    print(f"SmolLM2 L4 draft written in {time.perf_counter() - start:.2f} s")
    return out


def test_smollm2_draft_keeps_its_layers_blocks_and_tokenizer(smollm2_dir, smollm2_draft):
    assert ModelConfig.from_folder(smollm2_draft).num_layers == 4
    with safe_open(smollm2_dir / GGUF_BLOCKS_FILE, framework="pt") as f:
        target_formats = json.loads(f.metadata()["formats"])
        kept = {n for n in f.keys() if not n.startswith("model.layers.") or int(n.split(".")[2]) < 4}
    with safe_open(smollm2_draft / GGUF_BLOCKS_FILE, framework="pt") as f:
        assert set(f.keys()) == kept
        assert json.loads(f.metadata()["formats"]) == {n: target_formats[n] for n in kept}
    assert "model.embed_tokens.weight" in kept and len(kept) == 1 + 4 * 7
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (smollm2_draft / name).read_bytes() == (smollm2_dir / name).read_bytes(), name
    assert not (smollm2_draft / ".converted").exists()
    sums = read_sums(smollm2_draft)  # the draft's own files, which the engine checks before loading it
    assert set(sums) == {
        p.relative_to(smollm2_draft).as_posix()
        for p in smollm2_draft.rglob("*")
        if p.is_file() and p.name != "SHA256SUMS"
    }
    assert verify_folder(smollm2_draft) == sum((smollm2_draft / name).stat().st_size for name in sums)


def test_smollm2_draft_runs_on_its_gguf_blocks(smollm2_draft):
    llm = LLM(smollm2_draft, kv_cache_memory_gb=0.05, max_model_len=512)  # default CPU settings: blocks on
    model = llm.engine.runner.model
    assert len(model.model.layers) == 4
    assert sum(isinstance(m, BlockQuantLinear) for m in model.modules()) == 4 * 4 + 1  # + the tied LM head
    assert len(llm.generate("The capital of France is", SamplingParams(max_tokens=4))[0].token_ids) == 4


def run_in_process(monkeypatch, capsys, *args):
    """What `python -m sut.tools.make_draft ARGS` does, without starting a Python: its stderr and exit status."""
    monkeypatch.setattr(sys, "argv", ["make_draft", *map(str, args)])
    with pytest.raises(SystemExit) as exit:
        cli()
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=exit.value.code, stdout=out, stderr=err)


@pytest.mark.slow
def test_cli_missing_target(tmp_path):
    done = run_cli("sut.tools.make_draft", "--target", tmp_path / "none", "--layers", 1, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert_one_error_line(done, f"{tmp_path / 'none'}: no such model folder")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layers", [0, TINY_CONFIG["num_hidden_layers"], -1])
def test_cli_layers_out_of_range(tiny_llama, tmp_path, monkeypatch, capsys, layers):
    done = run_in_process(monkeypatch, capsys, "--target", tiny_llama[0], "--layers", layers, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert_one_error_line(done, f"--layers {layers} is out of range", f"keeps 1 to {TINY_LAYERS} of them")
    assert not (tmp_path / "out").exists()


def test_cli_no_config_and_unsupported_model(tiny_llama, tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    done = run_in_process(monkeypatch, capsys, "--target", tmp_path / "empty", "--layers", 1, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert_one_error_line(done, "no config.json in the model folder")
    shutil.copytree(tiny_llama[0], tmp_path / "gpt2")
    config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    done = run_in_process(monkeypatch, capsys, "--target", tmp_path / "gpt2", "--layers", 1, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert_one_error_line(done, "architecture ['GPT2LMHeadModel'] is not supported")
    assert not (tmp_path / "out").exists()
