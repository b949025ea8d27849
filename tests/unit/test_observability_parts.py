"""The pure parts of observability: broker probe verdicts, log sampling, bounded org labels, JSON logs."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest
import structlog
from prometheus_client import CollectorRegistry

from plumbing.brokerwatch import BrokerWatch
from plumbing.logs import LogSampler, configure_logging, get_logger
from scheduler.metrics import SchedulerMetrics
from schemas.build import build_config


def _config(allowlist: list[str]):
    """gold: acme, free: bulk, and the orgs named by their own metric label."""
    return build_config(metrics_org_allowlist=allowlist,
                        orgs={"acme": "gold", "bulk": "free"}).config


class _Gauge:
    value = None

    def set(self, v):
        self.value = v


class _Broker:
    def __init__(self, node_id):
        self.nodeId = node_id


class _Cluster:
    def __init__(self, nodes):
        self.nodes = nodes

    def brokers(self):
        return [_Broker(n) for n in self.nodes]


class _Client:
    """Answers, raises, or never answers a metadata request."""

    def __init__(self, nodes=(1,), behaviour="answer"):
        self.cluster = _Cluster(list(nodes))
        self.behaviour = behaviour

    async def send(self, node, request):
        if self.behaviour == "raise":
            raise ConnectionRefusedError("refused")
        if self.behaviour == "hang":
            await asyncio.sleep(60)
        return object()


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _watch(client=None, **kw) -> tuple[BrokerWatch, _Gauge, _Clock]:
    gauge, clock = _Gauge(), _Clock()
    w = BrokerWatch(client or _Client(), "t", service="test", gauge=gauge, clock=clock, **kw)
    return w, gauge, clock


def test_broker_watch_flips_only_after_consecutive_failures_and_recovers_on_one_answer():
    """Unreachable after `failures` unanswered probes in a row (gauge 0, reason given); one answer restores it."""
    w, gauge, clock = _watch(failures=2)
    assert w.status() == (True, "broker reachable") and gauge.value == 1
    w.reason = "node 1: refused"
    w.observe(False)
    assert w.reachable and gauge.value == 1  # one miss is not an outage
    w.observe(True)
    w.observe(False)
    assert w.reachable  # the streak was broken by the answer in between
    clock.t += 3
    w.observe(False)
    ok, why = w.status()
    assert not ok and gauge.value == 0
    assert "unreachable for 3.0 s" in why and "refused" in why
    w.observe(True)
    assert w.status() == (True, "broker reachable") and gauge.value == 1


async def test_broker_watch_probe_answers_true_only_when_a_node_answers_in_time():
    """A probe succeeds on an answer; a refused or silent broker (past timeout_s) or no known node fails it."""
    assert await _watch(_Client())[0].probe()
    w = _watch(_Client(nodes=(1, 2), behaviour="raise"))[0]
    assert not await w.probe() and "refused" in w.reason
    w = _watch(_Client(behaviour="hang"), timeout_s=0.05)[0]
    assert not await w.probe() and "no answer" in w.reason
    w = _watch(_Client(nodes=()))[0]
    assert not await w.probe() and w.reason == "no broker known"


def test_log_sampler_demotes_lines_past_the_allowance_to_debug_and_counts_them():
    """At most per_s lines a second at the asked level; the rest at debug, counted; the next second starts afresh."""
    calls = []

    class Logger:
        def info(self, event, **kw):
            calls.append(("info", event))

        def debug(self, event, **kw):
            calls.append(("debug", event))

    s = LogSampler(2)
    for _ in range(5):
        s.log(Logger(), "info", "batch_emitted", 1_000.0)
    s.log(Logger(), "info", "batch_emitted", 2_000.0)
    assert [c[0] for c in calls] == ["info", "info", "debug", "debug", "debug", "info"]
    assert s.suppressed == 3


def test_org_label_is_the_org_only_when_allowlisted_and_follows_reloads():
    """Orgs outside service.metrics_org_allowlist count as 'other', so labels stay bounded by the config."""
    config = _config(["acme"])
    m = SchedulerMetrics(CollectorRegistry(), config)
    assert m.org_label("acme") == "acme"
    assert m.org_label("bulk") == m.org_label("anyone-at-all") == "other"
    m.configure(_config(["bulk"]))
    assert m.org_label("acme") == "other" and m.org_label("bulk") == "bulk"


def test_dispatched_counts_requests_and_cost_per_tier_and_org_label():
    """An acknowledged batch adds what it charged each org (requests, cost) under (endpoint,
    tier, org label); orgs sharing a label add up."""
    registry = CollectorRegistry()
    m = SchedulerMetrics(registry, _config(["acme"]))
    m.dispatched_charges("embed", [("gold", "acme", 2, 15.0), ("free", "bulk", 1, 7.0),
                                   ("free", "zed", 1, 1.0)])

    def value(name, **labels):
        return registry.get_sample_value(name, {"endpoint": "embed", **labels})

    assert value("sf_scheduler_dispatched_requests_total", tier="gold", org="acme") == 2
    assert value("sf_scheduler_dispatched_cost_total", tier="gold", org="acme") == 15
    assert value("sf_scheduler_dispatched_requests_total", tier="free", org="other") == 2
    assert value("sf_scheduler_dispatched_cost_total", tier="free", org="other") == 8
    assert value("sf_scheduler_dispatched_requests_total", tier="free", org="bulk") is None


@pytest.fixture
def log_stream():
    stream = io.StringIO()
    configure_logging("debug", json=True, stream=stream)
    yield stream
    configure_logging("info", json=False, stream=io.StringIO())
    structlog.reset_defaults()


def test_json_logs_carry_contextvar_ids_logger_names_and_library_lines(log_stream):
    """Every line is JSON; ids bound with bound_contextvars appear, and vanish outside the block;
    aiokafka's standard-library lines are JSON too."""
    log = get_logger("worker")
    with structlog.contextvars.bound_contextvars(batch_id="b-1", request_id="r-1", org="acme"):
        log.debug("request_served", tokens=3)
    log.info("worker_totals", batches=1)
    logging.getLogger("aiokafka").warning("Unable connect to node %s", 1)
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["request_served", "worker_totals",
                                           "Unable connect to node 1"]
    served, totals, library = lines
    assert served["batch_id"] == "b-1" and served["request_id"] == "r-1"
    assert served["org"] == "acme" and served["logger"] == "worker"
    assert "batch_id" not in totals
    assert library["logger"] == "aiokafka" and library["level"] == "warning"


def test_each_log_line_is_written_in_one_call_with_its_newline():
    """A line and its newline go in one write, so processes appending to one file never split a line."""

    class Recorder(io.StringIO):
        def __init__(self):
            super().__init__()
            self.writes: list[str] = []

        def write(self, s):
            self.writes.append(s)
            return super().write(s)

    stream = Recorder()
    configure_logging("info", json=True, stream=stream)
    try:
        get_logger("scheduler").info("batch_emitted", batch_id="b-1")
        logging.getLogger("aiokafka").warning("library line")
    finally:
        configure_logging("info", json=False, stream=io.StringIO())
        structlog.reset_defaults()
    assert len(stream.writes) == 2
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in stream.writes)


class _Held:
    """A client whose metadata answers the test hands out one at a time."""

    def __init__(self):
        self.cluster = _Cluster([1])
        self.pending: asyncio.Future | None = None
        self.sent = 0

    def send(self, node, request):
        self.sent += 1
        self.pending = asyncio.get_running_loop().create_future()
        return self.pending


async def test_a_broker_watch_stopped_as_its_probe_is_answered_ends():
    """The stop comes in the tick the answer does: the loop must end, not probe on for ever.

    (A replay hung after its last result this way, on a topic keeper: a
    cancellation that ``asyncio.wait_for`` swallowed on Python 3.11.)
    """
    client = _Held()
    w = BrokerWatch(client, "t", service="test", gauge=_Gauge(), interval_s=0.01)
    w.stop_s = 0.5
    w.start()
    task = w._task
    for _ in range(50):
        if client.pending is not None:
            break
        await asyncio.sleep(0.01)
    assert client.pending is not None, "the watch never probed"
    client.pending.set_result(object())
    await asyncio.wait_for(w.stop(), 10)
    assert task.done(), f"the watch went on after its stop ({client.sent} probes)"
    task.cancel()
