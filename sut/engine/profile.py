"""What an engine's steps cost on this machine, measured: a sweep of real steps (`profile_steps`)
and each step's terms (`step_terms`), from which harness/predict fits a step-cost model. Here, not
there, so that a replica or disaggregated worker profiles its own engine in its own process, on
its own cores, all of a pool's at once (ReplicaPool.profile_steps)."""

import time

from sut.sampling_params import SamplingParams

# A step's terms: a fixed cost per step (the weights read once), per prompt token computed (a GEMM
# row), per decoding token (a row of the decode kernels, a draft verified counting as one), per
# draft token proposed (the draft model's forwards; nothing for n-gram lookup) and per (new token,
# cached token) pair attended.
TERMS = ("step", "prefill_token", "decode_token", "draft_token", "attention")
PROFILE_TOKENS = 48  # each profiled request's answer


def step_terms(batch) -> dict[str, float]:
    """The terms of a ScheduledBatch, before the scheduler updates its sequences: each row computes
    `n` tokens after `c` already cached, attending to c + 1 .. c + n tokens."""
    rows = list(zip(batch.seqs, batch.num_new_tokens, batch.is_prefill, batch.num_draft))
    return {
        "step": 1.0,
        "prefill_token": float(sum(n for _, n, prefill, _ in rows if prefill)),
        "decode_token": float(sum(n for _, n, prefill, _ in rows if not prefill)),
        "draft_token": float(sum(d for *_, d in rows)),
        "attention": sum(n * (s.num_computed_tokens + (n + 1) / 2) for s, n, _, _ in rows),
        # Not a fitted term: the K/V the decoding rows read, for a data sheet's roofline (harness/predict/rigs.py).
        "decode_context": float(sum(s.num_computed_tokens + n for s, n, prefill, _ in rows if not prefill)),
    }


def acceptance_by_position(spec_stats: dict | None) -> list[float]:
    """Position j's draft accepted given those before it were: the ratio of the shares of
    proposals that reached j and j - 1 with their drafts accepted (SpecMetrics.summary)."""
    if not spec_stats or not spec_stats.get("num_proposals"):
        return []
    shares = [share or 0.0 for share in spec_stats["acceptance_by_position"]]
    return [min(1.0, share / before) if before else 0.0 for share, before in zip(shares, [1.0, *shares])]


def profile_steps(engine, prompts: list[list[int]], budget_s: float) -> dict:
    """Real steps of `engine` (idle; warmed up here first) and what each cost: groups of the
    prompts submitted together at batch sizes 1, 2, 4, .. max_num_seqs (prefill chunks, then
    decodes at that batch as contexts grow, with drafts where it speculates), then prompts arriving
    one per step beside running decodes (mixed steps), until `budget_s` is spent. The engine is
    reset after. Returns {"shapes": [step_terms], "seconds": [...], "acceptance": where it
    speculates, acceptance_by_position of its drafts on these prompts}."""
    engine.warmup()
    shapes, seconds = [], []
    record = engine.scheduler.record_step

    def recorded(batch, took):
        shapes.append(step_terms(batch))
        seconds.append(took)
        record(batch, took)

    engine.scheduler.record_step = recorded
    params = SamplingParams(max_tokens=PROFILE_TOKENS, ignore_eos=True)
    start, next_prompt = time.perf_counter(), 0

    def take(n):
        nonlocal next_prompt
        chosen = [prompts[(next_prompt + i) % len(prompts)] for i in range(n)]
        next_prompt += n
        return chosen

    batch_sizes, b = [], 1
    while b < engine.config.max_num_seqs:
        batch_sizes.append(b)
        b *= 2
    batch_sizes.append(engine.config.max_num_seqs)
    try:
        for b in batch_sizes:
            if time.perf_counter() - start > budget_s / 2 and b > 1:
                break
            for p in take(b):
                engine.add_request(p, params)
            while engine.has_unfinished():
                engine.step()
        staggered = take(min(engine.config.max_num_seqs, 32))
        while (staggered or engine.has_unfinished()) and time.perf_counter() - start < budget_s:
            if staggered:
                engine.add_request(staggered.pop(), params)
            engine.step()
        while engine.has_unfinished():
            engine.step()
        acceptance = acceptance_by_position(engine.spec_stats())
    finally:
        engine.scheduler.record_step = record
    engine.reset()
    return {"shapes": shapes, "seconds": seconds, "acceptance": acceptance}
