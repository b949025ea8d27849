"""Request options in traffic logs: read, checked by field, replayed, written back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.config import load_config
from schemas.messages import EmbedInput, Request, RerankInput
from schemas.options import RequestOptions
from tokens.counting import WhitespaceTokenCounter
from traffic.replay_sources import (
    ReplayError,
    ReplayItem,
    items_from_trace,
    options_of,
    to_trace,
)
from traffic.textsynth import TextSynth
from traffic.trace import TraceError, decode_trace, read_trace, write_trace

CONFIG = load_config(Path(__file__).resolve().parents[2] / "examples" / "config.toml")


def line(**fields) -> str:
    return json.dumps({"ts": 0.0, "org": "acme", "endpoint": "embed", "tokens": 8, **fields})


def synth_for(endpoint: str) -> TextSynth:
    return TextSynth(WhitespaceTokenCounter())


def test_options_are_read_and_replayed_into_the_input():
    """A line's options reach the replayed request's input, for both kinds."""
    recs = decode_trace([
        line(id="e", texts=["hello"], options={"truncate": "NONE", "dimensions": 64,
                                               "embedding_types": ["int8", "float"],
                                               "encoding": "base64", "input_type": "q"}),
        line(id="r", endpoint="rerank", options={"max_tokens_per_doc": 16,
                                                 "return_documents": True}),
        line(id="p"),
    ])
    assert recs[0].options == RequestOptions(truncate="NONE", dimensions=64,
                                             embedding_types=["int8", "float"],
                                             encoding="base64", input_type="q")
    embed, rerank, plain = (it.request.input for it in items_from_trace(recs, CONFIG, synth_for))
    assert embed == EmbedInput(texts=("hello",), truncate="NONE", dimensions=64,
                               embedding_types=["int8", "float"], encoding="base64",
                               input_type="q")
    assert isinstance(rerank, RerankInput)
    assert (rerank.max_tokens_per_doc, rerank.return_documents) == (16, True)
    assert options_of(plain) is None


@pytest.mark.parametrize(("options", "field"), [
    ({"dimensions": 0}, "options.dimensions"),
    ({"truncate": "middle"}, "options.truncate"),
    ({"embedding_types": ["int4"]}, "options.embedding_types[0]"),
    ({"normalise": True}, None),
])
def test_a_bad_option_in_a_trace_names_line_and_field(options, field):
    """A bad option value (or a misspelt key) fails the read naming the line and the field."""
    with pytest.raises(TraceError) as e:
        decode_trace([line(), line(options=options)], source="t.jsonl")
    assert e.value.line == 2
    if field is None:
        assert "normalise" in str(e.value)
    else:
        assert e.value.field == field, e.value


def test_options_of_the_other_kind_stop_the_replay_with_a_clear_error():
    """max_tokens_per_doc on an embed line is refused before anything is sent."""
    recs = decode_trace([line(id="x", options={"max_tokens_per_doc": 3})])
    with pytest.raises(ReplayError, match=r"'x'.*max_tokens_per_doc.*embed request"):
        items_from_trace(recs, CONFIG, synth_for)


def test_replayed_traffic_keeps_its_options_in_the_trace_it_writes(tmp_path):
    """to_trace writes a request's options, and reading the file gives them back."""
    req = Request(id="a", org="acme", endpoint="embed",
                  input=EmbedInput(texts=("t",), dimensions=8, normalize=False))
    recs = to_trace([ReplayItem(ts=0.0, request=req, tokens=3)])
    assert recs[0].options == RequestOptions(dimensions=8, normalize=False)
    path = tmp_path / "t.jsonl"
    write_trace(path, recs)
    assert read_trace(path)[0].options == recs[0].options
