"""After start-up a service's heap is frozen: collections no longer walk it.

Each check runs in a fresh interpreter: freezing and the thresholds are
process-wide, and the test process must keep its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from plumbing.heap import YOUNG_THRESHOLD


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_settle_freezes_what_start_up_made_and_still_collects_what_comes_after():
    got = _run("""
        import gc, json, weakref
        from plumbing.heap import settle

        class Node:
            pass

        early = [[i] for i in range(1000)]
        walked_before = any(o is early for o in gc.get_objects())
        frozen = settle()
        walked_after = any(o is early for o in gc.get_objects())
        late = [[1]]
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        print(json.dumps({"walked_before": walked_before, "walked_after": walked_after,
                          "late_walked": any(o is late for o in gc.get_objects()),
                          "cycle_collected": gone() is None, "frozen": frozen,
                          "threshold": gc.get_threshold()}))
    """)
    assert got["walked_before"], "the probe cannot see a live list: the check means nothing"
    assert not got["walked_after"], "an object alive at settle() is still walked by collections"
    assert got["late_walked"], "objects made after settle() must stay collectable"
    assert got["cycle_collected"], "a reference cycle made after settle() was not collected"
    assert got["frozen"] > 1000
    assert got["threshold"][0] == YOUNG_THRESHOLD


def test_a_service_command_settles_once_the_service_has_started():
    got = _run("""
        import asyncio, gc, json
        from plumbing.kafka import KafkaSettings
        from plumbing.service import serve

        seen = {}

        class Service:
            def request_stop(self): pass
            def request_reload(self): pass
            async def __aenter__(self):
                seen["frozen_at_start"] = gc.get_freeze_count()
                return self
            async def __aexit__(self, *exc): pass
            async def run(self):
                seen["frozen_in_run"] = gc.get_freeze_count()
                seen["threshold"] = gc.get_threshold()

        asyncio.run(serve(lambda kafka: Service(), KafkaSettings(bootstrap="localhost:1")))
        print(json.dumps(seen))
    """)
    assert got["frozen_at_start"] == 0
    assert got["frozen_in_run"] > 0, "serve() ran the service without freezing its start-up heap"
    assert got["threshold"][0] == YOUNG_THRESHOLD
