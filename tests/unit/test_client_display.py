"""The submit command's pure parts: building the request and shortening the printout."""

from __future__ import annotations

import argparse

import pytest

from producer.client import _build_request, add_arguments, result_for_display
from schemas.messages import Result


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--config", "c.toml", "--org", "o", "--endpoint", "e", *argv])


def test_embed_and_rerank_requests_from_flags():
    """--text builds embed input; --query/--doc build rerank input with top_n and deadline."""
    assert _build_request(parse("--text", "a", "--text", "b"))["input"] == {
        "type": "embed", "texts": ["a", "b"]}
    req = _build_request(parse("--query", "q", "--doc", "d1", "--doc", "d2", "--top-n", "1",
                               "--deadline-ms", "500", "--priority", "3"))
    assert req["input"] == {"type": "rerank", "query": "q", "documents": ["d1", "d2"], "top_n": 1}
    assert (req["deadline_ms"], req["priority"]) == (500, 3)


@pytest.mark.parametrize("argv", [(), ("--text", "a", "--query", "q"), ("--query", "q")])
def test_missing_or_mixed_inputs_are_refused(argv):
    """Neither or both kinds of input is a usage error that says what to give."""
    with pytest.raises(ValueError, match="--text"):
        _build_request(parse(*argv))


def test_embeddings_are_shortened_unless_full():
    """Vectors print as dimension and first 8 values; --full prints them whole."""
    result = Result(id="r", status="ok", embeddings=[[0.5] * 384])
    assert result_for_display(result)["embeddings"] == [{"dim": 384, "head": [0.5] * 8}]
    assert result_for_display(result, full=True)["embeddings"] == [[0.5] * 384]
