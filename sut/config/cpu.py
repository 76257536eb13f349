"""The CPU backend's engine settings: the `cpu` object of the engine settings, e.g.
`LLM(folder, cpu={"int16_activations": True})` or `"engine": {"cpu": {"int16_activations": true}}`
in a system file. They act only on a CPU device in fp32; elsewhere they are checked and ignored."""

from dataclasses import asdict, dataclass, fields

from sut.errors import ConfigError


@dataclass(frozen=True)
class CpuSettings:
    # Small batches computed from the quantized weights (Q4_1/Q8_0 blocks) the model folder keeps
    # beside its fp32 checkpoint, when it has them: exact, since the fp32 weights were rebuilt from
    # them (quant.py).
    quantized_weights: bool = True
    # With quantized_weights: every linear's input rounded to int16 per block of 32 where that is
    # the faster path (faster, not exact).
    int16_activations: bool = False

    @staticmethod
    def from_value(value) -> "CpuSettings":
        """From the engine setting `cpu`: a dict of these settings (or a CpuSettings, checked the same way)."""
        if isinstance(value, CpuSettings):
            value = asdict(value)
        known = [f.name for f in fields(CpuSettings)]
        if not isinstance(value, dict):
            raise ConfigError(f"engine setting cpu must be an object with the settings {known}, got {value!r}")
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ConfigError(f"unknown engine setting(s) {['cpu.' + k for k in unknown]}; known cpu settings: {known}")
        for name in known:
            if name in value and not isinstance(value[name], bool):
                raise ConfigError(f"engine setting cpu.{name} must be true or false, got {value[name]!r}")
        settings = CpuSettings(**value)
        if settings.int16_activations and not settings.quantized_weights:
            raise ConfigError(
                "engine setting cpu.int16_activations needs cpu.quantized_weights "
                "(it computes from the quantized weights)"
            )
        return settings
