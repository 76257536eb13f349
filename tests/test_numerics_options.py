"""The report's numerics options (harness/measure/ablation.py, item 5): an engine setting set to a value (true
unless given), off (the setting's EngineConfig default) in every configuration before them, cumulative
unless an option says otherwise; and a system file's bad option refused by its key."""

import re

import pytest

from harness.config import HarnessConfigError
from harness.measure.ablation import configurations, report_settings
from systems.schema import System

BENCHMARK = "llama3.1-8b"
INT16 = {"name": "int16 activations", "setting": "cpu.int16_activations"}
FP8 = {"name": "FP8 weights", "setting": "quantization", "value": "fp8"}


def demo_with(numerics: list) -> System:
    demo = System.load("cpu-demo")
    demo.report = {**demo.report, "numerics": numerics}
    return demo


def by_label(configs):
    return {c.label: c for c in configs}


def test_the_demo_runs_fp8_weights_on_chunked_prefill_alone_and_off_before():
    demo = System.load("cpu-demo")
    configs = configurations(demo, BENCHMARK, 100)
    labels = [c.label for c in configs]
    assert labels.index("FP8 weights") == labels.index("int16 activations") + 1
    chunked, int16, fp8 = (
        by_label(configs)[k] for k in ("chunked prefill + TPOT guard", "int16 activations", "FP8 weights")
    )
    # Configurations 1-4 with every numerics option at its EngineConfig default.
    for config in configs[: labels.index("int16 activations")]:
        assert config.engine["quantization"] is None and config.engine["cpu"]["int16_activations"] is False, (
            config.label
        )
    # Not on int16 activations: with quantization set the CPU backend drops the GGUF blocks int16 needs.
    assert fp8.builds_on == chunked.label and fp8.folder == "05-numerics-2"
    assert fp8.engine == {**chunked.engine, "quantization": "fp8"}
    assert 'quantization "fp8"' in fp8.change and "alone" in fp8.change
    assert "fp32" in fp8.note and "speed is not" in fp8.note
    assert int16.engine == {**chunked.engine, "cpu": {"int16_activations": True}} and int16.note == ""
    # Nothing builds on FP8: the layouts keep the system's own settings (int16 activations, no FP8).
    layouts = [c for c in configs if c.folder.startswith("06-layout-")]
    assert layouts and all(c.builds_on == int16.label and c.engine["quantization"] is None for c in layouts)


def test_a_cumulative_option_with_a_value_builds_on_the_last():
    configs = by_label(configurations(demo_with([INT16, FP8]), BENCHMARK, 100))
    fp8 = configs["FP8 weights"]
    assert fp8.builds_on == "int16 activations"
    assert fp8.engine == {**configs["int16 activations"].engine, "quantization": "fp8"}
    assert fp8.change == 'engine setting quantization "fp8"'
    assert configs["2 data-parallel replicas"].builds_on == "FP8 weights"
    # Off before: first alone, FP8 is off in int16's configuration and int16 in FP8's.
    configs = by_label(configurations(demo_with([FP8, INT16]), BENCHMARK, 100))
    assert configs["FP8 weights"].engine["cpu"]["int16_activations"] is False
    assert configs["FP8 weights"].engine["quantization"] == "fp8"
    assert configs["int16 activations"].engine["quantization"] == "fp8"  # cumulative: on FP8


@pytest.mark.parametrize(
    "option, message",
    [
        ("fp8", "numerics[1] must be an object with a name and an engine setting"),
        ({**FP8, "valeu": "fp8"}, "numerics[1] has unknown keys ['valeu']; known: ['name', 'setting', 'value'"),
        ({"setting": "quantization", "value": "fp8"}, "numerics[1].name must be a non-empty string, got None"),
        ({**FP8, "setting": "quantisation"}, "numerics[1].setting: the engine has no setting 'quantisation'; known: ["),
        (
            {**FP8, "setting": "cpu.int8_activations"},
            "numerics[1].setting: the engine has no setting 'cpu.int8_activations'; 'cpu' holds ['quantized_weights',",
        ),
        (
            {**FP8, "setting": "speculative_config.method"},
            "numerics[1].setting: the engine has no setting 'speculative_config.method': 'speculative_config' is "
            "not a group of settings",
        ),
        ({**FP8, "setting": "cpu"}, "numerics[1].setting: 'cpu' is a group of engine settings; name one of"),
        ({**FP8, "value": "int4"}, "numerics[1].value: engine setting quantization must be one of ['fp8'] or None"),
        ({**FP8, "value": True}, "numerics[1].value: engine setting quantization must be one of ['fp8']"),
        ({**INT16, "value": "yes"}, "numerics[1].value: engine setting cpu.int16_activations must be true or false"),
        ({**FP8, "value": None}, "numerics[1].value: None is the default of quantization, the option's off"),
        ({**INT16, "value": False}, "numerics[1].value: False is the default of cpu.int16_activations"),
        ({**FP8, "cumulative": "no"}, "numerics[1].cumulative must be true or false, got 'no'"),
        ({**FP8, "note": 3}, "numerics[1].note must be a string, got 3"),
    ],
)
def test_a_bad_numerics_option_is_refused_by_its_key(option, message):
    demo = demo_with([INT16, option])
    where = f"{demo.path}: saaf_harness.report."
    with pytest.raises(HarnessConfigError, match=re.escape(where + message)):
        report_settings(demo, BENCHMARK)
    with pytest.raises(HarnessConfigError, match=re.escape(message)):
        configurations(demo, BENCHMARK, 100)


def test_numerics_must_be_a_list():
    with pytest.raises(HarnessConfigError, match=re.escape("saaf_harness.report.numerics must be a list")):
        report_settings(demo_with({"name": "FP8 weights"}), BENCHMARK)
