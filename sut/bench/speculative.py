"""Speculative decoding against plain decoding on the same prompts, greedy, per batch size:

    python -m sut.bench.speculative --model DIR --data FILE [--drafts DIR,DIR] [--num-prompts 64]
        [--max-new-tokens 128] [--batch-sizes 1,8,32] [--k 2] [--ngram-min 1] [--ngram-max 3]
        [--engine JSON] [--ceiling-grid]

For each proposer (n-gram lookup; each draft model folder) it prints output tokens/s with and
without speculation, the acceptance rate, the mean accepted length (tokens per verification) and
the measured speed-up; beside it the speed-up that Leviathan et al.'s formula predicts,
E / (k c + v) with E = (1 - a^(k+1)) / (1 - a) from the measured acceptance a, c the measured cost of
a draft forward and v that of a verification of k + 1 rows per sequence, both over a plain decode
step at the same batch size (the paper takes v = 1; on a CPU, verifying k + 1 rows costs more than
one). The prediction is for decode steps; prefill, the same in both runs, is added back from the
plain run's step times. Outputs must be token-identical to plain decoding: where one is not, the
bench prints transformers' top-2 logit gap (fp32) at the first token that differs, which tells a
numerical near-tie (gap under 1e-4) from a bug. For n-gram lookup it also prints the ceiling: the
speed-up with verification as cheap as a plain step, from the lookup replayed on the plain outputs;
`--ceiling-grid` prints it over a grid of k and match lengths (what the data allows any setting).
"""

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from sut.engine.llm import LLM
from sut.errors import ConfigError, run_cli
from sut.sampling_params import SamplingParams
from sut.spec_decode.metrics import SpecMetrics
from sut.spec_decode.ngram import ngram_lookup


def load_prompts(path: Path, num_prompts: int) -> list[list[int]]:
    if not path.is_file():
        raise ConfigError(f"--data {path}: no such file (`make data` writes the demo's)")
    rows = json.loads(path.read_text())
    if len(rows) < num_prompts:
        raise ConfigError(f"--data {path} has {len(rows)} samples, fewer than --num-prompts {num_prompts}")
    return [row["tok_input"] for row in rows[:num_prompts]]


class StepClock:
    """Sums the engine's step times, split into steps that carry prefill tokens and decode steps;
    counts the decode steps, those of them that verified drafts, and the sequences and drafts in
    those; keeps each decode step's share of sequences that verified."""

    def __init__(self, engine):
        self.prefill_s = self.decode_s = 0.0
        self.decode_steps = self.verify_steps = self.verify_seqs = self.verify_drafts = 0
        self.verifying_shares: list[float] = []  # per decode step
        record = engine.scheduler.record_step

        def timed(batch, seconds):
            if any(batch.is_prefill):
                self.prefill_s += seconds
            else:
                self.decode_s += seconds
                self.decode_steps += 1
                verifying = sum(n > 0 for n in batch.num_draft)
                self.verifying_shares.append(verifying / len(batch))
                if verifying:
                    self.verify_steps += 1
                    self.verify_seqs += verifying
                    self.verify_drafts += sum(batch.num_draft)
            record(batch, seconds)

        engine.scheduler.record_step = timed


def run(model: str, prompts, max_new_tokens: int, batch: int, spec: dict | None, engine: dict):
    llm = LLM(model, **{**engine, "max_num_seqs": batch, "speculative_config": spec})
    llm.generate(prompts[:1], SamplingParams(max_tokens=4))  # first-call costs out of the timing
    if spec:
        llm.engine.scheduler.spec_metrics = SpecMetrics(spec["num_speculative_tokens"])
    clock = StepClock(llm.engine)
    start = time.perf_counter()
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_new_tokens, ignore_eos=True))
    seconds = time.perf_counter() - start
    return llm, [o.token_ids for o in outputs], seconds, clock


def forward_ms(runner, seqs, rows: list[int | list[int]], block_tables, repeats: int = 15) -> list[float]:
    """The best time of `runner.execute` for each entry of `rows`: new tokens per sequence at the ends
    of `seqs` (one count for all, or one per sequence). The entries are timed in turn, round after
    round, so a slow spell of the machine falls on all of them."""
    steps = []
    for entry in rows:
        counts = [entry] * len(seqs) if isinstance(entry, int) else entry
        tokens = [s.prompt_token_ids[-r:] for s, r in zip(seqs, counts)]
        starts = [len(s.prompt_token_ids) - r for s, r in zip(seqs, counts)]
        steps.append(runner.prepare_tokens(seqs, tokens, starts, counts, block_tables))
        runner.execute(steps[-1])
    best = [float("inf")] * len(steps)
    for _ in range(repeats):
        for i, step in enumerate(steps):
            start = time.perf_counter()
            runner.execute(step)
            best[i] = min(best[i], time.perf_counter() - start)
    return [b * 1e3 for b in best]


def step_costs(llm: LLM, prompts, batch: int, k: int, step_ms: float) -> tuple[dict[float, float], float]:
    """At `batch` sequences with the prompts' contexts, over a plain decode step of `step_ms` (the
    plain run's mean: the forward and the host's work around it): the cost of a decode step in which
    a share of the sequences verifies k + 1 rows (the rest one) at shares 0, 1/4, 1/2, 3/4 and 1 of
    the batch (1 is Leviathan's v), and of a draft forward (c; 0 without a draft model). The forwards
    are timed alone; a step's host work is taken to be the same with or without drafts."""
    engine = llm.engine
    seqs = [engine.make_sequence(p, SamplingParams()) for p in prompts[:batch]]
    for seq in seqs:
        if not engine.block_manager.allocate(seq, seq.num_tokens):
            raise ConfigError("the KV cache cannot hold the prompts of one batch")
    tables = engine.block_manager.block_tables
    try:
        verifying = sorted({round(batch * share) for share in (0.25, 0.5, 0.75, 1.0)} - {0})
        decode, *verify = forward_ms(
            engine.runner, seqs, [1] + [[k + 1] * j + [1] * (batch - j) for j in verifying], tables
        )
        costs = {0.0: 1.0} | {j / batch: 1 + (ms - decode) / step_ms for j, ms in zip(verifying, verify)}
        draft = getattr(engine.proposer, "runner", None)
        c = forward_ms(draft, seqs, [1], tables)[0] / step_ms if draft is not None else 0.0
    finally:
        for seq in seqs:
            engine.block_manager.free(seq)
    return costs, c


def share_cost(costs: dict[float, float], share: float) -> float:
    """`step_costs`' cost at a share of verifying sequences, linear between the measured shares."""
    shares = sorted(costs)
    return float(np.interp(share, shares, [costs[s] for s in shares]))


def predicted_speedup(acceptance: float, k: int, draft_cost: float, verify_cost: float) -> float:
    """Leviathan et al.'s: every step proposes k drafts, each accepted with probability `acceptance`
    independently of the others."""
    expected = k + 1 if acceptance >= 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)
    return expected / (k * draft_cost + verify_cost)


def predicted_time_from_steps(plain: StepClock, spec: StepClock, draft_cost: float, costs: dict[float, float]) -> float:
    """The speculating run's time predicted from the plain run's: its prefill time, and its own decode
    steps at the plain run's mean decode step, each times the measured cost of a step with its share
    of verifying sequences (once where none verified: n-gram lookup found no match), plus k c where
    drafts were made (k: drafts per verifying sequence)."""
    step = plain.decode_s / max(plain.decode_steps, 1)
    drafts = spec.verify_drafts / max(spec.verify_seqs, 1)
    verify = sum(share_cost(costs, share) for share in spec.verifying_shares)
    return plain.prefill_s + step * (verify + spec.verify_steps * drafts * draft_cost)


def ngram_ceiling(prompts, outputs, min_n: int, max_n: int, k: int) -> float:
    """The speed-up n-gram lookup would give if verification cost no more than a plain step (v = 1,
    c = 0): output tokens per target forward when its proposals are replayed on the plain greedy
    outputs (which speculation reproduces), one sequence at a time, from the first decode step on
    (the prefill makes the first token). The bound no cost can beat."""
    tokens = forwards = 0
    for prompt, out in zip(prompts, outputs):
        t = 1
        while t < len(out):
            drafts = ngram_lookup(np.asarray(prompt + out[:t]), min_n, max_n, min(k, len(out) - t - 1))
            accepted = next((i for i, (d, o) in enumerate(zip(drafts, out[t:])) if d != o), len(drafts))
            t += accepted + 1
            forwards += 1
        tokens += len(out) - 1
    return tokens / max(forwards, 1)


def first_differences(outputs, plain) -> list[tuple[int, int]]:
    """(prompt index, position) of the first token where each differing output leaves the plain one."""
    found = []
    for i, (ours, base) in enumerate(zip(outputs, plain)):
        if ours != base:
            found.append(
                (i, next((p for p, (x, y) in enumerate(zip(ours, base)) if x != y), min(len(ours), len(base))))
            )
    return found


def top2_gap(model, prompt: list[int], prefix: list[int]) -> float:
    """transformers' fp32 gap between the two largest logits after `prompt + prefix`."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + prefix])).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r}")
    return value


def print_ceiling_grid(prompts, plain) -> list[str]:
    """n-gram lookup's ceiling (decode steps only) at k 1-8 for several match-length ranges."""
    ks = (1, 2, 3, 4, 6, 8)
    lines = ["n-gram ceiling (decode steps, v = 1): match max..min \\ k " + " ".join(f"{k:>5}" for k in ks)]
    for min_n, max_n in ((1, 3), (2, 3), (2, 4), (3, 5), (4, 6)):
        values = " ".join(f"{ngram_ceiling(prompts, plain, min_n, max_n, k):>5.2f}" for k in ks)
        lines.append(f"{'':>36}{max_n}..{min_n}   {values}")
    for line in lines:
        print(line, flush=True)
    return lines


def main():
    ap = argparse.ArgumentParser(prog="python -m sut.bench.speculative", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the target model's folder")
    ap.add_argument("--data", required=True, type=Path, help="the demo data (JSON rows with tok_input)")
    ap.add_argument("--drafts", default="", help="comma-separated draft model folders (e.g. make_draft's)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--k", type=int, default=2, help="num_speculative_tokens of every proposer")
    ap.add_argument("--ngram-min", type=int, default=1, help="n-gram lookup's prompt_lookup_min")
    ap.add_argument("--ngram-max", type=int, default=3, help="n-gram lookup's prompt_lookup_max")
    ap.add_argument(
        "--engine",
        type=json_object,
        default={},
        help='engine settings as JSON, e.g. \'{"cpu": {"int16_activations": true}}\' (the demo system\'s numerics)',
    )
    ap.add_argument(
        "--ceiling-grid", action="store_true", help="print n-gram lookup's ceiling at k 1-8 and several match lengths"
    )
    args = ap.parse_args()
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count())
    torch.set_num_threads(len(cores))
    prompts = load_prompts(args.data, args.num_prompts)
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": args.k,
        "prompt_lookup_min": args.ngram_min,
        "prompt_lookup_max": args.ngram_max,
    }
    proposers = {"ngram": ngram}
    for folder in filter(None, args.drafts.split(",")):
        proposers[Path(folder).name] = {"method": "draft_model", "model": folder, "num_speculative_tokens": args.k}
    header = (
        f"{'batch':>5} {'proposer':<22} {'tok/s':>6} {'plain':>6} {'accept':>6} {'mean len':>8} "
        f"{'verified':>8} {'c':>5} {'v':>5} {'speed-up':>8} {'Leviathan':>9} {'(v=1)':>6} {'run':>6} "
        f"{'ceiling':>7} {'same':>5}"
    )
    lines = [header]
    differences = []  # (batch, proposer, prompt index, position)
    ceiling = None
    print(header, flush=True)
    for batch in map(int, args.batch_sizes.split(",")):
        llm, plain, plain_s, plain_clock = run(args.model, prompts, args.max_new_tokens, batch, None, args.engine)
        plain_tps = sum(map(len, plain)) / plain_s
        del llm
        if ceiling is None:
            ceiling = ngram_ceiling(prompts, plain, args.ngram_min, args.ngram_max, args.k)
            if args.ceiling_grid:
                lines += print_ceiling_grid(prompts, plain)
        # Decode time shrinks by a speed-up of decode steps; prefill time stays.
        total = plain_clock.prefill_s + plain_clock.decode_s
        e2e = lambda s: total / (plain_clock.prefill_s + plain_clock.decode_s / s)  # noqa: E731
        for name, spec in proposers.items():
            llm, outputs, seconds, clock = run(args.model, prompts, args.max_new_tokens, batch, spec, args.engine)
            stats = llm.engine.spec_stats()
            costs, c = step_costs(llm, prompts, batch, args.k, 1e3 * plain_clock.decode_s / plain_clock.decode_steps)
            v = costs[1.0]
            a = stats["acceptance_rate"] or 0.0
            tps = sum(map(len, outputs)) / seconds
            verified = clock.verify_steps / max(clock.decode_steps, 1)
            bound = f"{e2e(ceiling):>6.2f}x" if spec is ngram else f"{'-':>7}"
            line = (
                f"{batch:>5} {name:<22} {tps:>6.1f} {plain_tps:>6.1f} {a:>6.3f} "
                f"{stats['mean_accepted_length'] or 0:>8.2f} {verified:>8.2f} {c:>5.2f} {v:>5.2f} "
                f"{tps / plain_tps:>7.2f}x {e2e(predicted_speedup(a, args.k, c, v)):>8.2f}x "
                f"{e2e(predicted_speedup(a, args.k, c, 1.0)):>5.2f}x "
                f"{total / predicted_time_from_steps(plain_clock, clock, c, costs):>5.2f}x {bound} "
                f"{sum(x == y for x, y in zip(outputs, plain)):>2}/{len(plain)}"
            )
            lines.append(line)
            print(line, flush=True)
            differences += [(batch, name, i, pos, plain[i]) for i, pos in first_differences(outputs, plain)]
            del llm
    print(
        f"k={args.k}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, greedy; n-gram lookup matches "
        f"{args.ngram_max}..{args.ngram_min} tokens. accept: accepted / proposed drafts; mean len: tokens per "
        "verification; verified: share of decode steps that verified drafts (of any sequence); c, v: a draft "
        "forward and a step in which every sequence verifies k + 1 rows over the plain run's mean decode step at "
        "that batch (forwards timed alone, the step's host work the same). "
        "Predicted speed-ups (prefill time added back): Leviathan's E / (k c + v) from the acceptance, the same "
        "with v = 1 (the paper's assumption), and 'run': the speculating run's own decode steps at the plain "
        "run's step time, each times the measured cost of a step with its share of verifying sequences, plus "
        "k c where drafts were made. ceiling: n-gram lookup replayed on the plain outputs with free "
        "verification (v = 1, c = 0), the most any cost model allows"
    )
    if differences:
        from transformers import AutoModelForCausalLM

        reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        for batch, name, i, pos, base in differences:
            gap = top2_gap(reference, prompts[i], base[:pos])
            verdict = "a near-tie" if gap < 1e-4 else "NOT a near-tie: a bug"
            line = (
                f"batch {batch} {name}: prompt {i} differs from plain decoding at new token {pos}; "
                f"transformers' top-2 logit gap there {gap:.2e}: {verdict}"
            )
            lines.append(line)
            print(line, flush=True)
    return lines


if __name__ == "__main__":
    run_cli(main)
