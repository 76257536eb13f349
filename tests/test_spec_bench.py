"""The arithmetic make spec-bench prints: Leviathan's prediction and where outputs differ."""

import pytest

from sut.spec_bench import first_differences, predicted_speedup


def test_predicted_speedup_is_leviathans_formula():
    # a = 0.5, k = 2: E = (1 - 0.125) / 0.5 = 1.75 tokens per step, over k c + v = 2 * 0.1 + 1.2.
    assert predicted_speedup(0.5, 2, 0.1, 1.2) == pytest.approx(1.75 / 1.4)
    assert predicted_speedup(0.0, 3, 0.0, 1.0) == pytest.approx(1.0)  # nothing accepted, free drafts: no change
    assert predicted_speedup(1.0, 3, 0.0, 1.0) == pytest.approx(4.0)  # everything accepted: k + 1 per step


def test_first_differences_finds_the_first_position_that_differs():
    plain = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    outputs = [[1, 2, 3], [4, 0, 6], [7, 8]]
    assert first_differences(outputs, plain) == [(1, 1), (2, 2)]  # a shorter output differs where it stops
