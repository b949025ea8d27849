"""A real Prometheus scrapes two live stacks under a burst: one ``fifo``, one ``drr``.

Debian's ``prometheus`` binary (``.ci/run`` installs the package; without it
the test skips and says so, or fails under ``CI=true``) scrapes two
in-process stacks on the embedded broker, each with its own topic prefix and
a ``stack`` label on its targets, through the configuration :mod:`plumbing.scrape` writes from the
same job list as ``docker/prometheus/prometheus.yml``, and evaluates the
shipped alert rules (their ``for:`` shortened to one evaluation). The same
traffic goes to both: ``bulk`` bursts, and so does ``bulk2`` (weight 2, a
third of the requests), while ``quiet`` sends a request every few batches in
the same tier, a gold org keeps the higher tier busy for a
while, a rate-limited org is refused, some requests expire while held, and
one bad record reaches each of admission, the scheduler and a worker; then
a worker leaves.

What must hold: every PromQL expression of the Grafana dashboard returns a
series with a value from Prometheus's HTTP API (a panel whose query
returns nothing is a broken panel); under fifo the fairness gap exceeds its
bound and ``SchedulerFairnessBoundExceeded`` fires; under drr the gap stays
within it and no fairness alert fires. Every wait is bounded and says what
it waited for; no figure is a wall-clock threshold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from app.stack import Stack
from plumbing.kafka import KafkaSettings, make_producer
from plumbing.ports import free_port
from plumbing.scrape import static_config
from schemas.build import build_config
from schemas.codec import codec_for, content_type
from schemas.config import Config
from schemas.messages import AdmittedRequest
from schemas.topics import Topics
from tests.integration.pipeline_setup import request
from tests.tools import require_tool

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docker" / "grafana" / "dashboards" / "serving-fairness.json"
RULES = REPO / "docker" / "prometheus" / "rules"
PROMETHEUS = shutil.which("prometheus")
FAIRNESS_ALERTS = ("SchedulerFairnessBoundExceeded", "SchedulerOrgStarved",
                   "SchedulerTierBelowMinShare")
#: Texts of bulk's and quiet's requests: 8 words = 8 tokens for the fake model.
TEXT = "one two three four five six seven eight"
BURST = 1200
GOLD = 120
_MSGPACK = [("content-type", content_type("msgpack").encode())]


def make_config(prefix: str) -> Config:
    """gold over free with a floor of 0.3; limited's 3 requests a minute; bulk2 weighs 2."""
    return build_config(
        prefix=prefix, heartbeat_ms=200, state_interval_ms=200, worker_timeout_ms=3000,
        tier_partitions=2, ingress_partitions=4, results_partitions=1,
        metrics_org_allowlist=["bulk", "quiet"], fairness_window_s=120,
        tiers=["gold", {"name": "free", "min_share": 0.3}],
        endpoints={"embed": {"quantum": 256, "max_batch_tokens": 512, "max_batch_size": 64,
                             "max_request_tokens": 32, "partitions": 2,
                             "latency_target_ms": 600000}},
        orgs={"acme": "gold",
              "limited": {"tier": "gold", "limits": {"embed": [{"window_s": 60, "requests": 3}]}},
              "bulk": "free", "quiet": "free", "late": "free",
              "bulk2": {"tier": "free", "weight": 2.0}},
    ).config


def _kafka(broker_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(bootstrap=broker_bootstrap, client_id="sf-prom-tests",
                         session_timeout_ms=2000, heartbeat_interval_ms=500)


def _request(org: str) -> bytes:
    return json.dumps({"id": f"{org}-{uuid.uuid4().hex[:10]}", "org": org, "endpoint": "embed",
                       "input": {"type": "embed", "texts": [TEXT]}}).encode()


async def _traffic(kafka: KafkaSettings, config: Config) -> None:
    """The burst and everything around it, sent without waiting for results."""
    topics = Topics.of(config)
    producer = make_producer(kafka, linger_ms=5)
    await producer.start()
    try:
        async def send(topic, value, key=None, partition=None, headers=None):
            return await producer.send(topic, value, key=key, partition=partition,
                                       headers=headers)

        sent = []
        for org, n in (("acme", GOLD), ("limited", 6)):
            sent += [await send(topics.ingress, _request(org), org.encode()) for _ in range(n)]
        sent += [await send(topics.ingress, _request("bulk"), b"bulk") for _ in range(BURST)]
        # A second backlogged org in bulk's tier, of weight 2: drr keeps the two within the
        # bound the whole time; fifo serves it only after bulk's whole burst.
        sent += [await send(topics.ingress, _request("bulk2"), b"bulk2") for _ in range(BURST // 3)]
        # Straight into the scheduler (admission's throttle would refuse them): held
        # behind the burst, they expire there.
        codec = codec_for(AdmittedRequest)
        sent += [await send(topics.tier("free"), codec.encode(r), b"late", headers=_MSGPACK)
                 for r in (request(i, "late", [TEXT], tier="free", deadline_in_ms=50,
                                   topics=topics) for i in range(20))]
        # One bad record for each of admission, the scheduler and a worker.
        sent.append(await send(topics.ingress, b"not a request", b"bulk"))
        sent.append(await send(topics.tier("free"), b"\xc1 not msgpack", b"bulk"))
        sent.append(await send(topics.batches("embed"), b"\xc1 not a batch", partition=0))
        await asyncio.gather(*sent)
        for _ in range(12):  # quiet: a request every few batches while the burst drains
            await (await send(topics.ingress, _request("quiet"), b"quiet"))
            await asyncio.sleep(0.3)
    finally:
        await producer.stop()


async def _until(what: str, check, timeout_s: float, step_s: float = 0.25):
    """Poll ``check`` (sync or async) until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")


class Prom:
    """A Prometheus process on a free port, queried through its HTTP API."""

    def __init__(self, workdir: Path, config_text: str):
        self.port = free_port()
        self.workdir = workdir
        (workdir / "rules").mkdir()
        for path in RULES.glob("*.yml"):
            # One evaluation instead of minutes: the test sees the rule fire, not wait.
            text = re.sub(r"(?m)^(\s+for:) \S+$", r"\1 1s", path.read_text())
            (workdir / "rules" / path.name).write_text(text)
        (workdir / "prometheus.yml").write_text(config_text)
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def get(self, path: str, **params) -> bytes:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read()

    async def aget(self, path: str, **params) -> bytes:
        return await asyncio.to_thread(self.get, path, **params)

    async def query(self, expr: str) -> list[dict]:
        out = json.loads(await self.aget("/api/v1/query", query=expr))
        assert out["status"] == "success", (expr, out)
        return out["data"]["result"]

    async def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited ({self.proc.returncode}): "
                                 f"{(self.workdir / 'prometheus.log').read_text()[-2000:]}")
        try:
            await self.aget("/-/ready")
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the dashboard, Grafana variables filled in.

    ``$endpoint`` and ``$tier`` get "All" (``.*``); ``$__rate_interval`` a
    window spanning the whole run, so a rate covers the burst. Variable
    queries ``label_values(metric, label)`` contribute their metric.
    """
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for t in p.get("targets", []):
                found.append((p["title"], t["expr"]))
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q)
            found.append((f"${var['name']}", m.group(1) if m else q))
    subs = {"$__rate_interval": "5m", "${endpoint}": ".*", "$endpoint": ".*",
            "${tier}": ".*", "$tier": ".*"}
    out = []
    for title, expr in found:
        for k, v in subs.items():
            expr = expr.replace(k, v)
        assert "$" not in expr, f"{title}: a Grafana variable left unfilled in {expr}"
        out.append((title, expr))
    return out


def _finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


@pytest.fixture
def _prometheus() -> str:
    """Skips where missing, fails under CI=true (:func:`tests.tools.require_tool`)."""
    return require_tool("prometheus", "install Debian's `prometheus` package (.ci/run does) "
                        "to run the live-Prometheus test")


@pytest.mark.usefixtures("_prometheus")
@pytest.mark.timeout(240)
async def test_a_real_prometheus_sees_every_panel_and_the_fairness_alert_only_for_fifo(
        broker, tmp_path: Path):
    """Every dashboard query returns data; the bound alert fires for fifo, no fairness alert for drr."""
    kafka = _kafka(broker.bootstrap)
    configs = {policy: make_config(f"p{uuid.uuid4().hex[:6]}{policy}.")
               for policy in ("fifo", "drr")}
    stacks = {policy: Stack(cfg, kafka, policy=policy, model="fake:ms_per_token=0.5",
                            workers=2, metrics_port=0) for policy, cfg in configs.items()}
    prom = None
    async with contextlib.AsyncExitStack() as running:
        await asyncio.gather(*(running.enter_async_context(s) for s in stacks.values()))
        # One job list for both stacks; a `stack` label on each target keeps them apart.
        targets: dict[str, list[str]] = {"admission": [], "scheduler": [], "worker-embed": []}
        labels: dict[str, dict[str, str]] = {}
        for policy, stack in stacks.items():
            for svc, name in ((stack.admission, "admission"), (stack.scheduler, "scheduler"),
                              *((w, "worker-embed") for w in stack.workers)):
                target = f"127.0.0.1:{svc._telemetry.port}"
                targets[name].append(target)
                labels[target] = {"stack": policy}
        config_text = static_config(targets, scrape_interval_s=1, evaluation_interval_s=1,
                                    labels=labels)
        prom = Prom(tmp_path, config_text)
        running.callback(prom.stop)
        await _until("prometheus to be ready", prom.ready, 30)
        await _until("every target to be scraped once",
                     lambda: _all_up(prom, len(labels)), 30)

        await asyncio.gather(*(_traffic(kafka, cfg) for cfg in configs.values()))
        for policy, stack in stacks.items():
            s = stack.scheduler
            await _until(f"{policy}: every admitted request to leave the scheduler",
                         lambda s=s: s.totals["received"] > BURST * 4 // 3 and s.core.held == 0,
                         90)
        # A worker leaves (bye): the scheduler counts a lost worker.
        await asyncio.gather(*(stack.workers[1].stop() for stack in stacks.values()))
        await asyncio.gather(*(_until(f"{p}: the stopped worker to be dropped",
                                      lambda s=s: len(s.scheduler.flow.endpoint_workers("embed"))
                                      == 1, 30) for p, s in stacks.items()))

        fifo_alert = ('ALERTS{alertname="SchedulerFairnessBoundExceeded", '
                      'alertstate="firing", stack="fifo"}')
        await _until("the fairness alert to fire for fifo", lambda: prom.query(fifo_alert), 60)
        # Two more evaluations after the last scrape of everything above.
        t_done = time.time()

        async def evaluated_since() -> bool:
            r = await prom.query('max(timestamp(sf_scheduler_fairness_gap_cost{stack="drr"}))')
            return bool(r) and float(r[0]["value"][1]) > t_done + 2

        await _until("a drr scrape 2 s after the traffic ended", evaluated_since, 30)

        empty = []
        for title, expr in dashboard_expressions():
            if not _finite(await prom.query(expr)):
                empty.append(f"{title}: {expr}")
        assert not empty, "dashboard queries with no series (or only NaN):\n" + "\n".join(empty)

        gap = 'max_over_time(sf_scheduler_fairness_gap_cost{{stack="{}", tier="free"}}[10m])'
        bound = 'max_over_time(sf_scheduler_fairness_bound_cost{{stack="{}", tier="free"}}[10m])'
        ratio = {p: float((await prom.query(f"{gap.format(p)} / ignoring() {bound.format(p)}"))
                          [0]["value"][1]) for p in stacks}
        assert ratio["fifo"] > 1.0, ratio
        assert ratio["drr"] <= 1.0, ratio
        names = "|".join(FAIRNESS_ALERTS)
        drr_alerts = await prom.query(
            f'count_over_time(ALERTS{{stack="drr", alertname=~"{names}"}}[10m])')
        assert drr_alerts == [], f"fairness alerts under drr: {drr_alerts}"
        print(f"gap / bound over the run: fifo {ratio['fifo']:.2f}, drr {ratio['drr']:.2f}")


async def _all_up(prom: Prom, n: int) -> bool:
    up = await prom.query("up == 1")
    return len(up) >= n
