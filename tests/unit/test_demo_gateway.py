"""The demo's keys: made at its start, only their hashes in the configuration the services read."""

from pathlib import Path

import msgspec

from app.demo import DEFAULT_CONFIG, PACED_ORGS
from app.demo_gateway import config_with_keys, demo_keys
from gateway.keys import KEY_PREFIX, KeyRing, hash_key
from schemas.config import load_config, parse_config


def test_the_services_config_lists_each_paced_orgs_key_hash_and_nothing_else_changes():
    """Each paced org's key proves that org (by its hash), the bursting org has none, the
    keys' text is nowhere in the TOML, and the rest equals examples/demo.toml."""
    keys = demo_keys(PACED_ORGS)
    assert len(set(keys.values())) == len(PACED_ORGS)
    assert all(k.startswith(KEY_PREFIX) for k in keys.values())
    text = config_with_keys(DEFAULT_CONFIG, keys)
    assert not any(key in text for key in keys.values())
    config = parse_config(text)
    ring = KeyRing.of(config)
    for org, key in keys.items():
        assert config.orgs[org].api_keys == [hash_key(key)]
        assert ring.org_of(f"Bearer {key}") == org
    assert config.orgs["bulkcorp"].api_keys == []
    original = load_config(Path(DEFAULT_CONFIG))
    unkeyed = {name: msgspec.structs.replace(org, api_keys=[])
               for name, org in config.orgs.items()}
    assert msgspec.structs.replace(config, orgs=unkeyed) == original


def test_every_run_makes_new_keys():
    """Two runs' keys share nothing: none is fixed in the code."""
    assert not set(demo_keys(PACED_ORGS).values()) & set(demo_keys(PACED_ORGS).values())
