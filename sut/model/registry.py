"""Models by architecture: the checkpoint's config.json `architectures` entry picks the class that
runs it. A new architecture is one file in this package, its entry here, and what its config.json
adds in sut/config/model.py (tests/test_model_registry.py holds the two lists to each other)."""

from sut.config import ModelConfig
from sut.errors import UnsupportedModelError
from sut.model.deepseek_v3 import DeepseekV3ForCausalLM
from sut.model.gpt_oss import GptOssForCausalLM
from sut.model.llama import LlamaForCausalLM

MODELS = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
}


def model_class(config: ModelConfig) -> type:
    """The class that runs `config`'s architecture."""
    try:
        return MODELS[config.architecture]
    except KeyError:
        raise UnsupportedModelError(
            f"architecture {config.architecture!r} has no model class; supported: {list(MODELS)}"
        ) from None
