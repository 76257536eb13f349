"""A user's error ends every CLI in one `error:` line naming what was wrong, a non-zero exit
status and no traceback: an unknown system, a bad engine setting in a system file, a missing
tree or run logs, a missing model folder."""

import json
import shutil
import subprocess
import sys

import pytest

from systems.schema import REPO


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=REPO, capture_output=True, text=True)


def assert_one_error_line(done, *names):
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    for name in names:
        assert name in errors[0], (name, errors[0])


@pytest.fixture
def root(tmp_path):
    """A repository-like folder with one system `t` whose engine block says max_num_seqs -3."""
    system = {
        "division": "open",
        "submitter": "TestOrg",
        "saaf_harness": {
            "model": str(tmp_path / "model"),
            "datasets": {"llama3.1-8b": str(tmp_path / "d.json")},
            "engine": {"max_num_seqs": -3},
            "scenarios": ["Offline"],
        },
    }
    (tmp_path / "systems").mkdir()
    (tmp_path / "systems" / "t.json").write_text(json.dumps(system))
    return tmp_path


BAD_ENGINE = (
    "t.json: saaf_harness engine settings for llama3.1-8b Offline",
    "max_num_seqs must be a positive integer, got -3",
)


@pytest.mark.slow
def test_harness_run_unknown_system():
    assert_one_error_line(run_cli("harness", "run", "--system", "nope"), "unknown system 'nope'")


@pytest.mark.slow
def test_harness_run_bad_engine_setting(root):
    done = run_cli("harness", "run", "--system", "t", "--root", root)
    assert_one_error_line(done, *BAD_ENGINE)
    assert not (root / "build").exists()  # found before any run started


@pytest.mark.slow
def test_calibrate_unknown_system():
    assert_one_error_line(run_cli("harness.measure.calibrate", "--system", "nope"), "unknown system 'nope'")


def test_submission_unknown_system():
    assert_one_error_line(run_cli("harness.submission", "--system", "nope"), "unknown system 'nope'")


@pytest.mark.slow
def test_submission_names_the_failed_run_and_its_error(root, smollm2_dir):
    # What the chain checks before its first run is there: the dataset and the model's tokenizer.
    (root / "d.json").write_text(json.dumps([{"tok_input": [1, 2, 3], "output": "a summary"}]))
    (root / "model").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(smollm2_dir / name, root / "model" / name)
    done = run_cli("harness.submission", "--system", "t", "--root", root, "--out", root / "submission")
    assert_one_error_line(
        done,
        "harness run --system t --benchmark llama3.1-8b --scenario Offline --mode performance",
        "failed",
        *BAD_ENGINE,
    )


def test_package_unknown_system(tmp_path):
    done = run_cli("compliance.package", "--system", "nope", "--out", tmp_path)
    assert_one_error_line(done, "unknown system 'nope'")


def test_package_without_runs(root):
    system = json.loads((root / "systems" / "t.json").read_text())
    system["saaf_harness"]["engine"] = {}
    (root / "systems" / "t.json").write_text(json.dumps(system))
    done = run_cli("compliance.package", "--system", "t", "--root", root, "--out", root / "submission")
    assert_one_error_line(done, "measurements/t/llama3.1-8b/Offline/measurements.json is missing: the system")


def test_check_missing_tree(tmp_path):
    assert_one_error_line(run_cli("compliance.check", tmp_path / "none"), "none is not a folder")


@pytest.mark.slow
def test_reference_run_missing_model(tmp_path):
    done = run_cli(
        "accuracy.reference_run",
        "--model",
        tmp_path / "none",
        "--dataset",
        tmp_path / "d.json",
        "--out",
        tmp_path / "out.json",
    )
    assert_one_error_line(done, "none: not a model folder")


@pytest.mark.slow
def test_a_system_file_that_is_not_json(root):
    (root / "systems" / "t.json").write_text("{")
    assert_one_error_line(
        run_cli("harness", "run", "--system", "t", "--root", root), "t.json: needs a 'saaf_harness' object"
    )


def test_test06_missing_log(tmp_path):
    done = run_cli(
        "compliance.test06", "--logs", tmp_path / "none", "--out", tmp_path, "--scenario", "Offline", "--eos-id", "2"
    )
    assert_one_error_line(done, "none/mlperf_log_accuracy.json: accuracy log not found")


@pytest.mark.slow
def test_harness_run_takes_engine_settings_from_a_yaml_file(root):
    """--config FILE.yaml lays its settings over the system's (here fixing its bad max_num_seqs, so the
    run gets as far as its missing user.conf); --engine goes over both; a file that is not a
    mapping of settings is refused by name."""
    good = root / "engine.yaml"
    good.write_text("# the Server settings\nmax_num_seqs: 4\ncpu:\n  int16_activations: false\n")
    done = run_cli("harness", "run", "--system", "t", "--root", root, "--config", good)
    assert_one_error_line(done, "Offline/user.conf: user.conf not found")
    done = run_cli(
        "harness", "run", "--system", "t", "--root", root, "--config", good, "--engine", '{"max_num_seqs": -7}'
    )
    assert_one_error_line(done, "max_num_seqs must be a positive integer, got -7")
    listed = root / "list.yaml"
    listed.write_text("- max_num_seqs\n- 4\n")
    done = run_cli("harness", "run", "--system", "t", "--root", root, "--config", listed)
    assert_one_error_line(done, "list.yaml: expected a mapping of engine settings, got list")
    broken = root / "broken.yaml"
    broken.write_text("max_num_seqs: [4\n")
    assert_one_error_line(
        run_cli("harness", "run", "--system", "t", "--root", root, "--config", broken), "broken.yaml: not valid YAML"
    )
