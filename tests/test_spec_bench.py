"""The arithmetic make spec-bench prints: Leviathan's prediction, the run's, the n-gram ceiling and
where outputs differ."""

from types import SimpleNamespace

import pytest

from sut.bench.speculative import (
    first_differences,
    ngram_ceiling,
    predicted_speedup,
    predicted_time_from_steps,
    share_cost,
)


def test_predicted_speedup_is_leviathans_formula():
    # a = 0.5, k = 2: E = (1 - 0.125) / 0.5 = 1.75 tokens per step, over k c + v = 2 * 0.1 + 1.2.
    assert predicted_speedup(0.5, 2, 0.1, 1.2) == pytest.approx(1.75 / 1.4)
    assert predicted_speedup(0.0, 3, 0.0, 1.0) == pytest.approx(1.0)  # nothing accepted, free drafts: no change
    assert predicted_speedup(1.0, 3, 0.0, 1.0) == pytest.approx(4.0)  # everything accepted: k + 1 per step


def test_first_differences_finds_the_first_position_that_differs():
    plain = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    outputs = [[1, 2, 3], [4, 0, 6], [7, 8]]
    assert first_differences(outputs, plain) == [(1, 1), (2, 2)]  # a shorter output differs where it stops


def test_ngram_ceiling_replays_the_lookup_on_the_plain_output():
    # After the first token (the prefill's), [5] matches the prompt's start: drafts 6, 7 are both
    # right, so one forward gives 3 tokens; the last token has no room for drafts: 4 tokens in 2.
    assert ngram_ceiling([[5, 6, 7, 8]], [[5, 6, 7, 8, 9]], 1, 3, 2) == pytest.approx(2.0)
    # Nothing earlier to match: one token per forward.
    assert ngram_ceiling([[1, 2]], [[3, 4, 5]], 1, 3, 2) == pytest.approx(1.0)


def test_run_prediction_costs_each_step_by_its_share_of_verifying_sequences():
    costs = {0.0: 1.0, 0.5: 2.0, 1.0: 3.0}
    assert share_cost(costs, 0.25) == pytest.approx(1.5)
    plain = SimpleNamespace(prefill_s=2.0, decode_s=10.0, decode_steps=10)
    spec = SimpleNamespace(verifying_shares=[0.0, 0.5, 1.0], verify_steps=2, verify_drafts=6, verify_seqs=3)
    # prefill + mean plain step x (1 + 2 + 3 + 2 steps x 2 drafts x c 0.1)
    assert predicted_time_from_steps(plain, spec, 0.1, costs) == pytest.approx(2.0 + 6.4)
