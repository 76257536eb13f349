"""A draft model as proposer: any Llama-family folder with the target's tokenizer, run by the
engine's own ModelRunner with a KV cache of its own laid out like the target's, so it computes in
the target's blocks and slots (the scheduler reserved the slots it writes).

`seq.draft_num_computed` counts the tokens whose K/V the draft's cache holds; of them, only those
the target kept are valid (drafts it rejected are not), so each proposal starts by computing the
draft's missing tokens, then samples k drafts one forward at a time. The last draft is never fed
back: the next verification tells which token follows it."""

import json
from pathlib import Path

import numpy as np
import torch

from sut.config import SUPPORTED_ARCHITECTURES, EngineConfig, ModelConfig
from sut.errors import ConfigError
from sut.sample.sampler import draw, sampling_probs, to_host
from sut.sequence import Sequence
from sut.spec_decode.proposer import sampling_settings
from sut.worker.model_runner import ModelRunner

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


class DraftModelProposer:
    def __init__(
        self,
        folder: Path,
        model_config: ModelConfig,
        config: EngineConfig,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device,
        num_blocks: int,
        default_generator: torch.Generator,
    ):
        self.runner = ModelRunner(folder, model_config, config, max_model_len, dtype, device, num_blocks)
        self.default_generator = default_generator

    def propose(
        self, seqs: list[Sequence], counts: list[int], block_tables: np.ndarray
    ) -> list[tuple[list[int], torch.Tensor | None]]:
        starts = [min(s.draft_num_computed, s.num_computed_tokens) for s in seqs]
        tokens = [s.token_slice(a, s.num_tokens) for s, a in zip(seqs, starts)]
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active = list(range(len(seqs)))
        while active:
            step = self.runner.prepare_tokens(
                [seqs[i] for i in active],
                [tokens[i] for i in active],
                [starts[i] for i in active],
                [1] * len(active),
                block_tables,
            )
            logits = self.runner.execute(step)
            rows = [row for row, i in enumerate(active) if not seqs[i].params.greedy]
            q = {row: sampling_probs(logits[row], *sampling_settings(seqs[active[row]])) for row in rows}
            argmax, *q_host = to_host(logits.argmax(dim=-1), *q.values())  # one host read a forward
            drawn = dict(
                zip(rows, draw(q_host, [seqs[active[row]].generator or self.default_generator for row in rows]))
            )
            still = []
            for row, i in enumerate(active):
                token = drawn[row] if row in q else int(argmax[row])
                drafts[i].append(token)
                if row in q:  # greedy drafts carry none: the verifier compares them with the target's argmax
                    probs[i].append(q[row])
                starts[i] += len(tokens[i])
                tokens[i] = [token]
                if len(drafts[i]) < counts[i]:
                    still.append(i)
            active = still
        for seq, start in zip(seqs, starts):
            seq.draft_num_computed = start
        return [(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs)]


def check_draft_folder(draft: Path, target: Path, target_config: ModelConfig) -> ModelConfig:
    """The draft folder's model config, after checking it can draft for the target: a Llama-family
    model with the target's vocabulary and tokenizer files. Reads only small files."""
    where = "engine setting speculative_config.model"
    if not draft.is_dir():
        raise ConfigError(f"{where}: draft model folder {draft} does not exist")
    path = draft / "config.json"
    if not path.is_file():
        raise ConfigError(f"{where}: {draft} has no config.json")
    try:
        archs = json.loads(path.read_text()).get("architectures") or []
    except (json.JSONDecodeError, AttributeError) as e:
        raise ConfigError(f"{where}: {path} is not a valid config.json ({e})") from None
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ConfigError(
            f"{where}: {draft} is not a Llama-family model (architectures {archs}); "
            f"supported: {list(SUPPORTED_ARCHITECTURES)}"
        )
    config = ModelConfig.from_folder(draft)
    if config.vocab_size != target_config.vocab_size:
        raise ConfigError(
            f"{where}: the draft {draft} has a vocabulary of {config.vocab_size} tokens, the target "
            f"{target_config.vocab_size}: a draft needs the target's tokenizer"
        )
    for name in TOKENIZER_FILES:
        mine, theirs = draft / name, target / name
        if mine.is_file() != theirs.is_file() or (mine.is_file() and mine.read_bytes() != theirs.read_bytes()):
            raise ConfigError(
                f"{where}: the draft {draft} has another tokenizer than the target {target} "
                f"({name} differs or is missing in one of them)"
            )
    return config
