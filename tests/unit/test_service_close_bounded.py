"""A stop ends however a Kafka client's shutdown behaves (plumbing.service.Service.stop)."""

from __future__ import annotations

import asyncio

import pytest

from plumbing.kafka import KafkaSettings
from plumbing.service import Service
from plumbing.settings import ServiceSettings
from tests.core_setup import config_for


class _Stuck:
    """A part whose stop never ends (a client waiting for a broker that went away)."""

    async def stop(self) -> None:
        await asyncio.Event().wait()


class _Service(Service):
    name = "stuck"

    def __init__(self, *, close_hangs: bool):
        super().__init__(config_for(orgs={"a": "t0"}), KafkaSettings(bootstrap="localhost:1"),
                         ServiceSettings())
        self.close_hangs = close_hangs
        self.closed = False

    async def close(self) -> None:
        if self.close_hangs:
            await asyncio.Event().wait()  # a commit that looks for a coordinator for ever
        self.closed = True


@pytest.mark.parametrize("where", ["part", "close"])
def test_a_stop_gives_up_on_a_shutdown_that_never_ends_and_says_so(where, capsys):
    async def scenario() -> _Service:
        svc = _Service(close_hangs=where == "close")
        svc.close_s = 0.2
        if where == "part":
            svc._parts.append(_Stuck())
        svc.started = True  # as start() leaves it; nothing else is needed to stop
        await asyncio.wait_for(svc.stop(), 10)  # the test's own bound: a hang fails here
        return svc

    svc = asyncio.run(scenario())
    assert not svc.started
    assert svc.closed == (where == "part")  # a stuck part does not keep close() from running
    out = capsys.readouterr()
    text = out.out + out.err
    assert "stuck_close_unsettled" in text
    assert "gave up after 0.2 s waiting for" in text
