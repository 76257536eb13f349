"""Time single engine steps: a decode step at several batch sizes, and a prefill of several prompt
lengths. These bound what a Server run can meet: every decode step is part of each running
request's time per output token.

    python -m sut.bench.steps --model DIR [--dtype float32|bfloat16] [--thread] [--no-quantized-weights | --int16]
    python -m sut.bench.steps --overhead [--vocab 128256] [--context 1000]

--thread runs the steps in a second thread instead of the main one, which on CPU is slower (the
reason the LoadGen harness steps the engine in the main thread). --no-quantized-weights runs every
CPU linear on its fp32 weights (sut/cpu/quant.py says when the quantized ones are used); --int16
computes every linear from the quantized weights with int16 inputs (engine setting
cpu.int16_activations, as the CPU demo runs).

--overhead times the host's share of a decode step, the part that sits on a GPU's critical path
beside the forward: schedule, prepare (the step input), sample and update, at batch 1, 64 and 256
with contexts of about --context tokens. The forward is replaced by fixed random logits of
[rows, --vocab] (default Llama 3.1's vocabulary) on a one-layer random model, so only host work is
timed; on a GPU the sampler's argmax over those logits runs on the device, here on the CPU, so
its calls are timed (argmax) and taken out of the last column (the host's share on a GPU).
"""

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

import sut.worker.model_runner
from sut import LLMEngine, SamplingParams
from sut.errors import run_cli

PROMPT = list(range(100, 300))  # 200 ordinary token ids
EXTRA_TOKENS = 256  # --overhead: room for each sequence's generated tokens


def decode_step_ms(engine: LLMEngine, batch: int, steps: int = 10) -> float:
    params = SamplingParams(max_tokens=steps + 20, min_tokens=steps + 20)
    for i in range(batch):
        engine.add_request(PROMPT, params, request_id=f"decode-{batch}-{i}")
    engine.step()  # the prefill of all of them (the budget holds it)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    while engine.has_unfinished():
        engine.step()
    return statistics.median(times) * 1000


def prefill_ms(engine: LLMEngine, length: int) -> float:
    engine.add_request(list(range(100, 100 + length)), SamplingParams(max_tokens=1), request_id=f"prefill-{length}")
    start = time.perf_counter()
    engine.step()
    elapsed = time.perf_counter() - start
    while engine.has_unfinished():
        engine.step()
    return elapsed * 1000


class PhaseTimer:
    """Wraps callables so that each call's time adds to its phase's total for the current step."""

    def __init__(self):
        self.step: dict[str, float] = {}

    def wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.step[phase] = self.step.get(phase, 0.0) + time.perf_counter() - start

        return timed


def random_model_folder(folder: Path, vocab: int, max_len: int) -> Path:
    """A one-layer random Llama with `vocab` tokens: the forward is replaced, only its shapes matter."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=max_len,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def fake_forward(engine: LLMEngine, vocab: int, max_rows: int, max_tokens: int, timer: PhaseTimer) -> None:
    """Replace the model's forward with fixed random logits of the right shape (timed as 'forward')."""
    model = engine.runner.model
    hidden = torch.zeros(max_tokens, model.config.hidden_size)
    logits = torch.randn(max_rows, vocab)
    model.forward = timer.wrap("forward", lambda ids, positions, meta: hidden[: len(ids)])
    model.compute_logits = timer.wrap("forward", lambda h: logits[: len(h)])
    if getattr(engine.runner, "cpu_decoder", None) is not None:
        engine.runner.cpu_decoder = None


def time_phases(engine: LLMEngine, timer: PhaseTimer) -> None:
    """Wrap the step's phases. 'prepare' takes everything the runner does besides the forward
    (before the step seam, run() prepared and ran it; after, prepare() and execute())."""
    scheduler, runner = engine.scheduler, engine.runner
    scheduler.schedule = timer.wrap("schedule", scheduler.schedule)
    for name in ("run", "prepare", "execute"):
        if hasattr(runner, name):
            setattr(runner, name, timer.wrap("prepare", getattr(runner, name)))
    sut.worker.model_runner.sample = timer.wrap("sample", sut.worker.model_runner.sample)
    torch.Tensor.argmax = timer.wrap("argmax", torch.Tensor.argmax)  # the sampler's, inside "sample"


def overhead(vocab: int, context: int, batches=(1, 64, 256), steps: int = 20) -> None:
    # Host work is one Python thread; torch's worker threads would only wait on each other here
    # (on a busy machine a parallel op stalls for a scheduler tick).
    torch.set_num_threads(1)
    max_batch = max(batches)
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_model_folder(Path(tmp), vocab, context + EXTRA_TOKENS)
        blocks = max_batch * (-(-(context + EXTRA_TOKENS) // 16))
        engine = LLMEngine(
            folder, max_num_seqs=max_batch, max_num_batched_tokens=8192, num_kv_blocks=blocks, kernels="torch"
        )
    timer = PhaseTimer()
    fake_forward(engine, vocab, max_batch, 8192 + max_batch, timer)
    time_phases(engine, timer)
    phases, totals = ("schedule", "prepare", "sample", "update"), ("host", "argmax", "host - argmax")
    print(
        f"host time per decode step, forward replaced by random logits [batch, {vocab}], contexts of "
        f"~{context} tokens (median of {steps} steps, ms; update = the rest of the step):"
    )
    print(
        f"{'batch':>5} " + " ".join(f"{p:>9}" for p in phases) + f" {'host total':>10} {'argmax':>9}"
        f" {'host - argmax':>13}"
    )
    # Long enough that none finishes while the last prompts are prefilled or while steps are timed.
    params = SamplingParams(max_tokens=EXTRA_TOKENS, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    for batch in batches:
        for i in range(batch):
            engine.add_request(
                torch.randint(3, vocab, (context,), generator=g).tolist(), params, request_id=f"overhead-{batch}-{i}"
            )
        engine.step()  # the requests join the scheduler in a step
        while engine.scheduler.waiting or any(
            s.num_computed_tokens < len(s.prompt_token_ids) for s in engine.scheduler.running
        ):
            engine.step()  # prefill them all
        per_step = []
        for _ in range(steps):
            timer.step = {}
            start = time.perf_counter()
            engine.step()
            t = dict(timer.step)
            t["host"] = time.perf_counter() - start - t.get("forward", 0.0)
            t["prepare"] = t.get("prepare", 0.0) - t.get("forward", 0.0)
            t["update"] = t["host"] - t["schedule"] - t["prepare"] - t.get("sample", 0.0)
            t["host - argmax"] = t["host"] - t.get("argmax", 0.0)
            per_step.append(t)
        assert len(engine.scheduler.running) == batch, f"{len(engine.scheduler.running)} of {batch} still running"
        for seq in list(engine.scheduler.running):
            engine.abort(seq.request_id)
        engine.step()
        med = {p: statistics.median(t.get(p, 0.0) for t in per_step) * 1000 for p in [*phases, *totals]}
        print(
            f"{batch:5d} " + " ".join(f"{med[p]:9.3f}" for p in phases) + f" {med['host']:10.3f}"
            f" {med['argmax']:9.3f} {med['host - argmax']:13.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (not needed with --overhead)")
    parser.add_argument("--overhead", action="store_true", help="time the host's share of a step (see above)")
    parser.add_argument("--vocab", type=int, default=128256, help="with --overhead: logits per row")
    parser.add_argument("--context", type=int, default=1000, help="with --overhead: tokens per sequence")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--thread", action="store_true", help="step the engine in a thread other than the main one")
    parser.add_argument(
        "--no-quantized-weights", action="store_true", help="engine setting cpu.quantized_weights=False"
    )
    parser.add_argument("--int16", action="store_true", help="engine setting cpu.int16_activations=True")
    args = parser.parse_args()
    if args.overhead:
        overhead(args.vocab, args.context)
        return
    if not args.model:
        parser.error("--model is required (except with --overhead)")
    engine = LLMEngine(
        args.model,
        dtype=args.dtype,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        cpu={"quantized_weights": not args.no_quantized_weights, "int16_activations": args.int16},
    )

    def measure() -> None:
        for batch in (1, 4, 8, 16):
            print(f"decode step, batch {batch:3d}: {decode_step_ms(engine, batch):7.1f} ms (median of 10)")
        for length in (64, 128, 256, 512):
            print(f"prefill of {length:3d} tokens: {prefill_ms(engine, length):7.1f} ms")

    if args.thread:
        worker = threading.Thread(target=measure)
        worker.start()
        worker.join()
    else:
        measure()


if __name__ == "__main__":
    run_cli(main)
