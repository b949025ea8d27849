"""Admitted requests decoded with each distinct name checked once.

msgspec checks a string's ``pattern`` with a regular expression call per
value: for an :class:`~schemas.messages.AdmittedRequest` four of them (its
id, org, endpoint and reply topic), about 1.0 of the 1.4 us a request of a
pack took to decode (a scratch timing on the 2-core machine, packs of 20).
But an org, an endpoint and a reply topic repeat over thousands of requests.

:data:`LooseAdmitted` is an ``AdmittedRequest`` whose names keep their
length limits but not their patterns; :func:`names_ok` then checks each
name against the very pattern ``AdmittedRequest`` declares for it: the id
every time, every other name once per distinct value (remembered, at most
:data:`KNOWN_MAX` values per field, then forgotten and checked again). A
``LooseAdmitted`` is an ``AdmittedRequest`` (``isinstance``), is equal to
one with the same fields, and encodes to the same bytes; its ``repr`` names
``AdmittedRequest``.

A caller that finds a name wrong decodes strictly instead, so every error,
and every record accepted, is exactly what the strict decoder gives
(:func:`schemas.packs.unpack_requests` does).

Pure: no I/O; the remembered names are this process's.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from msgspec import Meta

from schemas.messages import AdmittedRequest

__all__ = ["KNOWN_MAX", "LooseAdmitted", "LoosePack", "names_ok"]

#: Distinct values remembered per field before the memory is cleared.
KNOWN_MAX = 4096

_META_FIELDS = ("gt", "ge", "lt", "le", "multiple_of", "min_length", "max_length", "tz",
                "title", "description", "examples", "extra_json_schema", "extra")


def _patterned() -> dict[str, tuple[Any, str]]:
    """AdmittedRequest's fields whose type carries a pattern: name -> (type without the
    pattern, the pattern)."""
    out = {}
    for f in msgspec.structs.fields(AdmittedRequest):
        if typing.get_origin(f.type) is not typing.Annotated:
            continue
        base, *metas = typing.get_args(f.type)
        patterns = [m.pattern for m in metas if isinstance(m, Meta) and m.pattern]
        if not patterns:
            continue
        assert len(patterns) == 1, f"{f.name}: one pattern"
        loose = []
        for m in metas:
            if isinstance(m, Meta):
                kept = {k: v for k in _META_FIELDS if (v := getattr(m, k)) is not None}
                # Everything but the pattern carried over (a constraint msgspec adds
                # later and this list lacks would otherwise be dropped unseen).
                assert Meta(**kept, pattern=m.pattern) == m, f"{f.name}: {m!r} not rebuilt"
                m = Meta(**kept)
            loose.append(m)
        out[f.name] = (typing.Annotated[(base, *loose)], patterns[0])
    return out


_PATTERNED = _patterned()


def _eq(self: Any, other: Any) -> Any:
    if isinstance(other, AdmittedRequest):
        return msgspec.structs.astuple(self) == msgspec.structs.astuple(other)
    return NotImplemented


def _ne(self: Any, other: Any) -> Any:
    same = _eq(self, other)
    return same if same is NotImplemented else not same


_loose: Any = msgspec.defstruct(
    "AdmittedRequest", [(name, typ) for name, (typ, _) in _PATTERNED.items()],
    bases=(AdmittedRequest,), module=__name__, kw_only=True,
    namespace={"__eq__": _eq, "__ne__": _ne,
               "__doc__": "An AdmittedRequest decoded without its names' patterns "
                          "(schemas.names)."})
#: An AdmittedRequest whose names are checked by :func:`names_ok`, not by the decoder.
LooseAdmitted = typing.cast("type[AdmittedRequest]", _loose)
#: An AdmittedPack of :data:`LooseAdmitted` (its ``requests``, at least one).
LoosePack: Any = msgspec.defstruct(
    "LoosePack", [("requests", typing.Annotated[list[_loose], Meta(min_length=1)])],
    module=__name__)

_search: dict[str, Callable[[str], Any]] = {
    name: re.compile(pattern).search for name, (_, pattern) in _PATTERNED.items()}
#: Values of each field (but the id) that matched its pattern.
_known: dict[str, set[str]] = {name: set() for name in _PATTERNED if name != "id"}


def names_ok(requests: Iterable[AdmittedRequest]) -> bool:
    """Does every name of ``requests`` match its pattern in ``AdmittedRequest``?"""
    id_ok = _search["id"]
    checks = [(name, _search[name], known) for name, known in _known.items()]
    for r in requests:
        if id_ok(r.id) is None:
            return False
        for name, search, known in checks:
            value = getattr(r, name)
            if value in known:
                continue
            if search(value) is None:
                return False
            if len(known) >= KNOWN_MAX:
                known.clear()
            known.add(value)
    return True
