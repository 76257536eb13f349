"""Every engine setting and every request field is checked for its type and range before anything
runs: a wrong one is an error naming it, what it must be and what it was, never a setting taken the
wrong way ("false" as true), a traceback after the model has loaded, or a request that fails mid-step."""

import json
import math
from dataclasses import MISSING, fields

import pytest

from sut import LLM, ConfigError, InvalidRequestError, LLMEngine, SamplingParams
from sut.config import EngineConfig
from sut.config.cpu import CpuSettings
from sut.config.disaggregation import DisaggregationConfig
from sut.config.engine import KIND_WORDS, _kind_of
from sut.config.speculative import SpeculativeConfig
from systems.schema import REPO
from tests.helpers import random_prompts

NAN, INF = float("nan"), float("inf")

BAD_SETTINGS = [
    ("enable_prefix_caching", "false", "true or false"),  # a string is not off: MLPerf forbids the reuse
    ("enable_chunked_prefill", 0, "true or false"),
    ("static_batching", "no", "true or false"),
    ("cuda_graphs", 1, "true or false"),
    ("max_num_seqs", True, "a positive integer"),
    ("max_num_batched_tokens", 2048.0, "a positive integer"),
    ("block_size", "16", "a positive integer"),
    ("max_model_len", 0, "a positive integer or None"),
    ("num_kv_blocks", False, "a positive integer or None"),
    ("tensor_parallel_size", 2.0, "a positive integer"),
    ("data_parallel_size", True, "a positive integer"),
    ("tpot_target_ms", NAN, "a positive finite number or None"),
    ("tpot_target_ms", INF, "a positive finite number or None"),
    ("tpot_cap_ms", NAN, "a positive finite number or None"),
    ("ttft_patience_ms", INF, "a positive finite number or None"),
    ("kv_cache_memory_gb", "4", "a positive finite number or None"),
    ("kv_cache_memory_gb", INF, "a positive finite number or None"),
    ("kv_cache_memory_gb", -1, "a positive finite number or None"),
    ("gpu_memory_utilization", "0.9", "a number in (0, 1]"),
    ("gpu_memory_utilization", NAN, "a number in (0, 1]"),
    ("gpu_memory_utilization", 1.5, "a number in (0, 1]"),
    ("gpu_memory_utilization", True, "a number in (0, 1]"),
    ("seed", -1, "an integer in [0, 2**63)"),
    ("seed", 2**63, "an integer in [0, 2**63)"),
    ("seed", "7", "an integer in [0, 2**63)"),
    ("seed", 1.0, "an integer in [0, 2**63)"),
    ("seed", None, "an integer in [0, 2**63)"),
    ("dtype", 16, "'auto' or one of ['float32', 'float16', 'bfloat16']"),
    ("dtype", "fp8", "'auto' or one of ['float32', 'float16', 'bfloat16']"),
    ("device", 0, "'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("device", "cuda:x", "'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("kernels", None, "'auto', 'triton' or 'torch'"),
]


@pytest.mark.parametrize("name, value, must", BAD_SETTINGS, ids=[f"{n}={v!r}" for n, v, _ in BAD_SETTINGS])
def test_a_bad_setting_is_refused_by_name(name, value, must):
    with pytest.raises(ConfigError) as refused:
        EngineConfig.from_kwargs(**{name: value})
    assert str(refused.value) == f"engine setting {name} must be {must}, got {value!r}"


def test_settings_are_refused_before_anything_loads(tmp_path):
    """The settings come first: a bad one is named even where the model folder does not exist."""
    with pytest.raises(ConfigError, match=r"engine setting seed must be an integer in \[0, 2\*\*63\), got -1"):
        LLM(tmp_path / "nowhere", seed=-1)
    with pytest.raises(ConfigError, match="engine setting enable_prefix_caching must be true or false, got 'false'"):
        LLM(tmp_path / "nowhere", enable_prefix_caching="false", data_parallel_size=2)


def test_good_values_of_each_kind_are_taken():
    config = EngineConfig.from_kwargs(
        kv_cache_memory_gb=4,
        gpu_memory_utilization=1,
        tpot_target_ms=50,
        tpot_cap_ms=80.5,
        ttft_patience_ms=1000,
        seed=2**63 - 1,
        device="cuda:3",
        dtype="bfloat16",
        enable_prefix_caching=False,
        max_model_len=None,
    )
    assert config.kv_cache_memory_gb == 4 and config.seed == 2**63 - 1 and config.device == "cuda:3"


def test_every_setting_has_a_kind_the_check_knows():
    """A new setting is checked as soon as it is declared: its annotation names its kind."""
    for f in fields(EngineConfig):
        kind, _ = _kind_of(f.type)
        assert kind in KIND_WORDS or kind in (CpuSettings, SpeculativeConfig, DisaggregationConfig), (
            f"{f.name}: {f.type}"
        )


def accepted_settings() -> dict:
    """Every setting EngineConfig.from_kwargs accepts, by the name sut/README.md's table gives it, with
    its default (MISSING: the object needs it): its fields, and the keys of the three objects among
    them (cpu, speculative_config, disaggregation), which their own classes accept, as `object.key`."""
    settings = {f.name: f.default for f in fields(EngineConfig)}
    for parent, kind in (("cpu", CpuSettings), ("speculative_config", SpeculativeConfig)):
        settings |= {f"{parent}.{f.name}": f.default for f in fields(kind)}
    settings |= {f"disaggregation.{f.name}": f.default for f in fields(DisaggregationConfig)}
    return settings


def readme_settings_table() -> dict:
    """sut/README.md's table of engine settings: setting -> its default cell."""
    lines = (REPO / "sut/README.md").read_text().splitlines()
    start = lines.index("| setting | what | default |")
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, _what, default = (cell.strip() for cell in line.strip("|").split(" | "))
        assert name.startswith("`") and name.endswith("`") and name.count("`") == 2, line
        assert name.strip("`") not in rows, f"{name} twice in sut/README.md's settings table"
        rows[name.strip("`")] = default
    return rows


def test_the_readme_settings_table_names_every_setting_and_its_default():
    """sut/README.md's table lists exactly the settings the engine accepts, each with the code's default:
    a setting added, renamed or dropped, or a default changed, fails here until the table says so."""
    table, code = readme_settings_table(), accepted_settings()
    assert sorted(table) == sorted(code), (
        f"missing from the table: {sorted(set(code) - set(table))}; not settings: {sorted(set(table) - set(code))}"
    )
    for name, default in code.items():
        cell = table[name]
        if default is MISSING:
            assert cell == "required", (name, cell)
        elif default is None:
            assert cell.startswith("none"), (name, cell)
        elif isinstance(default, (bool, int, float, str)):
            assert cell.startswith(f"`{json.dumps(default)}`"), (name, cell)


@pytest.mark.parametrize(
    "value, message",
    [
        (
            {"method": "draft_model", "model": "", "num_speculative_tokens": 2},
            "speculative_config.model must be a non-empty string (the draft model's folder) for method "
            "'draft_model', got ''",
        ),
        (
            {"method": "draft_model", "model": 5, "num_speculative_tokens": 2},
            "speculative_config.model must be a non-empty",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": True},
            "speculative_config.num_speculative_tokens must be an integer",
        ),
        (SpeculativeConfig("ngram", 2, adaptive="yes"), "speculative_config.adaptive must be true or false, got 'yes'"),
        (SpeculativeConfig("ngram", 2.0), "speculative_config.num_speculative_tokens must be an integer >= 1, got 2.0"),
    ],
)
def test_speculative_config_fields_are_typed(value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig.from_kwargs(speculative_config=value)


def test_cpu_settings_given_as_an_object_are_checked_too():
    with pytest.raises(ConfigError, match="engine setting cpu.quantized_weights must be true or false, got 'false'"):
        EngineConfig.from_kwargs(cpu=CpuSettings(quantized_weights="false"))
    assert EngineConfig.from_kwargs(cpu=CpuSettings(int16_activations=True)).cpu.int16_activations


BAD_REQUESTS = [
    ("temperature", "hot", "a finite number >= 0 (0: greedy)"),
    ("temperature", INF, "a finite number >= 0 (0: greedy)"),
    ("temperature", NAN, "a finite number >= 0 (0: greedy)"),
    ("temperature", True, "a finite number >= 0 (0: greedy)"),
    ("top_p", NAN, "a number in (0, 1] (1: off)"),
    ("top_p", "0.9", "a number in (0, 1] (1: off)"),
    ("top_k", 1.5, "an integer >= 0 (0: off)"),
    ("top_k", True, "an integer >= 0 (0: off)"),
    ("max_tokens", 8.0, "an integer >= 1"),
    ("max_tokens", True, "an integer >= 1"),
    ("min_tokens", "1", "an integer in [0, max_tokens=16]"),
    ("min_tokens", True, "an integer in [0, max_tokens=16]"),
    ("seed", "x", "None or an integer in [0, 2**63)"),
    ("seed", -1, "None or an integer in [0, 2**63)"),
    ("seed", 2**63, "None or an integer in [0, 2**63)"),
    ("seed", 3.0, "None or an integer in [0, 2**63)"),
    ("ignore_eos", 1, "true or false"),
    ("ignore_eos", "false", "true or false"),
    ("stop_token_ids", 5, "a list of token ids"),
    ("stop_token_ids", "5", "a list of token ids"),
]


@pytest.mark.parametrize("name, value, must", BAD_REQUESTS, ids=[f"{n}={v!r}" for n, v, _ in BAD_REQUESTS])
def test_a_bad_sampling_param_is_refused_by_name(name, value, must):
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(**{name: value})
    assert str(refused.value) == f"{name} must be {must}, got {value!r}"


@pytest.mark.parametrize("bad", [-1, True, 2.0, "7", None])
def test_a_bad_stop_token_id_is_refused_by_position(bad):
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(stop_token_ids=[7, bad])
    assert str(refused.value) == f"stop_token_ids[1] must be a token id (an integer >= 0), got {bad!r}"


def test_good_sampling_params_of_each_kind_are_taken():
    import numpy as np

    params = SamplingParams(temperature=1, top_p=0.5, seed=2**63 - 1, stop_token_ids=[np.int64(5), 9])
    assert params.stop_token_ids == (5, 9) and all(type(t) is int for t in params.stop_token_ids)
    assert SamplingParams(stop_token_ids=(3,)).stop_token_ids == (3,)
    assert not math.isnan(params.temperature)


def test_stop_token_ids_are_checked_against_the_vocabulary(tiny_llama):
    engine = LLMEngine(tiny_llama[0], num_kv_blocks=64)
    with pytest.raises(InvalidRequestError, match=r"stop token id 256 is outside the vocabulary \[0, 256\)"):
        engine.add_request([5, 6], SamplingParams(stop_token_ids=[3, 256], min_tokens=2))
    with pytest.raises(InvalidRequestError, match="sampling params must be a SamplingParams, got dict"):
        engine.add_request([5, 6], {"max_tokens": 3})
    assert not engine.has_unfinished()
    rid = engine.add_request(random_prompts([5])[0], SamplingParams(stop_token_ids=[255], min_tokens=2, max_tokens=3))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert [o.request_id for o in outputs] == [rid]
    assert outputs[0].finish_reason in ("stop", "length") and len(outputs[0].token_ids) >= 2
