"""The engine's error types: each names what was wrong; and how a command-line tool reports them."""

import sys
from collections.abc import Callable


class SaafError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidRequestError(SaafError, ValueError):
    """A request the engine refuses: empty or too-long prompt, unknown token id, bad sampling params."""


class ConfigError(SaafError, ValueError):
    """A malformed or unsupported engine or model configuration."""


class UnsupportedModelError(ConfigError):
    """A model folder whose architecture this engine does not implement."""


class CheckpointError(SaafError):
    """A model folder with missing, truncated or mismatched weight files."""


class WorkerError(SaafError):
    """A process of the engine's (a data-parallel replica, a tensor-parallel rank) died or could not
    start: the engine cannot go on."""


def run_cli(main: Callable[[], object], errors: tuple[type[BaseException], ...] = (SaafError,)) -> None:
    """Run a command-line entry point: an error of `errors` (a user's mistake: a bad setting, a
    missing file) ends it with `error: <message>` on stderr and exit status 2, not a traceback."""
    try:
        main()
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
