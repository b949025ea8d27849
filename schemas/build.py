"""Configurations built in code: one builder for tests, benches and examples.

Every test and bench needs a small deployment of its own: a topic prefix, a
tier or two, an endpoint on the fake model, a few orgs. Retyped as TOML in
each file, those snippets drifted apart and hid, in thirty shared lines, the
two that made each one different. :func:`build_config` takes only what
differs, as keyword arguments, and fills in what the snippets shared (when
no ``base`` configuration is given to start from):

* tiers ``gold`` then ``free``, when none are named;
* one endpoint, ``embed``, when none is named;
* for each endpoint the call adds: ``kind`` (``rerank`` for an endpoint of
  that name, else ``embed``) and ``model = "fake"``.

Everything else is the loader's default, as it was in the snippets. A value
of ``None`` anywhere means "not written": it removes a default, or a key of
``base``, so the loader's own default applies.

The result comes three ways (:class:`Built`): ``data``, the TOML-shaped
dict; ``text``, that dict as TOML, for a process that reads its
configuration from a file; and ``config``, what :func:`schemas.config.
parse_config` made of that very text. A configuration the loader would
refuse fails at the call, with the loader's list of problems, never later
inside a service; and the text a process reads is the text the test checked.

Pure data: the standard library and :mod:`schemas` only (a layer contract).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.config import Config, parse_config

__all__ = ["DEFAULT_MODEL", "DEFAULT_TIERS", "Built", "build_config", "to_toml"]

#: The tiers of a configuration that names none, highest first.
DEFAULT_TIERS = ("gold", "free")
#: The model of an endpoint the call adds without naming one: the fake model
#: (``worker/fake.py``), so no test or bench loads weights it did not ask for.
DEFAULT_MODEL = "fake"


@dataclass(frozen=True)
class Built:
    """One configuration as data, as TOML text, and as the loader's checked :class:`Config`."""

    data: dict[str, Any]
    text: str
    config: Config


def build_config(
    *,
    base: Mapping[str, Any] | str | None = None,
    prefix: str | None = None,
    tiers: Sequence[str | Mapping[str, Any]] | None = None,
    endpoints: Mapping[str, Mapping[str, Any] | None] | None = None,
    orgs: Mapping[str, str | Mapping[str, Any] | None] | None = None,
    limits: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]] | None] | None] | None = None,
    **service: Any,
) -> Built:
    """A configuration: ``base`` (TOML text or data; none: the shared defaults) and changes.

    ``prefix`` is ``service.topic_prefix``; any other keyword argument is a
    ``[service]`` setting. ``tiers`` replaces the list: names, or tables
    such as ``{"name": "free", "min_share": 0.3}``. ``endpoints`` maps a name
    to fields; ``orgs`` maps a name to its tier, or to fields (``tier``,
    ``weight``, ``limits``: endpoint -> windows); ``limits`` maps tier ->
    endpoint -> windows, each a dict such as ``{"window_s": 60, "requests":
    3}``. An endpoint, org or tier's limits already there (in ``base``, or
    the defaults above for a new endpoint) takes the fields given and keeps
    the others; a field's value, a mapping such as ``prompts`` included,
    replaces the old one whole. ``None`` removes.

    Raises :class:`schemas.config.ConfigError` for what the loader refuses.
    """
    if base is None:
        data: dict[str, Any] = {}
    else:
        data = tomllib.loads(base) if isinstance(base, str) else _plain(base)
    if prefix is not None:
        service = {"topic_prefix": prefix, **service}
    if service:
        _merge(data.setdefault("service", {}), service)
    if tiers is not None or "tiers" not in data:
        data["tiers"] = list(DEFAULT_TIERS if tiers is None else tiers)
    data["tiers"] = [_plain({"name": t} if isinstance(t, str) else t) for t in data["tiers"]]
    if base is None and not endpoints:
        endpoints = {"embed": {}}
    known = data.setdefault("endpoints", {})
    for name, fields in (endpoints or {}).items():
        if name not in known and fields is not None:
            known[name] = _new_endpoint(name)
    _merge(known, endpoints or {}, levels=1)
    if orgs:
        _merge(data.setdefault("orgs", {}), {
            name: {"tier": spec} if isinstance(spec, str) else spec for name, spec in orgs.items()},
            levels=1)
    if limits:
        _merge(data.setdefault("limits", {}), limits, levels=1)
    text = to_toml(data)
    read_back = tomllib.loads(text)  # what parse_config(text) reads, read once
    if read_back != data:  # a bug of the writer below, never the caller's
        raise ValueError(f"the TOML written does not read back as the data:\n{text}")
    return Built(data=data, text=text, config=parse_config(read_back))


def _new_endpoint(name: str) -> dict[str, Any]:
    return {"kind": "rerank" if name == "rerank" else "embed", "model": DEFAULT_MODEL}


def _merge(into: dict[str, Any], changes: Mapping[str, Any], levels: int = 0) -> None:
    """``changes`` into ``into``: ``None`` removes a key; a mapping merges key by key for
    ``levels`` more levels; any other value, or a mapping below that, replaces (a copy)."""
    for key, value in changes.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, Mapping) and levels > 0:
            if not isinstance(into.get(key), dict):
                into[key] = {}
            _merge(into[key], value, levels - 1)
        else:
            into[key] = _plain(value)


def _plain(value: Any) -> Any:
    """A deep copy as TOML reads it back: dicts for mappings, lists for tuples, no ``None``."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# -- TOML --------------------------------------------------------------------------------
#
# tomllib reads TOML but the standard library writes none. The configuration
# needs only: tables two deep (``[service]``, ``[endpoints.embed]``), arrays of
# tables (``[[tiers]]``, ``[[limits.free.embed]]``), inline tables below that
# (``priority_cap``, ``prompts``), lists and scalars. Written generally enough
# that any such dict round-trips; ``build_config`` checks that it did.

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def to_toml(data: Mapping[str, Any]) -> str:
    """``data`` (str keys; str, int, float, bool, list and dict values) as TOML text."""
    lines: list[str] = []
    _table(lines, (), data)
    return "\n".join(lines).strip("\n") + "\n"


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any],
           array: bool = False) -> None:
    pairs = {k: v for k, v in table.items() if not _is_table(path, v)}
    if array:
        lines += ["", f"[[{_path(path)}]]"]
    elif path and (pairs or not table):  # a table of only sub-tables needs no header
        lines += ["", f"[{_path(path)}]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in pairs.items()]
    for key, value in table.items():
        if key in pairs:
            continue
        if isinstance(value, Mapping):
            _table(lines, (*path, key), value)
        else:
            for element in value:
                _table(lines, (*path, key), element, array=True)


def _is_table(path: tuple[str, ...], value: Any) -> bool:
    """Written as a ``[table]`` or ``[[array]]`` rather than inline, after the plain keys."""
    if isinstance(value, Mapping):
        # Two levels down (``endpoints.embed.priority_cap``) a mapping reads best inline,
        # unless it holds an array of tables (``orgs.acme.limits``).
        return len(path) < 2 or any(_is_array_of_tables(v) for v in value.values())
    return _is_array_of_tables(value)


def _is_array_of_tables(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(v, Mapping) for v in value))


def _path(path: tuple[str, ...]) -> str:
    return ".".join(_key(k) for k in path)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"TOML keys are strings, not {type(key).__name__}: {key!r}")
    return key if _BARE_KEY.match(key) else _string(key)


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch < " " or ch == "\x7f":  # control characters TOML allows only escaped
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for a {type(value).__name__}: {value!r}")
