"""The engine-client interface (sut/engine/client.py): the in-process engine and the replica pool
each implement all of it, with its signatures, and are what make_engine returns."""

import inspect
import multiprocessing

import pytest

from sut import EngineClient, LLMEngine, ReplicaPool, make_engine
from sut.config import EngineConfig
from sut.config.resolved import ResolvedConfig
from sut.errors import ConfigError

METHODS = [name for name, value in vars(EngineClient).items() if inspect.isfunction(value) and not name.startswith("_")]
ATTRIBUTES = list(EngineClient.__annotations__)


def test_the_interface_names_what_the_harness_drives():
    assert {"add_request", "submit", "step", "abort", "fail_all", "warmup", "close"} <= set(METHODS)
    assert {"max_model_len", "device", "dtype", "tokenizer"} <= set(ATTRIBUTES)


@pytest.mark.parametrize("engine_class", [LLMEngine, ReplicaPool])
def test_each_engine_has_every_method_with_its_signature(engine_class):
    for name in METHODS:
        mine, interface = inspect.signature(getattr(engine_class, name)), inspect.signature(getattr(EngineClient, name))
        assert list(mine.parameters) == list(interface.parameters), (engine_class.__name__, name)


def test_make_engine_returns_an_engine_client(tiny_llama, tmp_path):
    engine = make_engine(tiny_llama[0], num_kv_blocks=64, device="cpu")
    try:
        assert isinstance(engine, LLMEngine) and isinstance(engine, EngineClient)
        for name in ATTRIBUTES:
            assert getattr(engine, name, "absent") != "absent", name
    finally:
        engine.close()


@pytest.mark.slow
def test_settings_are_checked_once_and_workers_get_them_resolved(tiny_llama, monkeypatch):
    """make_engine parses the settings once; a tensor-parallel rank is started with the resolved
    config (no raw settings to check again), and a setting that does not fit the model is refused
    before any process starts."""
    calls = []
    parse = EngineConfig.from_kwargs
    monkeypatch.setattr(EngineConfig, "from_kwargs", staticmethod(lambda **kw: calls.append(kw) or parse(**kw)))
    with pytest.raises(ConfigError, match="tensor_parallel_size=3 does not divide"):
        make_engine(tiny_llama[0], num_kv_blocks=64, device="cpu", tensor_parallel_size=3)
    assert multiprocessing.active_children() == []
    calls.clear()
    engine = make_engine(tiny_llama[0], num_kv_blocks=64, device="cpu", tensor_parallel_size=2)
    try:
        assert len(calls) == 1
        rank_args = engine.ranks.args[0]
        assert [type(a) for a in rank_args if isinstance(a, (ResolvedConfig, dict))] == [ResolvedConfig]
    finally:
        engine.close()
