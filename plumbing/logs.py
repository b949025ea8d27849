"""Logging: structlog, JSON lines when not on a TTY, a console renderer otherwise.

Services log one canonical, past-tense event per outcome (``request_admitted``,
``batch_emitted``, ``request_rejected``...) with ids bound through contextvars
(``structlog.contextvars.bound_contextvars(request_id=..., org=...)``), so
every line of one request's story carries its ids. The scheduler core never
logs; the services around it do.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from structlog.types import Processor

__all__ = ["LogSampler", "configure_logging", "debug_enabled", "get_logger"]

#: The level configured last (``configure_logging``); INFO until then.
_level = logging.INFO


def configure_logging(level: str | None = None, *, json: bool | None = None, stream=None) -> None:
    """Set up structlog and the standard library logging it sits on.

    ``json=None`` chooses JSON when ``stream`` is not a TTY (services under a
    supervisor, CI, docker) and a readable console format otherwise.
    ``SF_LOG_LEVEL`` and ``SF_LOG_JSON`` (``1``/``0``) override the defaults;
    ``SF_LOG_LEVEL_AIOKAFKA`` (WARNING by default) is aiokafka's own level.
    Every line names its ``logger`` (``admission``, ``scheduler``, ``worker``,
    ``aiokafka``...), so the services can share one file. Lines of libraries
    that log through the standard library (aiokafka's warnings) are rendered
    the same way, so a JSON stream holds nothing but JSON lines.
    """
    global _level
    stream = stream or sys.stderr
    level = (level or os.environ.get("SF_LOG_LEVEL") or "INFO").upper()
    _level = logging.getLevelName(level)
    env_json = os.environ.get("SF_LOG_JSON")
    if json is None:
        json = env_json == "1" if env_json in ("0", "1") else not stream.isatty()
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: list[Processor]
    if json:
        renderer = [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]
    else:
        renderer = [structlog.dev.ConsoleRenderer(colors=stream.isatty())]
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=_NamedLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    # Libraries (aiokafka) log through the standard library: keep their
    # warnings, rendered like ours. One handler of ours on the root logger,
    # replaced (never added twice) when logging is configured again.
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "_sf_handler", False)]:
        root.removeHandler(h)
    handler = logging.StreamHandler(stream)
    setattr(handler, "_sf_handler", True)  # noqa: B010 - our mark, read back by getattr above
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer]))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    # Every request and response, every metadata update: what found the
    # producer that lost its metadata (plumbing.kafka.Producer). Heavy.
    logging.getLogger("aiokafka").setLevel(
        os.environ.get("SF_LOG_LEVEL_AIOKAFKA", "WARNING").upper())


def _add_logger_name(logger: Any, method_name: str,
                     event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    record = event_dict.get("_record")  # a standard library record (aiokafka)
    name = record.name if record is not None else getattr(logger, "name", None)
    if name:
        event_dict["logger"] = name
    return event_dict


class _NamedLoggerFactory:
    """Loggers that remember the name they were asked for (``get_logger("worker")``).

    ``WriteLogger`` writes a line and its newline in one call (``print`` makes
    two), so processes sharing one log file (the demo's) never split a line.
    """

    def __init__(self, stream):
        self._stream = stream

    def __call__(self, *args) -> _NamedWriteLogger:
        logger = _NamedWriteLogger(self._stream)
        logger.name = args[0] if args and isinstance(args[0], str) else None
        return logger


class _NamedWriteLogger(structlog.WriteLogger):
    """A ``WriteLogger`` with the name it was asked for (``_add_logger_name`` reads it)."""

    name: str | None = None


def debug_enabled() -> bool:
    """True when debug lines are written: a hot path builds them only then."""
    return _level <= logging.DEBUG


def get_logger(name: str | None = None, **bound) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name, **bound) if name else structlog.get_logger(**bound)


class LogSampler:
    """Allows at most ``per_s`` log lines per clock second; counts the rest.

    A burst (a flooding org's rejections, a storm of expiries, thousands of
    batches a second on a fast model) would otherwise print one line per
    outcome. Callers log the lines it refuses at debug instead; the
    suppressed ones still count in metrics and in the totals line.
    """

    def __init__(self, per_s: int):
        self.per_s = per_s
        self.suppressed = 0
        self._second = -1
        self._used = 0

    def allow(self, now_ms: float) -> bool:
        second = int(now_ms // 1000)
        if second != self._second:
            self._second, self._used = second, 0
        if self._used < self.per_s:
            self._used += 1
            return True
        self.suppressed += 1
        return False

    def log(self, logger, level: str, event: str, now_ms: float, **fields) -> None:
        """Log ``event`` at ``level`` while this second's allowance lasts, else at debug."""
        (getattr(logger, level) if self.allow(now_ms) else logger.debug)(event, **fields)
