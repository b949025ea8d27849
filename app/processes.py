"""The pipeline as separate processes, the way it is deployed.

Admission, the scheduler, one worker per endpoint and, with
``gateway_port``, the HTTP gateway each run as their own
``serving-fairness`` process against a given bootstrap. The demo uses this
rather than :class:`app.stack.Stack` (one process) because on a small
machine one interpreter's GIL would make every service wait for the others:
a burst being admitted would then look like scheduler latency, and model
inference like both.

Each process logs JSON lines to one shared log file, serves ``/readyz`` on a
port of its own, and is stopped with SIGTERM (graceful), then SIGKILL.

``cpus`` pins services to CPUs by subcommand (the demo gives its workers a
core of their own, standing in for their accelerator).

``gateway_port=P`` adds ``serving-fairness gateway --port P`` (0: a free
port, chosen here); :attr:`ProcessStack.gateway_url` is where its HTTP API
listens. It is started with the others and stopped first, so that it
drains (answers what waits) while the pipeline behind it still runs.

For failure tests and benchmarks: ``schedulers=2`` starts a hot standby
(``scheduler-2``), ``workers=N`` runs N workers per endpoint
(``worker-<endpoint>``, ``worker-<endpoint>-2``...), :meth:`ProcessStack.kill`
crashes one process (SIGKILL) and :meth:`ProcessStack.restart` starts it
again with the same arguments; :meth:`ProcessStack.pause` and
:meth:`ProcessStack.resume` freeze one and let it go on (SIGSTOP, SIGCONT).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Self

from plumbing.bounded import within
from plumbing.children import parent_death_signal
from plumbing.ports import free_port

__all__ = ["ProcessStack", "placement"]


def placement(cpus: set[int] | None, nice: int) -> Callable[[], None] | None:
    """What a child runs between fork and exec: SIGTERM when we die (Linux,
    :mod:`plumbing.children`), then its CPUs and its niceness (both inherited
    by every thread it starts); None for none of them. System calls only
    there: no Python locks."""
    orphan = parent_death_signal(signal.SIGTERM)
    if orphan is None and cpus is None and not nice:
        return None

    def place() -> None:
        if orphan is not None:
            orphan()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        if nice:
            os.nice(nice)

    return place


async def _ready(port: int) -> tuple[bool, str]:
    try:
        reader, writer = await within(asyncio.open_connection("127.0.0.1", port), 1)
    except (OSError, TimeoutError):
        return False, "not listening yet"
    try:
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        reply = await within(reader.read(), 2)
    except (OSError, TimeoutError):
        return False, "no answer"
    finally:
        writer.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    return head.startswith(b"HTTP/1.1 200"), body.decode(errors="replace").strip()


class ProcessStack:
    """Start admission, scheduler and workers as processes; stop them on exit."""

    def __init__(self, config_path: str | Path, bootstrap: str, *, policy: str = "drr",
                 endpoints: list[str], model: str | None = None, worker_threads: int | None = None,
                 log: IO[str] | None = None, env: dict[str, str] | None = None,
                 schedulers: int = 1, workers: int = 1,
                 extra_args: dict[str, list[str]] | None = None,
                 cpus: dict[str, set[int]] | None = None,
                 nice: dict[str, int] | None = None,
                 gateway_port: int | None = None):
        self.config_path = str(config_path)
        self.bootstrap = bootstrap
        self.policy = policy
        self.endpoints = endpoints
        self.model = model
        self.worker_threads = worker_threads
        self.log = log
        self.env = {**os.environ, "SF_LOG_JSON": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
        self.schedulers = schedulers
        self.workers = workers
        #: Added to a service's command line, by subcommand (``scheduler``...).
        self.extra_args = extra_args or {}
        #: CPUs a service may run on, by process name (``worker-embed``) or
        #: subcommand (``worker``), Linux only; the rest inherit ours.
        self.cpus = cpus or {}
        #: Added to a service's CPU niceness at its start (every thread it makes
        #: inherits it), by process name or subcommand, as ``cpus``.
        self.nice = nice or {}
        #: The gateway's HTTP port (0: a free one, chosen at start); None: no gateway.
        self.gateway_port = gateway_port
        #: ``http://127.0.0.1:<port>`` of the gateway's HTTP API, once spawned.
        self.gateway_url: str | None = None
        self.procs: dict[str, tuple[subprocess.Popen, int]] = {}
        self._args: dict[str, tuple[str, ...]] = {}
        #: Ports a process listens on besides its metrics port (the gateway's API).
        self._http_ports: dict[str, int] = {}
        #: Processes started again once because they exited before they were ready.
        self.respawned: list[str] = []

    def _port(self) -> int:
        """A free port that no process of this stack was given yet."""
        taken = {p for _proc, p in self.procs.values()} | set(self._http_ports.values())
        while (port := free_port()) in taken:
            pass
        return port

    def _spawn(self, name: str, *args: str) -> None:
        port = self._port()
        self._args[name] = args
        cmd = [sys.executable, "-m", "app.cli", *args,
               *self.extra_args.get(args[0], []), "--config", self.config_path,
               "--bootstrap", self.bootstrap, "--metrics-port", str(port)]
        cpus = self.cpus.get(name, self.cpus.get(args[0]))
        nice = self.nice.get(name, self.nice.get(args[0], 0))
        proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=self.log or subprocess.DEVNULL,
                                stderr=self.log or subprocess.DEVNULL,
                                preexec_fn=placement(cpus, nice))  # noqa: PLW1509
        self.procs[name] = (proc, port)

    async def start(self, timeout_s: float = 120.0) -> Self:
        self._spawn("scheduler", "scheduler", "--policy", self.policy)
        self._spawn("admission", "admission")
        for ep in self.endpoints:
            extra = ["--model", self.model] if self.model else []
            if self.worker_threads:
                extra += ["--threads", str(self.worker_threads)]
            for i in range(self.workers):
                name = f"worker-{ep}" + (f"-{i + 1}" if i else "")
                self._spawn(name, "worker", "--endpoint", ep, *extra)
        if self.gateway_port is not None:
            port = self.gateway_port or self._port()
            self._http_ports["gateway"] = port
            self._spawn("gateway", "gateway", "--port", str(port))
            self.gateway_url = f"http://127.0.0.1:{port}"
        # Standbys after the first, so that the first one leads.
        await self.wait_ready(timeout_s)
        for i in range(1, self.schedulers):
            self._spawn(f"scheduler-{i + 1}", "scheduler", "--policy", self.policy)
        await self.wait_ready(timeout_s)
        return self

    async def ready(self, name: str) -> tuple[bool, str]:
        """``name``'s ``/readyz``: (answered 200, the reason it gave)."""
        return await _ready(self.procs[name][1])

    def pid(self, name: str) -> int:
        return self.procs[name][0].pid

    async def leader(self) -> str | None:
        """The scheduler process that is ready (leads), if any."""
        for name in self.procs:
            if name.startswith("scheduler") and (await self.ready(name))[0]:
                return name
        return None

    def kill(self, name: str) -> None:
        """Crash ``name``: SIGKILL, no chance to leave a group or commit."""
        proc, _ = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait()

    def pause(self, name: str) -> None:
        """Freeze ``name`` (SIGSTOP): a process that is only slow, as in a long GC pause."""
        os.kill(self.pid(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """Let a paused ``name`` run on (SIGCONT)."""
        os.kill(self.pid(name), signal.SIGCONT)

    def restart(self, name: str) -> None:
        """Start ``name`` again (after :meth:`kill`) with its arguments, on a new port."""
        proc, _ = self.procs[name]
        if proc.poll() is None:
            raise RuntimeError(f"{name} is still running")
        self._spawn(name, *self._args[name])

    async def wait_ready(self, timeout_s: float) -> None:
        """Until every process answers ``/readyz`` and one scheduler leads.

        A standby scheduler answers 503 ("standby ..."): that counts as up.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = []
            leaders = 0
            for name, (proc, port) in list(self.procs.items()):
                if proc.poll() is not None:
                    if name in self.respawned or proc.returncode != 1:
                        raise RuntimeError(f"{name} exited with status {proc.returncode} "
                                           "(see the log file)")
                    # Once: a port chosen free was taken before the child bound it
                    # (another listener on the machine picked it in the same moment;
                    # seen once for the gateway, EADDRINUSE). A real fault fails again.
                    self.respawned.append(name)
                    self._respawn(name)
                    continue
                ok, why = await _ready(port)
                is_scheduler = name.startswith("scheduler")
                leaders += ok and is_scheduler
                if not ok and not (is_scheduler and why.startswith("standby")):
                    waiting.append(f"{name}: {why}")
            if not leaders:
                waiting.append("no scheduler leads yet")
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("pipeline not ready: " + "; ".join(waiting))
            await asyncio.sleep(0.2)

    def _respawn(self, name: str) -> None:
        """Start ``name`` again with new ports (it exited before it was ready)."""
        args = self._args[name]
        if name in self._http_ports and not self.gateway_port:
            port = self._port()
            self._http_ports[name] = port
            args = (*args[:-1], str(port))  # "--port", P last
            self.gateway_url = f"http://127.0.0.1:{port}"
        self._spawn(name, *args)

    def failed(self) -> str | None:
        for name, (proc, _) in self.procs.items():
            if proc.poll() is not None:
                return f"{name} exited with status {proc.returncode}"
        return None

    async def stop(self, grace_s: float = 15.0) -> None:
        deadline = time.monotonic() + grace_s
        # The gateway alone first: it drains, and what it waits for needs the
        # pipeline behind it.
        gateway = [kv for kv in self.procs.items() if kv[0] == "gateway"]
        await _terminate(gateway, deadline)
        # Workers first, so they finish their batch in hand and say bye.
        rest = sorted((kv for kv in self.procs.items() if kv[0] != "gateway"),
                      key=lambda kv: not kv[0].startswith("worker"))
        await _terminate(rest, deadline)
        self.procs.clear()

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.stop(grace_s=2)
            raise

    async def __aexit__(self, *exc) -> None:
        await self.stop()


async def _terminate(procs: list[tuple[str, tuple[subprocess.Popen, int]]],
                     deadline: float) -> None:
    """SIGTERM to each of ``procs``, then wait for each in turn; SIGKILL past ``deadline``."""
    for _name, (proc, _) in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for _name, (proc, _) in procs:
        while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 - a child process: no event to await
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
