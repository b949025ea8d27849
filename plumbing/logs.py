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

import structlog

__all__ = ["LogSampler", "configure_logging", "get_logger"]


def configure_logging(level: str | None = None, *, json: bool | None = None, stream=None) -> None:
    """Set up structlog and the standard library logging it sits on.

    ``json=None`` chooses JSON when ``stream`` is not a TTY (services under a
    supervisor, CI, docker) and a readable console format otherwise.
    ``SF_LOG_LEVEL`` and ``SF_LOG_JSON`` (``1``/``0``) override the defaults.
    """
    stream = stream or sys.stderr
    level = (level or os.environ.get("SF_LOG_LEVEL") or "INFO").upper()
    env_json = os.environ.get("SF_LOG_JSON")
    if json is None:
        json = env_json == "1" if env_json in ("0", "1") else not stream.isatty()
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json:
        renderer = [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]
    else:
        renderer = [structlog.dev.ConsoleRenderer(colors=stream.isatty())]
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries (aiokafka) log through the standard library: keep their warnings.
    logging.basicConfig(level=logging.WARNING, stream=stream, format="%(levelname)s %(name)s %(message)s")


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
