"""A part of a service that runs a loop of its own: started, stopped, never left behind.

The broker watch, the topic keeper and the state follower each loop beside a
service; they share how the loop is started as a named task and how a stop
cancels it and waits for it (``Service.keep`` stops them with the service).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self

__all__ = ["Background"]


class Background:
    """``run()`` as a task between :meth:`start` and :meth:`stop`; subclasses write ``run``."""

    #: The task's name (``<service>-<what>`` reads well in a dump of the loop).
    task_name = "background"
    _task: asyncio.Task | None = None

    async def run(self) -> None:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def start(self) -> Self:
        self._task = asyncio.create_task(self.run(), name=self.task_name)
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
