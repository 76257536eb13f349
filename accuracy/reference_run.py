"""Record the demo's accuracy reference, as MLPerf records its reference numbers: run the
transformers implementation of the demo model (greedy, fp32 unless --dtype says otherwise, static
batches of 16 left-padded) on the demo dataset, score it with the same ROUGE pipeline, and store
the scores. The demo's
targets are 99% of these (gen_len within 90-110%), as for llama3.1-8b.

    python -m accuracy.reference_run --model MODEL_DIR --dataset xsum-100x128.json --out accuracy/demo_reference.json
"""

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from accuracy.report import summarization_accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accuracy.datasets.reader import DatasetError, load_dataset

    if not (Path(args.model) / "config.json").is_file():
        sys.exit(f"error: reference_run: {args.model}: not a model folder (no config.json)")
    try:
        data = load_dataset(args.dataset)
    except DatasetError as e:
        sys.exit(f"error: reference_run: {e}")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    outputs, start = [], time.time()
    for b in tqdm(range(0, len(data), args.batch_size), desc="reference"):
        batch = data.input_ids[b : b + args.batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():  # min_new_tokens as the harness's min_tokens (the reference SUT's 1)
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                min_new_tokens=1,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=pad,
            )
        for row in gen[:, width:].tolist():
            outputs.append(row[: row.index(eos) + 1] if eos in row else row)
    predictions = tokenizer.batch_decode(outputs, skip_special_tokens=True)
    result = summarization_accuracy(predictions, data.references, [len(o) for o in outputs])
    record = {
        "model": Path(args.model).name,
        "dataset": args.dataset.name,
        "dataset_sha256": hashlib.sha256(args.dataset.read_bytes()).hexdigest(),
        "samples": len(data),
        "implementation": f"transformers generate, {args.dtype}, greedy, batch {args.batch_size} left-padded",
        "scores": result,
        "eos_token_ids": [eos],
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"reference_run: {result} in {time.time() - start:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
