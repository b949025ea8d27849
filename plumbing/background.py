"""A part of a service that runs a loop of its own: started, stopped, never left behind.

The broker watch, the topic keeper and the state follower each loop beside a
service; they share how the loop is started as a named task and how a stop
cancels it and waits for it (``Service.keep`` stops them with the service).
The wait is bounded: a loop that does not end within ``stop_s`` of its
cancellation is logged (``stop_timed_out``) and left behind, and the
service's stop goes on.
"""

from __future__ import annotations

import asyncio
from typing import Self

from plumbing.bounded import cancel_within
from plumbing.logs import get_logger

__all__ = ["Background"]

log = get_logger("background")


class Background:
    """``run()`` as a task between :meth:`start` and :meth:`stop`; subclasses write ``run``."""

    #: The task's name (``<service>-<what>`` reads well in a dump of the loop).
    task_name = "background"
    #: How long :meth:`stop` waits for the cancelled loop to end.
    stop_s = 5.0
    _task: asyncio.Task | None = None

    async def run(self) -> None:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def start(self) -> Self:
        self._task = asyncio.create_task(self.run(), name=self.task_name)
        return self

    async def stop(self) -> None:
        """Cancel the loop and wait for it, ``stop_s`` at most (a line says when it did not end)."""
        if self._task is not None:
            task, self._task = self._task, None
            await cancel_within([task], self.stop_s, f"{self.task_name} to end", log=log)
