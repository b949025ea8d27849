"""Times every collection of CPython's cyclic collector, in every process.

Put this directory on ``PYTHONPATH`` and set ``SF_GCWATCH_DIR``: each Python
process started then (the services, the demo's clients, a bench) writes one
JSON file there at exit with its command line and each collection's
generation, wall-clock duration, and whether the process had already
frozen its start-up heap (``plumbing.heap.settle``). ``bench/investigations/gc_pauses.py``
prints them side by side. Without ``SF_GCWATCH_DIR`` this does nothing.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time

_DIR = os.environ.get("SF_GCWATCH_DIR")

if _DIR:
    _pauses: list[tuple[int, float, bool]] = []
    _t0 = [0.0]

    def _timed(phase: str, info: dict) -> None:
        if phase == "start":
            _t0[0] = time.perf_counter()
        else:
            _pauses.append((info["generation"], time.perf_counter() - _t0[0],
                            gc.get_freeze_count() > 0))

    def _write() -> None:
        path = os.path.join(_DIR, f"gc.{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"argv": sys.argv, "pauses": _pauses}, f)

    gc.callbacks.append(_timed)
    atexit.register(_write)
