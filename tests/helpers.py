"""What several test files share (imported after conftest.py has set TRITON_INTERPRET): the C
kernels' levels this CPU runs, the tiny Llama's config, SmolLM2's folder, random prompts,
transformers' greedy output, the tiny model with a dataset of its own outputs, and a LoadGen detail
log with values changed."""

import json
import os
from pathlib import Path

import torch

from compliance.loadgen_logs import MLLOG_MARKER
from sut.cpu.build import runnable_levels
from systems.schema import saaf_cache

# The C kernels' instruction-set levels this CPU runs, for the tests that run each one
# (tests/test_cpu_build.py names, as a skip, the levels it cannot run).
LEVELS = runnable_levels()

SMOLLM2_DIR = Path(
    os.environ.get(
        "SAAF_MODEL_DIR",
        saaf_cache() / "models" / "smollm2-135m-instruct",
    )
)

TINY_CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    # Large random weights give well-separated logits, so greedy ties cannot hide a real difference.
    initializer_range=0.3,
)


def random_prompts(lengths, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Ids from 3 up: 0-2 are pad/bos/eos in the tiny config.
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def process_alive(pid: int) -> bool:
    """Whether process `pid` is running (Linux /proc; a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def hf_greedy(model, prompt, max_new_tokens, eos_token_id=2):
    """transformers' greedy continuation of one unpadded prompt, cut after the first EOS."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
        )
    return out[0, len(prompt) :].tolist()


def tiny_model_and_dataset(tiny_folder, root, num_samples, seed):
    """The tiny Llama under root/tiny-llama with SmolLM2's tokenizer, and a dataset root/data.json of
    random prompts whose references are the model's own greedy outputs (so ROUGE is high: not 100, a
    sample of only special tokens decodes to nothing). Returns (model folder, prompts, references,
    dataset path)."""
    import json
    import shutil

    from sut import LLM, SamplingParams

    model_dir = root / "tiny-llama"
    shutil.copytree(tiny_folder, model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(SMOLLM2_DIR / name, model_dir / name)
    prompts = random_prompts([5 + (i * 7) % 40 for i in range(num_samples)], seed=seed)
    llm = LLM(model_dir, num_kv_blocks=2048)
    references = [o.text for o in llm.generate(prompts, SamplingParams(max_tokens=128, min_tokens=1))]
    dataset = root / "data.json"
    dataset.write_text(json.dumps([{"tok_input": p, "output": r} for p, r in zip(prompts, references)]))
    return model_dir, prompts, references, dataset


def set_detail_values(path: Path, values: dict) -> None:
    """The LoadGen detail log at `path` with every entry of each key of `values` set to its value,
    as a run of another mode, scenario or benchmark logs it."""
    lines = []
    for line in Path(path).read_text().splitlines():
        if line.startswith(MLLOG_MARKER):
            entry = json.loads(line[len(MLLOG_MARKER) :])
            if entry["key"] in values:
                line = MLLOG_MARKER + " " + json.dumps({**entry, "value": values[entry["key"]]})
        lines.append(line)
    Path(path).write_text("\n".join(lines) + "\n")
