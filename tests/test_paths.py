"""The one place that spells the build and measurement folders (systems/paths.py): the layout the
README, the packager and the tree's users read, spelled out here by hand."""

from pathlib import Path

from systems import paths


def test_the_folders_of_a_root():
    root = Path("/r")
    assert paths.build_dir(root) == Path("/r/build")
    assert paths.logs_dir(root) == Path("/r/build/logs")
    assert paths.scenario_logs(root, "s", "b", "Server") == Path("/r/build/logs/s/b/Server")
    assert paths.run_logs(root, "s", "b", "Server", "TEST06") == Path("/r/build/logs/s/b/Server/TEST06")
    assert paths.scenario_settings(root, "s", "b", "Offline") == Path("/r/measurements/s/b/Offline")
    assert paths.committed_user_conf(root, "s", "b", "Offline") == Path("/r/measurements/s/b/Offline/user.conf")
    assert paths.submission_dir(root) == Path("/r/build/submission")
    assert paths.report_dir(root) == Path("/r/build/report")
    assert paths.build_dir("rel") == Path("rel/build")  # a root given as text too
