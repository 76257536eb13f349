"""The model registry: a checkpoint's `architectures` picks the class the loader builds."""

import dataclasses

import pytest
import torch

from sut.config import SUPPORTED_ARCHITECTURES, ModelConfig
from sut.errors import UnsupportedModelError
from sut.model import MODELS, model_class
from sut.model.llama import LlamaForCausalLM
from sut.model.loader import load_model
from tests.helpers import TINY_CONFIG


def test_every_architecture_the_config_reads_has_a_model_class_and_no_other():
    assert set(MODELS) == set(SUPPORTED_ARCHITECTURES)


def test_the_config_names_the_architecture_the_loader_builds(tiny_llama):
    folder, _ = tiny_llama
    config = ModelConfig.from_folder(folder)
    assert config.architecture == "LlamaForCausalLM"
    assert model_class(config) is LlamaForCausalLM
    assert isinstance(load_model(folder, config, torch.float32, torch.device("cpu")), LlamaForCausalLM)


def test_the_supported_architecture_is_picked_among_several():
    raw = {**TINY_CONFIG, "architectures": ["SomethingElse", "LlamaForCausalLM"]}
    assert ModelConfig.from_dict(raw).architecture == "LlamaForCausalLM"


def test_an_architecture_without_a_class_is_refused_by_name():
    config = dataclasses.replace(
        ModelConfig.from_dict({**TINY_CONFIG, "architectures": ["LlamaForCausalLM"]}),
        architecture="Qwen3ForCausalLM",
    )
    with pytest.raises(UnsupportedModelError, match=r"'Qwen3ForCausalLM' has no model class; supported: \['Llama"):
        model_class(config)
