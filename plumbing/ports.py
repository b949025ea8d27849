"""A free TCP port for a listener that another process will bind, below the
kernel's ephemeral range.

``bind(0)`` hands out a port from the ephemeral range (Linux: 32768-60999),
the range every outgoing connection's local port also comes from. Between
closing that probe socket and the child process binding the port, one of
the many connections a test or the demo opens (Kafka clients, readiness
probes) can take it, and the child fails with ``EADDRINUSE``: the demo's
scheduler did, once, on 2026-12-05 (its metrics port 50147). A port below
the ephemeral range is never given to an outgoing connection, so only
another listener could take it in between: one that picks the same port of
some 17,000 in the same moment, or binds it by number.

Pure standard library; no state.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["ephemeral_range", "free_port"]

#: Candidates start here: above the ports services commonly register.
LOWEST = 15_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 50
#: Not the module's generator: a test that seeds it must not make two
#: processes, or two calls, pick the same ports.
_PICK = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (inclusive).

    Linux says it in ``/proc``; elsewhere the IANA range (BSD, macOS, Windows).
    """
    try:
        low, high = (int(v) for v in _RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 49_152, 65_535


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` no listener holds now, below the ephemeral range when
    there is room there (else any free one, as ``bind(0)`` gives)."""
    low, _ = ephemeral_range()
    if low - LOWEST >= 1_000:
        for _ in range(_TRIES):
            port = _PICK.randrange(LOWEST, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
