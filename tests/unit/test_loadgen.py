"""bench/loadgen.py counts every request by id: lost, submit-failed, duplicated, foreign.

The crash, overload, broker-restart and broker-stall runs assert these counts
are 0; here each one is made to happen on purpose with a client that
misbehaves on cue, so a count that stops counting fails here first.
"""

from __future__ import annotations

import asyncio

from bench.loadgen import Load
from schemas.messages import Result


class _Client:
    """Submits succeed except for ids in ``refuse``; results come as ``reply`` says.

    ``reply(rid)`` returns how many copies of ``rid``'s result to hand over
    (0: none, the request is lost). ``extra`` results (ids nobody sent) come
    after the first answer.
    """

    def __init__(self, refuse=(), copies=None, extra=()):
        self.refuse = set(refuse)
        self.copies = copies or {}
        self.extra = list(extra)
        self.queue: asyncio.Queue[Result] = asyncio.Queue()

    async def submit(self, req: dict) -> str:
        rid = req["id"]
        n = self.copies.get(rid, 1)
        for _ in range(n):
            self.queue.put_nowait(Result(id=rid, status="ok", org=req["org"]))
        if rid in self.refuse:
            raise TimeoutError(f"no answer for {rid}")
        for fid in self.extra:
            self.queue.put_nowait(Result(id=fid, status="ok"))
        self.extra = []
        return rid

    async def results(self):
        while True:
            yield await self.queue.get()


async def _run(client: _Client, n: int) -> Load:
    load = Load(client, ["a", "b"], rate=2000).start()
    try:
        for _ in range(500):
            if len(load.sent) >= n:
                break
            await asyncio.sleep(0.01)
        load.stop_sending()
        await asyncio.sleep(0.1)  # the last submits and results land
    finally:
        await load.close()
    return load


async def test_a_clean_run_counts_nothing_wrong():
    load = await _run(_Client(), 10)
    t = load.tally()
    assert t.sent == t.answered == len(load.sent) >= 10
    assert t.lost == t.submit_failed == () and t.duplicated == {} and t.foreign == {}


async def test_a_failed_submit_stays_counted_by_id():
    """A submit that raised is neither answered nor silently forgotten."""
    client = _Client(refuse={"r1-b", "r3-b"}, copies={"r1-b": 0, "r3-b": 1})
    load = await _run(client, 10)
    t = load.tally()
    assert "r1-b" in load.sent and "r3-b" in load.sent
    assert t.submit_failed == ("r1-b",), t.line()
    assert t.submit_failed_answered == 1  # r3-b's result came although its submit raised
    assert t.lost == ()
    assert t.sent == t.answered + len(t.lost) + len(t.submit_failed)
    assert "r1-b" not in load.missing()  # drain does not wait for it
    assert dict(load.submit_errors) == {"TimeoutError": 2}


async def test_a_lost_request_a_second_copy_and_a_stranger_are_each_counted():
    client = _Client(copies={"r2-a": 0, "r4-a": 3}, extra=["someone-else"])
    load = await _run(client, 10)
    t = load.tally()
    assert t.lost == ("r2-a",), t.line()
    assert t.duplicated == {"r4-a": 2}
    assert t.foreign == {"someone-else": 1}
    assert t.as_dict() | {"sent": 0, "answered": 0} == {
        "sent": 0, "answered": 0, "lost": 1, "submit_failed": 0, "submit_failed_answered": 0,
        "duplicated": 1, "foreign": 1}
    assert "lost 1 (r2-a)" in t.line()
