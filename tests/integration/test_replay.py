"""Replay on the embedded broker: a topic's time window, and a trace through the live pipeline."""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import pytest

from app.replay_cli import add_arguments, replay_command
from app.stack import Stack
from plumbing.kafka import KafkaSettings, make_producer
from plumbing.topics import ensure_topics
from schemas.build import build_config
from schemas.codec import codec_for, content_type
from schemas.config import Config
from schemas.messages import EmbedInput, Request, RerankInput
from schemas.topics import Topics
from tests.integration.pipeline_setup import Reader
from traffic.replay import ReplaySettings, replay
from traffic.replay_sources import ReplayItem, read_window
from traffic.trace import TraceRecord, noisy_neighbour, write_trace

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config.toml"
_codec = codec_for(Request)


def config_text(prefix: str) -> str:
    """The shipped example under ``prefix``, as the replay command reads it."""
    return build_config(base=EXAMPLE.read_text(), prefix=prefix).text


def config(prefix: str) -> Config:
    """The shipped example under ``prefix``."""
    return build_config(base=EXAMPLE.read_text(), prefix=prefix).config


def window_requests(name: str, start_ms: int, prefix: str) -> list[tuple[int, Request]]:
    """Twelve requests of three orgs, 50 ms apart from ``start_ms``, embed and rerank."""
    out = []
    for i in range(12):
        org = ("acme", "bulkcorp", "quiet-1")[i % 3]
        inp = (EmbedInput(texts=(f"{name} text {i}", "second")) if i % 4 else
               RerankInput(query=f"{name} query {i}", documents=("a b", "c")))
        out.append((start_ms + 50 * i, Request(
            id=f"{name}-{i}", org=org, endpoint="rerank" if i % 4 == 0 else "embed", input=inp,
            priority=i % 3, deadline_ms=5_000 + i, created_ms=start_ms + 50 * i,
            reply_to=f"{prefix}replies.production")))
    return out


async def produce_windows(kafka: KafkaSettings, topic: str, prefix: str
                          ) -> tuple[int, dict[str, list[Request]]]:
    """Windows a, b, c, 30 s apart (record timestamps set explicitly), plus garbage in b."""
    base = int(time.time() * 1000) - 120_000
    windows = {w: window_requests(w, base + k * 30_000, prefix) for k, w in enumerate("abc")}
    producer = make_producer(kafka)
    await producer.start()
    try:
        for w, reqs in windows.items():
            for i, (ts, req) in enumerate(reqs):
                fmt = "msgpack" if i % 2 else "json"
                await producer.send_and_wait(
                    topic, _codec.encode(req, fmt), key=req.org.encode(), timestamp_ms=ts,
                    headers=[("content-type", content_type(fmt).encode())])
            if w == "b":
                await producer.send_and_wait(topic, b"not a request", key=b"x",
                                             timestamp_ms=reqs[3][0] + 1)
    finally:
        await producer.stop()
    return base, {w: [r for _, r in reqs] for w, reqs in windows.items()}


async def read_all(kafka: KafkaSettings, topic: str, partitions: int) -> list[tuple[str, Request]]:
    """Every request ``topic`` holds, with its record's wire format."""
    async with Reader(kafka, topic, partitions, typ=Request) as reader:
        await reader.settle(quiet_s=0)
    return list(zip(reader.formats, reader.items, strict=True))


async def test_replay_of_the_middle_window_resends_exactly_its_records(
        kafka_settings, topic_prefix):
    """Of three time windows, replaying the middle one re-sends exactly its requests, re-keyed."""
    cfg = config(topic_prefix)
    ingress = Topics.of(cfg).ingress
    capture = f"{topic_prefix}what-if.requests"
    await ensure_topics(kafka_settings, {ingress: 4, capture: 1})
    base, windows = await produce_windows(kafka_settings, ingress, topic_prefix)

    window = await read_window(kafka_settings, ingress, base + 15_000, base + 45_000)
    assert sorted(it.request.id for it in window.items) == sorted(r.id for r in windows["b"])
    assert len(window.skipped) == 1 and "not a request" not in window.skipped[0]

    run = await replay(kafka_settings, cfg, window.items, ReplaySettings(
        speed=50, to_topic=capture, timeout_s=0.3, progress=False, samples=False))
    sent = await read_all(kafka_settings, capture, 1)
    originals = {r.id: r for r in windows["b"]}
    assert len(sent) == len(originals)
    seen = set()
    for fmt, req in sent:
        original_id, origin = run.id_map[req.id]
        orig = originals[original_id]
        seen.add(original_id)
        assert req.id != orig.id and req.id.startswith(run.stats["run_id"])
        assert origin.startswith(f"{ingress}/")
        assert req.reply_to == run.stats["reply_topic"] != orig.reply_to
        assert req.reply_packed, "the replay reads its own reply topic: results packed"
        assert (req.org, req.endpoint, req.input, req.priority, req.deadline_ms) == (
            orig.org, orig.endpoint, orig.input, orig.priority, orig.deadline_ms)
        assert fmt == ("msgpack" if int(orig.id.split("-")[1]) % 2 else "json")
    assert seen == set(originals)
    # Sent in recorded order (their relative timing is kept by the schedule).
    assert [run.id_map[w][0] for w in run.wire_ids] == [r.id for r in windows["b"]]
    # No pipeline answers here: each request is still accounted for, as missing.
    assert sorted(o.id for o in run.outcomes) == sorted(originals)
    assert {o.status for o in run.outcomes} == {"missing"}


async def test_in_flight_bound_sends_no_more_than_it_until_a_result_comes(
        kafka_settings, topic_prefix):
    """With nothing answering, a replay bounded to 5 in flight sends exactly 5 of its 12
    requests; the other 7 are reported never sent, each once, with why."""
    cfg = config(topic_prefix)
    capture = f"{topic_prefix}what-if.requests"
    await ensure_topics(kafka_settings, {capture: 1})
    items = [ReplayItem(ts=0.0, tokens=2, request=r) for _, r in window_requests(
        "w", int(time.time() * 1000), topic_prefix)]
    run = await replay(kafka_settings, cfg, items, ReplaySettings(
        to_topic=capture, timeout_s=0.5, progress=False, samples=False, max_in_flight=5))
    sent = await read_all(kafka_settings, capture, 1)
    assert sorted(run.id_map[r.id][0] for _, r in sent) == [it.request.id for it in items[:5]]
    assert [o.id for o in run.outcomes] == [it.request.id for it in items]
    assert [(o.status, o.reason) for o in run.outcomes] == (
        [("missing", "no_result_within_timeout")] * 5 + [("failed", "replay_not_sent")] * 7)
    assert (run.stats["not_sent"], run.stats["send_failed"], run.stats["missing"]) == (7, 7, 5)


async def test_in_flight_bound_holds_through_the_live_pipeline(
        kafka_settings, topic_prefix):
    """40 requests due at once through the in-process pipeline, at most 3 in flight: all
    ``ok``, and at no moment more than 3 sent and not yet answered."""
    cfg = config(topic_prefix)
    items = [ReplayItem(ts=0.0, tokens=2, request=Request(
        id=f"r{i}", org=("acme", "quiet-1")[i % 2], endpoint="embed",
        input=EmbedInput(texts=(f"text {i}",)))) for i in range(40)]
    async with Stack(cfg, kafka_settings, model="fake", endpoints=["embed"]):
        run = await replay(kafka_settings, cfg, items, ReplaySettings(
            timeout_s=30, progress=False, samples=False, max_in_flight=3))
    assert [o.status for o in run.outcomes] == ["ok"] * 40
    # +1 at each send, -1 at each receipt (epoch s). A send is stamped in whole ms,
    # truncated: taken at the end of its ms, so that a receipt just before it comes first.
    got = [g for g in run.results if g is not None]
    assert len(got) == 40
    events = sorted([(res.created_ms / 1000 + 0.001, 1) for res, _ in got]
                    + [(received, -1) for _, received in got])
    in_flight = list(itertools.accumulate(d for _, d in events))
    assert max(in_flight) == 3, in_flight


async def test_window_without_until_reads_to_the_end_as_of_the_start(kafka_settings, topic_prefix):
    """With no --until, a window ends at each partition's high watermark when the read began."""
    cfg = config(topic_prefix)
    ingress = Topics.of(cfg).ingress
    await ensure_topics(kafka_settings, {ingress: 4})
    base, windows = await produce_windows(kafka_settings, ingress, topic_prefix)
    window = await read_window(kafka_settings, ingress, base + 45_000)
    assert sorted(it.request.id for it in window.items) == sorted(r.id for r in windows["c"])
    assert [it.ts for it in window.items] == sorted(it.ts for it in window.items)
    assert window.items[0].ts == 0.0


async def test_command_replays_a_window_into_another_topic_and_maps_ids_back(
        broker, kafka_settings, topic_prefix, tmp_path):
    """The command with --from-topic/--since/--until/--to-topic: the window, re-keyed, mapped."""
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(config_text(topic_prefix))
    ingress = Topics.of(config(topic_prefix)).ingress
    capture = f"{topic_prefix}what-if.requests"
    await ensure_topics(kafka_settings, {ingress: 4, capture: 1})
    base, windows = await produce_windows(kafka_settings, ingress, topic_prefix)
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((base + 15_000) / 1000))
    report = tmp_path / "report"
    rc = await replay_command(cli_args([
        "--config", str(cfg_path), "--bootstrap", broker.bootstrap, "--from-topic", ingress,
        "--since", since, "--until", str((base + 45_000) / 1000), "--to-topic", capture,
        "--speed", "50", "--timeout-s", "0.2", "--report", str(report), "--no-progress"]))
    assert rc == 1  # nothing answers here: every request is reported missing
    sent = await read_all(kafka_settings, capture, 1)
    id_map = {m["id"]: m for m in map(json.loads, (report / "id_map.jsonl").open())}
    assert sorted(id_map[r.id]["original_id"] for _, r in sent) == sorted(
        r.id for r in windows["b"])
    assert all(m["origin"].startswith(f"{ingress}/") for m in id_map.values())
    summary = json.loads((report / "report.json").read_text())
    assert summary["totals"]["missing"] == summary["totals"]["requests"] == 12


def cli_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


async def test_trace_replay_through_the_live_pipeline_reports_every_request(
        broker, kafka_settings, topic_prefix, tmp_path):
    """A noisy-neighbour trace through the in-process pipeline: one outcome per request, report."""
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(config_text(topic_prefix))
    records = noisy_neighbour(300, quiet_orgs=["quiet-2"], victim_requests=3,
                              victim_interval_s=0.1, tokens=16)
    records += [TraceRecord(ts=0.2, org="searchco", endpoint="rerank", tokens=40, id="rr-1"),
                TraceRecord(ts=0.25, org="nobody", endpoint="embed", tokens=8, id="who-1")]
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, sorted(records, key=lambda r: r.ts))
    report = tmp_path / "report"
    rc = await replay_command(cli_args([
        "--config", str(cfg_path), "--trace", str(trace), "--bootstrap", broker.bootstrap,
        "--embedded", "--model", "fake:ms_per_token=0.01", "--speed", "2",
        "--report", str(report), "--compare-simulate", "--timeout-s", "30", "--no-progress",
        "--kafka-session-timeout-ms", "2000", "--kafka-heartbeat-interval-ms", "500"]))
    assert rc == 0
    summary = json.loads((report / "report.json").read_text())
    totals = summary["totals"]
    assert totals["requests"] == len(records)
    assert (totals["completed"], totals["invalid"], totals["missing"]) == (len(records) - 1, 1, 0)
    assert summary["orgs"]["quiet-1"]["completed"] == 3
    assert summary["rejections"] == {"invalid: unknown_org": 1}
    outcomes = [json.loads(line) for line in (report / "outcomes.jsonl").open()]
    assert sorted(o["id"] for o in outcomes) == sorted(r.id for r in records)
    assert summary["meta"]["token_margin"]["max_abs_diff"] == 0
    compare = (report / "compare.md").read_text()
    assert "quiet-1" in compare and "p99 ms simulate" in compare
    assert "calibrated: fitted to this replay's results" in compare and "feedback ms" in compare
    assert sum(1 for _ in (report / "results.jsonl").open()) == len(records)
    assert summary["live_fairness"]["samples"] >= 1  # the scheduler's own figures, sampled
    assert (report / "simulate" / "report.json").exists()
    assert sum(1 for _ in (report / "trace.jsonl").open()) == len(records)
    assert sum(1 for _ in (report / "id_map.jsonl").open()) == len(records)
    assert_each_id_once(report)


def assert_each_id_once(report) -> None:
    """What came back, counted by id: no copy written, none handed over twice, none foreign."""
    st = json.loads((report / "replay.json").read_text())
    counts = {k: st[k] for k in ("duplicate_results", "delivered_twice", "foreign_results",
                                 "send_failed", "missing")}
    assert counts == dict.fromkeys(counts, 0), (counts, st["by_id_examples"])


@pytest.mark.slow
async def test_ten_thousand_request_noisy_neighbour_replay(
        broker, kafka_settings, topic_prefix, tmp_path):
    """10,015 requests, one org bursting: all accounted for, quiet orgs ahead of the burst."""
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(config_text(topic_prefix))
    trace = tmp_path / "nn.jsonl"
    write_trace(trace, noisy_neighbour(10_000, quiet_orgs=["quiet-2", "searchco"]))
    report = tmp_path / "report"
    rc = await replay_command(cli_args([
        "--config", str(cfg_path), "--trace", str(trace), "--bootstrap", broker.bootstrap,
        "--embedded", "--model", "fake:ms_per_token=0.005", "--report", str(report),
        "--compare-simulate", "--timeout-s", "300", "--no-progress",
        "--kafka-session-timeout-ms", "2000", "--kafka-heartbeat-interval-ms", "500"]))
    assert rc == 0
    summary = json.loads((report / "report.json").read_text())
    assert summary["totals"]["requests"] == 10_015
    assert summary["totals"]["missing"] == 0
    assert_each_id_once(report)
    outcomes = [json.loads(line) for line in (report / "outcomes.jsonl").open()]
    assert len(outcomes) == 10_015 and len({o["id"] for o in outcomes}) == 10_015
    orgs = summary["orgs"]
    for quiet in ("quiet-1", "quiet-2", "searchco"):
        assert orgs[quiet]["completed"] == 5
        # Under DRR a quiet org is served ahead of the burst queued before it.
        assert orgs[quiet]["latency_ms"]["p50"] < orgs["bulkcorp"]["latency_ms"]["p50"]
    assert (report / "compare.md").exists()


@pytest.mark.parametrize("argv, problem", [
    (["--from-topic", "x"], "--since"),
    (["--trace", "t.jsonl", "--from-topic", "x"], "one of"),
    (["--from-topic", "x", "--since", "1700000000", "--bootstrap", "embedded"], "--bootstrap"),
])
async def test_command_refuses_inconsistent_sources(argv, problem, capsys):
    """Conflicting or incomplete source flags are refused before anything starts."""
    rc = await replay_command(cli_args(["--config", str(EXAMPLE), *argv]))
    assert rc == 2
    err = capsys.readouterr().err
    assert problem in err or "give --trace" in err
