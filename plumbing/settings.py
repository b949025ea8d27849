"""Service settings: one typed object per service, each field documented once.

A service's settings are a frozen msgspec Struct whose fields carry their
limits and their documentation in the type::

    class AdmissionSettings(Settings, frozen=True):
        max_step_records: Annotated[int, Meta(ge=1, description=
            "Records decided per step ...")] = 500

From that one declaration come the command-line flag (``--max-step-records``,
its help the description, its default the field's), the environment
variable (``SF_ADMISSION_MAX_STEP_RECORDS``) and the validation of both:
:func:`add_arguments` adds the flags, :func:`from_args` reads defaults <
environment < flags and names the field of a bad value. TEI's
``router/src/main.rs`` documents every flag this way; so does
:class:`plumbing.kafka.KafkaSettings`, the Kafka half of every service.
"""

from __future__ import annotations

import argparse
import os
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec

__all__ = ["ServiceSettings", "Settings", "SettingsError", "add_arguments", "describe", "doc",
           "from_args", "from_env"]

S = TypeVar("S", bound="Settings")
#: How msgspec keeps a ``default_factory`` among a Struct's defaults.
_Factory = type(msgspec.defstruct("_F", [("f", list, msgspec.field(default_factory=list))])
                .__struct_defaults__[0])


def doc(text: str, **limits: Any) -> msgspec.Meta:
    """A field's description (its flag's help) and limits, in one ``Meta``."""
    return msgspec.Meta(description=" ".join(text.split()), **limits)


class Settings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Base of every service's settings: typed, frozen, unknown fields refused."""


class ServiceSettings(Settings, frozen=True):
    """What every service has: its telemetry endpoint, its log sampling, its totals line."""

    metrics_host: Annotated[str, doc(
        "Address of /metrics, /healthz and /readyz (0.0.0.0 in a container).")] = "127.0.0.1"
    metrics_port: Annotated[int | None, doc(
        "Port of /metrics, /healthz and /readyz; unset: no HTTP endpoint, 0: any free "
        "port.")] = None
    log_lines_per_s: Annotated[int, doc(
        "Outcome lines (rejections, batches, expiries, failures) logged per second at "
        "info/warning; the rest of a burst goes to debug and into the totals line.",
        ge=0)] = 20
    totals_log_interval_s: Annotated[float, doc(
        "Period of the <service>_totals info line.", gt=0)] = 30.0


class SettingsError(ValueError):
    """A setting from a flag or the environment that does not validate; names the field."""


class _Field(typing.NamedTuple):
    name: str
    flag: str
    description: str
    default: Any
    is_bool: bool


def describe(cls: type[Settings]) -> list[_Field]:
    """Every field of ``cls``: its flag, its documentation, its default."""
    hints = typing.get_type_hints(cls, include_extras=True)
    defaults = dict(zip(cls.__struct_fields__, _defaults(cls), strict=True))
    out = []
    for name in cls.__struct_fields__:
        hint = hints[name]
        description = ""
        for meta in getattr(hint, "__metadata__", ()):
            description = getattr(meta, "description", None) or description
        base = typing.get_args(hint)[0] if getattr(hint, "__metadata__", None) else hint
        out.append(_Field(name, "--" + name.replace("_", "-"), description,
                          defaults[name], base is bool))
    return out


def _defaults(cls: type[Settings]) -> list[Any]:
    n = len(cls.__struct_fields__)
    given = list(cls.__struct_defaults__)
    out: list[Any] = [msgspec.NODEFAULT] * (n - len(given)) + given
    return [d.factory() if isinstance(d, _Factory) else d for d in out]


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                  cls: type[Settings], *, env_prefix: str, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of ``cls`` (but ``skip``); each defaults to "not given"."""
    for f in describe(cls):
        if f.name in skip:
            continue
        default = "required" if f.default is msgspec.NODEFAULT else f"default {f.default!r}"
        help_ = f"{f.description} [{default}; env {env_prefix}{f.name.upper()}]"
        if f.is_bool:
            parser.add_argument(f.flag, dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction, help=help_)
        else:
            parser.add_argument(f.flag, dest=f.name, default=None, metavar=f.name.upper(),
                                help=help_)


def from_env(cls: type[S], env: Mapping[str, str] | None = None, *, env_prefix: str,
             **given: Any) -> S:
    """``cls`` from ``given`` over ``{env_prefix}{FIELD}`` variables over the defaults."""
    env = os.environ if env is None else env
    values = {f.name: env[key] for f in describe(cls)
              if (key := f"{env_prefix}{f.name.upper()}") in env and env[key] != ""}
    return _convert(cls, values | given)


def from_args(cls: type[S], args: argparse.Namespace, env: Mapping[str, str] | None = None,
              *, env_prefix: str, **given: Any) -> S:
    """``cls`` from flags over the environment over ``given`` over the defaults."""
    flags = {f.name: value for f in describe(cls)
             if (value := getattr(args, f.name, None)) is not None}
    env = os.environ if env is None else env
    values = {f.name: env[key] for f in describe(cls)
              if (key := f"{env_prefix}{f.name.upper()}") in env and env[key] != ""}
    return _convert(cls, given | values | flags)


def _convert(cls: type[S], values: dict[str, Any]) -> S:
    try:
        # strict=False turns "5" into 5 and "true" into True and checks every
        # limit, so a bad value fails here with its field's name.
        return msgspec.convert(values, cls, strict=False)
    except msgspec.ValidationError as e:
        raise SettingsError(f"{cls.__name__}: {e}") from None
