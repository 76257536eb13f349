"""Where a system's files lie under a root (the repository, or a test's copy of it): the one place
that spells the committed settings' and the build's folders, for the harness, the chain, the
packager and the report alike.

    measurements/<system>/<benchmark>/<Scenario>/      user.conf, README.md, measurements.json
    build/logs/<system>/<benchmark>/<Scenario>/<mode>/ one run's logs (calibration/ beside the modes)
    build/submission/                                  the tree `make submission` builds
    build/report/                                      the measurement report's page
"""

from pathlib import Path


def build_dir(root: Path) -> Path:
    """build/: everything the runs, the chain and the report write."""
    return Path(root) / "build"


def logs_dir(root: Path) -> Path:
    """build/logs/: every system's run logs."""
    return build_dir(root) / "logs"


def scenario_logs(root: Path, system: str, benchmark: str, scenario: str) -> Path:
    """build/logs/<system>/<benchmark>/<Scenario>/: a scenario's runs, one folder per mode."""
    return logs_dir(root) / system / benchmark / scenario


def run_logs(root: Path, system: str, benchmark: str, scenario: str, mode: str) -> Path:
    """build/logs/<system>/<benchmark>/<Scenario>/<mode>/: one run's logs."""
    return scenario_logs(root, system, benchmark, scenario) / mode


def scenario_settings(root: Path, system: str, benchmark: str, scenario: str) -> Path:
    """measurements/<system>/<benchmark>/<Scenario>/: the scenario's committed settings and papers."""
    return Path(root) / "measurements" / system / benchmark / scenario


def committed_user_conf(root: Path, system: str, benchmark: str, scenario: str) -> Path:
    """measurements/<system>/<benchmark>/<Scenario>/user.conf: the scenario's committed LoadGen settings."""
    return scenario_settings(root, system, benchmark, scenario) / "user.conf"


def submission_dir(root: Path) -> Path:
    """build/submission/: the submission tree's default place."""
    return build_dir(root) / "submission"


def report_dir(root: Path) -> Path:
    """build/report/: the measurement report's default place."""
    return build_dir(root) / "report"
