"""Build the CPU demo's dataset: XSum (BBC articles with one-sentence reference summaries) from
the BIG-bench sdist on PyPI, downloaded with pip but never installed (its requirements pull
TensorFlow), checked by SHA-256, written in the cnn_eval.json form with SmolLM2's chat template.

Each article is cut to its leading sentences (XSum has one per line; the summary is of the lead)
so that the prompt fits --max-prompt-tokens: on 2 CPU cores prefill runs ~500 tokens/s, and a
Server run at a rate that fits the demo's time budget meets the 2 s first-token limit only with
prompts this short (README, "Machines").

    python -m harness.demo_data --tokenizer MODEL_DIR --out $SAAF_CACHE/data/xsum-100x128.json

The sdist is kept as $SAAF_CACHE/downloads/bigbench-1.0.0.tar.gz: where the package index this
machine reaches does not offer it (one that lists bigbench 0.0.1 alone), copy it there from a
machine that has it (`pip download --no-deps bigbench==1.0.0`); its SHA-256 is checked either way.
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from systems.schema import saaf_cache

BIGBENCH = "bigbench==1.0.0"
BIGBENCH_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
XSUM_MEMBER = "bigbench-1.0.0/bigbench/benchmark_tasks/gem/xsum/task.json"
INSTRUCTION = (
    "Summarize the following news article in one sentence. Output the summary only, "
    "without any other text.\n\nArticle:\n{article}"
)


def bigbench_sdist(downloads: Path) -> Path:
    """The BIG-bench sdist in `downloads`, fetched with pip unless it is there already, checked by
    SHA-256; SystemExit naming what to do where pip cannot get it."""
    archive = downloads / "bigbench-1.0.0.tar.gz"
    if not archive.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", BIGBENCH, "-d", tmp],
                capture_output=True,
                text=True,
            )
            found = list(Path(tmp).glob("bigbench-*.tar.gz"))
            if done.returncode != 0 or not found:
                why = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or ["no sdist"]
                sys.exit(
                    f"demo_data: pip could not download {BIGBENCH}, the source of the demo's XSum set, from the "
                    f"package index this machine reaches ({why[0]}); copy bigbench-1.0.0.tar.gz (SHA-256 "
                    f"{BIGBENCH_SHA256}) from a machine whose index has it to {archive}, then run `make data`"
                )
            found[0].replace(archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != BIGBENCH_SHA256:
        sys.exit(f"demo_data: {archive} has SHA-256 {digest}, expected {BIGBENCH_SHA256}: remove it and run again")
    return archive


def download_xsum(downloads: Path) -> list[dict]:
    with tarfile.open(bigbench_sdist(downloads)) as tar:
        return json.load(tar.extractfile(XSUM_MEMBER))["examples"]


def build(
    examples: list[dict], tokenizer, num_samples: int, max_prompt_tokens: int, min_sentences: int = 2
) -> list[dict]:
    """The first `num_samples` articles, in dataset order, each cut to the most leading sentences
    (at least `min_sentences`) whose prompt fits in `max_prompt_tokens`."""

    def prompt(sentences: list[str]) -> tuple[str, list[int]]:
        messages = [{"role": "user", "content": INSTRUCTION.format(article="\n".join(sentences).strip())}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text, tokenizer.encode(text, add_special_tokens=False)

    records = []
    for example in examples:
        sentences = example["input"].strip().split("\n")
        low, high = min_sentences - 1, len(sentences)  # the most that fit, by bisection: low fit (or none), high+1 not
        while low < high:
            mid = (low + high + 1) // 2
            if len(prompt(sentences[:mid])[1]) <= max_prompt_tokens:
                low = mid
            else:
                high = mid - 1
        if low >= min_sentences:
            text, ids = prompt(sentences[:low])
            records.append(
                {"input": text, "tok_input": ids, "output": example["target"].strip(), "id": example.get("comment", "")}
            )
        if len(records) == num_samples:
            break
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="model folder with the tokenizer")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--num-samples", type=int, default=100)
    parser.add_argument("--max-prompt-tokens", type=int, default=128)
    parser.add_argument(
        "--downloads", type=Path, default=saaf_cache() / "downloads", help="where the BIG-bench sdist is kept"
    )
    args = parser.parse_args()
    from transformers import AutoTokenizer

    examples = download_xsum(args.downloads)
    records = build(examples, AutoTokenizer.from_pretrained(args.tokenizer), args.num_samples, args.max_prompt_tokens)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(records))
    tmp.replace(args.out)
    lengths = [len(r["tok_input"]) for r in records]
    print(
        f"demo_data: {len(records)} XSum samples -> {args.out} (prompt tokens mean {sum(lengths) / len(lengths):.0f}, "
        f"max {max(lengths)})"
    )


if __name__ == "__main__":
    main()
