"""The trace format: reading, writing, errors, token estimates, scenario generators."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from traffic.trace import (
    TraceError,
    TraceRecord,
    add_arguments,
    backlogged,
    decode_trace,
    estimate_tokens,
    noisy_neighbour,
    read_trace,
    run,
    write_trace,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def line(**fields) -> str:
    base = {"ts": 0.0, "org": "a", "endpoint": "embed", "tokens": 8}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None})


def error_of(*lines: str) -> TraceError:
    with pytest.raises(TraceError) as info:
        decode_trace(lines, source="t.jsonl")
    return info.value


def test_round_trip(tmp_path):
    """Records written and read back are equal, optional fields included."""
    recs = [
        TraceRecord(ts=0.0, org="a", endpoint="embed", tokens=5, id="r1"),
        TraceRecord(ts=0.25, org="b", endpoint="rerank", tokens=40, id="r2",
                    texts=["doc one", "doc two"], query="what", priority=3, deadline_ms=1500),
    ]
    path = tmp_path / "t.jsonl"
    assert write_trace(path, recs) == 2
    assert read_trace(path) == recs


def test_relative_ts_shift_to_zero_and_sort():
    """A relative trace is shifted so its earliest line is 0, sorted, ties in line order."""
    recs = decode_trace([line(ts=5.0, id="x"), line(ts=3.0, id="y"), line(ts=3.0, id="z")])
    assert [(r.id, r.ts) for r in recs] == [("y", 0.0), ("z", 0.0), ("x", 2.0)]


def test_epoch_ts_detected_and_normalised():
    """Epoch seconds become seconds since the first request."""
    recs = decode_trace([line(ts=1_700_000_000.0), line(ts=1_700_000_002.5)])
    assert [r.ts for r in recs] == [0.0, 2.5]


def test_generated_ids_name_the_line():
    """A line without an id gets ``line-<n>``; blank lines keep the numbering."""
    recs = decode_trace([line(), "", line(id="mine"), line()])
    assert [r.id for r in recs] == ["line-1", "mine", "line-4"]


@pytest.mark.parametrize("bad, field, words", [
    (line(tokens="many"), "tokens", "int"),
    (line(tokens=0), "tokens", ">= 1"),
    (line(org="a b"), "org", "regex"),
    (line(ts=-1), "ts", ">= 0"),
    (line(tokens=None), "tokens", "`tokens` or `texts`"),
    (line(tokens=None, texts=[]), "texts", "length"),
    (line(priority=101), "priority", "<= 100"),
    (line(deadline_ms=0), "deadline_ms", ">= 1"),
    (json.dumps({"ts": 0, "org": "a", "tokens": 1}), "endpoint", "missing"),
    (line(ts=1_700_000_000_000), "ts", "milliseconds"),
])
def test_bad_line_names_line_and_field(bad, field, words):
    """A bad line's error names the file, its line number and the field at fault."""
    err = error_of(line(), bad)
    assert (err.source, err.line, err.field) == ("t.jsonl", 2, field)
    assert words in str(err)
    assert str(err).startswith(f"t.jsonl:2: field `{field}`")


def test_not_json_names_the_line():
    """A line that is not a JSON object is reported with its line number."""
    for bad in ("{not json", "[1, 2]"):
        err = error_of(line(), "", bad)
        assert err.line == 3 and err.field is None


def test_mixed_clocks_refused():
    """Epoch and relative timestamps in one trace are an error, not a 50-year gap."""
    err = error_of(line(ts=1_700_000_000.0), line(ts=3.0))
    assert err.line == 2 and err.field == "ts" and "mixes clocks" in str(err)


def test_duplicate_id_refused():
    """An id may appear once; the error points at both lines."""
    err = error_of(line(id="x"), line(id="y"), line(id="x"))
    assert err.line == 3 and err.field == "id" and "line 1" in str(err)


def test_estimate_tokens_heuristic():
    """Words x 1.3 (rounded up) plus punctuation plus [CLS] and [SEP]."""
    assert estimate_tokens("") == 2
    assert estimate_tokens("Hello, world!") == 2 + 3 + 2
    assert estimate_tokens("one two three four five six seven eight nine ten") == 2 + 13


def test_texts_counted_with_given_counter():
    """``texts`` alone are counted by the counter given; ``tokens`` wins when both are set."""
    count = len  # one token per character, to see it used
    recs = decode_trace([line(tokens=None, texts=["abc", "de"]),
                         line(tokens=None, texts=["abc"], query="qq"),
                         line(tokens=7, texts=["abc"])], token_counter=count)
    assert [r.tokens for r in recs] == [5, 5, 7]


def test_default_counter_is_the_estimate():
    """Without a counter, texts are estimated with :func:`estimate_tokens`."""
    (r,) = decode_trace([line(tokens=None, texts=["Hello, world!", "hi"])])
    assert r.tokens == estimate_tokens("Hello, world!") + estimate_tokens("hi")


def test_noisy_neighbour_shape():
    """The burst precedes and overlaps the victim's evenly spaced requests."""
    recs = noisy_neighbour(1000, quiet_orgs=["quiet-2"], tokens=32)
    by_org: dict[str, list[TraceRecord]] = {}
    for r in recs:
        by_org.setdefault(r.org, []).append(r)
    assert len(by_org["bulkcorp"]) == 1000 and len(by_org["quiet-1"]) == 5
    assert [r.ts for r in by_org["quiet-1"]] == [0.1, 0.6, 1.1, 1.6, 2.1]
    assert [r.ts for r in by_org["quiet-2"]] == [0.11, 0.61, 1.11, 1.61, 2.11]
    assert max(r.ts for r in by_org["bulkcorp"]) < 0.1
    assert all(r.tokens == 32 for r in recs)
    assert [r.ts for r in recs] == sorted(r.ts for r in recs)
    assert len({r.id for r in recs}) == len(recs)


def test_backlogged_shape():
    """Every org sends the same number of requests at t=0, interleaved."""
    recs = backlogged(["a", "b"], 3)
    assert [r.org for r in recs] == ["a", "b"] * 3
    assert {r.ts for r in recs} == {0.0}


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_cli_writes_and_checks(tmp_path, capsys):
    """``trace noisy-neighbour`` writes a trace that ``trace check`` accepts."""
    out = tmp_path / "nn.jsonl"
    assert run(parse("noisy-neighbour", "--burst", "20", "--tokens", "16",
                     "--quiet-orgs", "quiet-2,searchco", "--out", str(out))) == 0
    recs = read_trace(out)
    assert len(recs) == 20 + 3 * 5 and {r.tokens for r in recs} == {16}
    assert run(parse("check", str(out))) == 0
    assert "35 requests" in capsys.readouterr().out


def test_cli_check_reports_bad_line(tmp_path, capsys):
    """``trace check`` exits 2 and prints the line and field of a bad line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(line() + "\n" + line(tokens="x") + "\n")
    assert run(parse("check", str(bad))) == 2
    assert "bad.jsonl:2: field `tokens`" in capsys.readouterr().err


def test_shipped_traces_are_the_generators_output():
    """The example traces are exactly what the documented commands generate."""
    assert read_trace(EXAMPLES / "traces" / "noisy_neighbour.jsonl") == noisy_neighbour(10_000)
    orgs = ["weight-1", "weight-2", "weight-3", "weight-4"]
    assert read_trace(EXAMPLES / "traces" / "backlogged.jsonl") == backlogged(orgs, 2_000)
