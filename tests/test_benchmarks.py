"""The benchmark registry (systems/benchmarks.py): the v6.1 facts every package reads from it."""

from systems.benchmarks import BENCHMARKS, ENTRIES, SCENARIOS


def test_targets_are_the_checkers_bounds():
    assert BENCHMARKS["llama3.1-8b"].targets() == {
        "rouge1": (38.7792 * 0.99, None),
        "rouge2": (15.9075 * 0.99, None),
        "rougeL": (24.4957 * 0.99, None),
        "rougeLsum": (35.793 * 0.99, None),
        "gen_len": (8167644 * 0.9, 8167644 * 1.1),
    }
    assert BENCHMARKS["llama2-70b-99.9"].targets()["tokens_per_sample"] == (294.45 * 0.9, 294.45 * 1.1)


def test_latency_limits_and_loadgen_names():
    llama = BENCHMARKS["llama3.1-8b"]
    assert llama.latency_limits_ms == {"Server": (2000, 100), "Interactive": (500, 30)}
    assert (
        llama.loadgen_name("Interactive") == "llama3_1-8b-interactive" and llama.loadgen_name("Server") == "llama3_1-8b"
    )
    assert BENCHMARKS["llama3.1-8b-edge"].latency_limits_ms == {} and not BENCHMARKS["llama3.1-8b-edge"].test06


def test_later_benchmarks_are_recorded_but_not_run():
    later = {b.name: b for b in ENTRIES if not b.ready}
    assert sorted(later) == ["deepseek-r1", "gpt-oss-120b"] and not set(later) & set(BENCHMARKS)
    assert later["deepseek-r1"].latency_limits_ms == {"Server": (2000, 80), "Interactive": (1500, 15)}
    assert later["gpt-oss-120b"].latency_limits_ms == {"Server": (3000, 80), "Interactive": (2000, 15)}


def test_every_entry_is_whole():
    assert len({b.name for b in ENTRIES}) == len(ENTRIES)
    for b in ENTRIES:
        assert b.dataset_size > 0 and 1 <= b.min_new_tokens <= b.max_new_tokens, b.name
        assert set(b.latency_limits_ms) <= {"Server", "Interactive"} and b.accuracy, b.name
        for required, optional in b.scenarios.values():
            assert required | optional <= set(SCENARIOS), b.name


def test_the_harness_runs_every_registry_scenario():
    from harness.config import SCENARIOS as LOADGEN_SCENARIOS

    assert set(LOADGEN_SCENARIOS) == set(SCENARIOS)
