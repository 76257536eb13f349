"""Offline throughput benchmark: our engine against the MLPerf-style transformers reference.

    python -m sut.bench.throughput --model DIR [--num-prompts 64] [--max-new-tokens 128]
                        [--hf-batch-size 16] [--hf-pad-to 1024] [--dtype float32] [--skip-hf]

Both run in the same dtype.

Prompts are real English text (stdlib docstrings), so they need neither network nor a data set.
"""

import argparse
import gc
import importlib
import inspect
import os
import time

import torch

from sut.errors import CheckpointError, run_cli

# Fixed and sorted, so the prompts depend only on the Python version. Pure-Python modules that
# import without side effects and are not deprecated; short ones are skipped in build_prompts.
STDLIB_MODULES = sorted(
    """
abc argparse ast asyncio.tasks base64 bdb calendar cmd code codecs codeop collections compileall
configparser contextlib copy csv dataclasses datetime decimal difflib dis doctest email.message
email.utils enum filecmp fileinput fnmatch ftplib functools getopt getpass glob gzip hashlib heapq
hmac http.client http.cookiejar http.server imaplib importlib.metadata inspect io ipaddress json
linecache locale logging logging.handlers mailbox mimetypes numbers operator optparse pathlib pdb
pickle pickletools pkgutil platform plistlib poplib pprint profile pstats py_compile pyclbr pydoc
quopri random re rlcompleter runpy sched secrets selectors shelve shutil smtplib socket
socketserver statistics string struct subprocess sysconfig tabnanny tarfile tempfile textwrap
threading timeit tokenize traceback types typing unittest.mock urllib.parse urllib.request uuid
warnings wave weakref webbrowser xml.dom.minidom xml.etree.ElementTree zipapp zipfile zipimport
""".split()
)
INSTRUCTION = "Summarize the following documentation in a few sentences:\n\n"
MIN_TEXT_TOKENS = 160  # below this a module cannot reach ~200 prompt tokens; skip it
MAX_PROMPT_TOKENS = 900


def _paragraphs(module_name):
    """Module docstring, then the docstrings of its public members, split into paragraphs."""
    mod = importlib.import_module(module_name)
    docs = [inspect.getdoc(mod) or ""]
    for name, obj in inspect.getmembers(mod):  # getmembers sorts by name: deterministic
        # Only members defined here; re-exports would repeat other modules' text.
        if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        doc = inspect.getdoc(obj)
        if doc:
            docs.append(f"{name}: {doc}")
    seen, paras = set(), []
    for doc in docs:
        for p in (p.strip() for p in doc.split("\n\n")):
            if p and p not in seen:  # getdoc inherits base-class docs; keep each text once
                seen.add(p)
                paras.append(p)
    return paras


def _chat_ids(tokenizer, text):
    messages = [{"role": "user", "content": INSTRUCTION + text}]
    # transformers 5 returns a BatchEncoding unless return_dict=False.
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def build_prompts(tokenizer, num_prompts):
    """One chat prompt per stdlib module, each grown paragraph by paragraph to a token budget."""
    prompts = []
    for module_name in STDLIB_MODULES:
        if len(prompts) == num_prompts:
            break
        paras = _paragraphs(module_name)
        if len(tokenizer.encode("\n\n".join(paras), add_special_tokens=False)) < MIN_TEXT_TOKENS:
            continue
        # Budgets spread over 200..600 tokens so the batch has mixed lengths, as real traffic does.
        budget = 200 + (len(prompts) * 157) % 401
        text, ids = "", None
        for p in paras:
            cand = f"{text}\n\n{p}" if text else p
            cand_ids = _chat_ids(tokenizer, cand)
            if len(cand_ids) > min(budget + 100, MAX_PROMPT_TOKENS):
                continue  # this paragraph overshoots; a later, shorter one may fit
            text, ids = cand, cand_ids
            if len(ids) >= budget:
                break
        prompts.append(ids)
    if len(prompts) < num_prompts:
        raise ValueError(f"only {len(prompts)} prompts available from the stdlib module list")
    return prompts


def run_hf_reference(model_dir, prompts, max_new_tokens, batch_size, pad_to, dtype):
    """The MLPerf reference SUT's way: static batches, each left-padded to a fixed length."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    outputs, seconds = [], 0.0
    for start in tqdm(range(0, len(prompts), batch_size), desc="HF batches"):
        batch = prompts[start : start + batch_size]
        if max(map(len, batch)) > pad_to:
            raise ValueError(f"a prompt is longer than --hf-pad-to {pad_to}")
        input_ids = torch.tensor([[pad_id] * (pad_to - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (pad_to - len(p)) + [1] * len(p) for p in batch], device=device)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            gen = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad_id,
            )
        if device == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        for row in gen[:, pad_to:].tolist():
            # Rows that finish early are filled with padding; output ends at the first EOS.
            outputs.append(row[: row.index(eos_id) + 1] if eos_id in row else row)
    return outputs, seconds


def main():
    ap = argparse.ArgumentParser(prog="python -m sut.bench.throughput", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="converted model directory")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--hf-pad-to", type=int, default=1024)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="for both engines")
    ap.add_argument("--skip-hf", action="store_true", help="run only our engine")
    ap.add_argument("--no-quantized-weights", action="store_true", help="our engine with cpu.quantized_weights=False")
    ap.add_argument("--int16", action="store_true", help="our engine with cpu.int16_activations=True (not exact)")
    args = ap.parse_args()
    # The cores this process may use (a container can have fewer than the host); not Linux: all.
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count())
    torch.set_num_threads(len(cores))

    from sut import LLM, SamplingParams

    llm = LLM(
        args.model,
        dtype=args.dtype,
        cpu={"quantized_weights": not args.no_quantized_weights, "int16_activations": args.int16},
    )
    if llm.tokenizer is None:
        raise CheckpointError(f"{args.model}: the model folder has no tokenizer (the prompts are text)")
    prompts = build_prompts(llm.tokenizer, args.num_prompts)
    lens = [len(p) for p in prompts]
    t0 = time.perf_counter()
    ours = [
        list(o.token_ids)
        for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens), use_tqdm=True)
    ]
    ours_s = time.perf_counter() - t0  # generate only, not model loading
    ours_tok = sum(map(len, ours))
    kv = llm.kv_cache_stats()
    # Of the KV blocks held at peak, the share filled with real tokens (the rest is block tails).
    kv_util = kv["tokens_at_peak"] / max(1, kv["peak_blocks_used"] * kv["block_size"])
    pool_occ = kv["peak_blocks_used"] / max(1, kv["num_blocks"])
    # Free the engine's memory (the KV pool above all) before the reference loads its own copy.
    # The reference runs in this same process, so it gets the same allocator settings.
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    rows = [
        ("dtype", args.dtype),
        ("prompts", f"{len(prompts)}"),
        ("prompt tokens mean / max", f"{sum(lens) / len(lens):.1f} / {max(lens)}"),
        ("ours: output tokens", f"{ours_tok}"),
        ("ours: output tok/s", f"{ours_tok / ours_s:.1f}  ({ours_s:.2f} s)"),
        ("ours: peak KV-cache utilization", f"{kv_util:.3f}  (target >= 0.90)"),
        (
            "ours: pool occupancy at peak",
            f"{pool_occ:.3f}  ({kv['peak_blocks_used']}/{kv['num_blocks']} blocks of {kv['block_size']})",
        ),
        ("ours: preemptions", f"{kv['num_preemptions']}"),
    ]
    summary = f"ours {ours_tok / ours_s:.1f} tok/s, KV utilization {kv_util:.3f}"
    if not args.skip_hf:
        hf, hf_s = run_hf_reference(
            args.model, prompts, args.max_new_tokens, args.hf_batch_size, args.hf_pad_to, getattr(torch, args.dtype)
        )
        hf_tok = sum(map(len, hf))
        ratio = (ours_tok / ours_s) / (hf_tok / hf_s)
        # A static cache reserves pad_to + max_new_tokens slots per row, whatever the row uses.
        hf_util = (sum(lens) + hf_tok) / (len(prompts) * (args.hf_pad_to + args.max_new_tokens))
        same = sum(a == b for a, b in zip(ours, hf))
        rows += [
            ("HF: output tokens", f"{hf_tok}"),
            ("HF: output tok/s", f"{hf_tok / hf_s:.1f}  ({hf_s:.2f} s)"),
            ("speedup ours / HF", f"{ratio:.2f}x  (target >= 3.0)"),
            ("HF: static-cache utilization", f"{hf_util:.3f}"),
            ("identical outputs", f"{same}/{len(prompts)}"),
        ]
        summary += f"; HF {hf_tok / hf_s:.1f} tok/s; speedup {ratio:.2f}x; {same} identical"
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(summary)


if __name__ == "__main__":
    run_cli(main)
