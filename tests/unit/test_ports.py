"""plumbing.ports: a port for a child's listener that no outgoing connection can take first."""

import socket

from plumbing import ports
from plumbing.ports import LOWEST, ephemeral_range, free_port


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    """bind(0) gives an ephemeral port, which any new connection may take before the
    child binds it (the demo's scheduler failed so, once); these never are."""
    low, high = ephemeral_range()
    assert 0 < low <= high
    picked = {free_port() for _ in range(200)}
    assert all(LOWEST <= p < low for p in picked)
    assert len(picked) > 150  # spread over the range, not one port again and again
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_not_given(monkeypatch):
    """A candidate a listener holds is passed over for the next."""
    with socket.socket() as taken, socket.socket() as probe:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
        probe.close()
        choices = iter([busy, busy, free])
        monkeypatch.setattr(ports._PICK, "randrange", lambda a, b: next(choices))
        assert free_port() == free


def test_no_room_below_the_range_falls_back_to_any_free_port(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (LOWEST + 10, 65_535))
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
