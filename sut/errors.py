"""The engine's error types: each names what was wrong."""


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
