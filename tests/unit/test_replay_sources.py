"""Replay sources: times on the command line, trace lines to requests, items back to a trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.config import load_config
from schemas.messages import EmbedInput, Request, RerankInput
from tokens.counting import WhitespaceTokenCounter
from traffic.replay_sources import ReplayItem, items_from_trace, parse_time_ms, to_trace
from traffic.textsynth import TextSynth
from traffic.trace import TraceRecord

CONFIG = load_config(Path(__file__).resolve().parents[2] / "examples" / "config.toml")


def test_parse_time_iso_and_epoch_seconds():
    """ISO-8601 with a zone, without one (UTC) and epoch seconds all give epoch ms."""
    assert parse_time_ms("2025-01-02T03:04:05Z") == 1735787045000
    assert parse_time_ms("2025-01-02T03:04:05") == 1735787045000
    assert parse_time_ms("2025-01-02T05:04:05+02:00") == 1735787045000
    assert parse_time_ms("1735787045.5") == 1735787045500
    assert parse_time_ms(" 1735787045 ") == 1735787045000


@pytest.mark.parametrize("bad", ["1735787045000", "yesterday", ""])
def test_parse_time_refuses_milliseconds_and_nonsense(bad):
    """Epoch milliseconds and unparseable text are errors that quote the input."""
    with pytest.raises(ValueError, match="epoch"):
        parse_time_ms(bad)


def synth_for(endpoint: str) -> TextSynth:
    return TextSynth(WhitespaceTokenCounter())


def test_trace_lines_become_requests_of_the_endpoint_kind():
    """Token-only lines get made-up inputs of the endpoint's kind; texts are kept as given."""
    recs = [
        TraceRecord(ts=0.0, org="acme", endpoint="embed", tokens=40, id="e1", priority=3,
                    deadline_ms=900),
        TraceRecord(ts=0.5, org="acme", endpoint="rerank", tokens=90, id="r1"),
        TraceRecord(ts=1.0, org="acme", endpoint="embed", tokens=999, id="t1",
                    texts=["hello there world"]),
        TraceRecord(ts=1.5, org="acme", endpoint="rerank", tokens=7, id="t2",
                    texts=["a b", "c d e"], query="q"),
        TraceRecord(ts=2.0, org="acme", endpoint="nope", tokens=12, id="u1"),
    ]
    items = {it.request.id: it for it in items_from_trace(recs, CONFIG, synth_for)}
    e1, r1, t1, t2, u1 = (items[i] for i in ("e1", "r1", "t1", "t2", "u1"))
    assert isinstance(e1.request.input, EmbedInput)
    assert (e1.request.priority, e1.request.deadline_ms, e1.tokens) == (3, 900, 40)
    assert synth_for("embed").count(e1.request.input) == 40
    assert isinstance(r1.request.input, RerankInput)
    assert synth_for("rerank").count(r1.request.input) == 90
    assert t1.request.input.texts == ("hello there world",)
    assert t1.tokens == 3  # admission's count, not the trace's estimate
    assert t2.request.input == RerankInput(query="q", documents=("a b", "c d e"))
    assert t2.tokens == 7
    assert isinstance(u1.request.input, EmbedInput)  # admission will call it invalid
    assert [it.ts for it in items.values()] == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_to_trace_scales_time_by_speed_and_keeps_ids():
    """The replayed items as a trace: ts divided by the speed, original ids and tokens kept."""
    req = Request(id="x-1", org="acme", endpoint="embed", input=EmbedInput(texts=("a",)),
                  priority=2, deadline_ms=500)
    recs = to_trace([ReplayItem(ts=3.0, request=req, tokens=17)], speed=2.0)
    assert recs == [TraceRecord(ts=1.5, org="acme", endpoint="embed", tokens=17, id="x-1",
                                priority=2, deadline_ms=500)]
