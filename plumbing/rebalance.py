"""The one rebalance listener: a group consumer's revoke and assign, handed to callables.

aiokafka calls a :class:`~aiokafka.abc.ConsumerRebalanceListener` around
every rebalance (eagerly: every partition is revoked, then the new set is
assigned). Each service reacts in its own way (admission drops what it read
ahead, the scheduler hands back what it holds, a worker finishes the
batches of revoked partitions, the leader election suspends dispatch);
this listener only routes the two events, sync or async, with the
partitions as a list.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.abc import ConsumerRebalanceListener

__all__ = ["Rebalance"]

Handler = Callable[[list[Any]], Awaitable[None] | None]


class Rebalance(ConsumerRebalanceListener):
    """Calls ``on_revoked(partitions)`` before a rebalance, ``on_assigned(partitions)`` after."""

    def __init__(self, *, on_revoked: Handler | None = None,
                 on_assigned: Handler | None = None):
        self._revoked = on_revoked
        self._assigned = on_assigned

    async def on_partitions_revoked(self, revoked) -> None:
        await _call(self._revoked, revoked)

    async def on_partitions_assigned(self, assigned) -> None:
        await _call(self._assigned, assigned)


async def _call(handler: Handler | None, partitions) -> None:
    if handler is None:
        return
    got = handler(list(partitions))
    if inspect.isawaitable(got):
        await got
