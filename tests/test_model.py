import doctest

import pytest

import sim
from sim.errors import SpecError
from sim.spec.model import ModelSpec
from sim.spec.zoo import load_model, load_zoo, zoo_names


def test_zoo_presets_present():
    assert {"tiny", "gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b",
            "mixtral-8x7b"} <= set(zoo_names())


def test_derived_sizes():
    m = load_zoo("llama3-70b")
    assert (m.kv_heads, m.head_size, m.q_dim, m.kv_dim) == (8, 128, 8192, 1024)
    assert load_zoo("mixtral-8x7b").num_moe_layers == 32


def test_round_trip():
    m = load_zoo("mixtral-8x7b")
    assert ModelSpec.from_dict(m.to_dict()) == m


@pytest.mark.parametrize("kw,match", [
    (dict(num_layers=0), "num_layers: must be a positive integer"),
    (dict(num_kv_heads=3), "multiple of num_kv_heads"),
    (dict(norm="batchnorm"), "model.norm"),
    (dict(num_experts=8, top_k=9), "top_k: must be in 1..num_experts=8"),
    (dict(top_k=2), "num_experts is 0"),
])
def test_model_validation(kw, match):
    base = dict(name="m", num_layers=2, hidden_size=64, num_heads=8, ffn_hidden_size=128,
                vocab_size=100)
    with pytest.raises(SpecError, match=match):
        ModelSpec(**{**base, **kw})


def test_unknown_zoo_name():
    with pytest.raises(SpecError, match="unknown zoo preset 'gpt5'"):
        load_model("gpt5")


def test_model_toml(tmp_path):
    (tmp_path / "mine.toml").write_text("num_layers = 2\nhidden_size = 64\nnum_heads = 4\n"
                                        "ffn_hidden_size = 256\nvocab_size = 1000\n")
    assert load_model(str(tmp_path / "mine.toml")).name == "mine"
    (tmp_path / "bad.toml").write_text("num_layers = 2\nwidth = 3\n")
    with pytest.raises(SpecError, match="width: unknown field"):
        load_model(str(tmp_path / "bad.toml"))


def test_package_doctest():
    assert doctest.testmod(sim).failed == 0


def test_every_sim_doctest():
    """The examples in every ``sim`` module's docstrings run (after the restructure they
    live in spec/, network/, cost/, analytic/...)."""
    import importlib
    import pkgutil

    attempted = 0
    for info in pkgutil.walk_packages(sim.__path__, "sim."):
        result = doctest.testmod(importlib.import_module(info.name))
        assert result.failed == 0, info.name
        attempted += result.attempted
    assert attempted >= 8
