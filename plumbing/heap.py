"""The garbage collector's settings for a process that has finished starting.

CPython frees almost everything a service makes by reference counting; its
cyclic collector, which finds the rest, walks every tracked object of a
generation each time it runs. A service's start-up leaves tens of thousands
of such objects alive for good (modules, configuration, clients), a worker
with a real model about 420,000 (torch and sentence-transformers), and each
collection of the oldest generation walked them all again: measured in the
demo, full collections of 52-95 ms in admission and the scheduler during its
bursts, and 213-297 ms for one in a process that has imported torch and
sentence-transformers (``docs/benchmarks.md``, "Collector pauses").

:func:`settle` is called once a process has started (the model loaded, the
clients connected): one full collection, then :func:`gc.freeze`, which moves
every object alive into a permanent generation that no later collection
walks. Objects made later are collected as before; a frozen object that
becomes garbage is still freed by its reference count (only a frozen
reference cycle would stay, and the collection just before the freeze
clears those that exist then).

The young generation's threshold is raised from 700 to
:data:`YOUNG_THRESHOLD` allocations: at hundreds of allocations per request,
700 meant a collection every few requests, each one moving the requests in
flight one generation older, to be walked again there.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle"]

#: Allocations (net of deallocations) between two collections of the young
#: generation; CPython's default is 700.
YOUNG_THRESHOLD = 10_000


def settle() -> int:
    """Collect once, freeze what is alive, raise the young threshold; objects frozen."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    return gc.get_freeze_count()
