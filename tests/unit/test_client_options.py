"""The client's request options: builders, submit flags, decoding and display."""

from __future__ import annotations

import argparse

import msgspec
import numpy as np
import pytest

from producer.client import (
    _build_request,
    add_arguments,
    decode_embeddings,
    embed_input,
    rerank_input,
    result_for_display,
)
from schemas.codec import codec_for
from schemas.messages import Request, Result
from schemas.vectors import result_fields


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--config", "c.toml", "--org", "o", "--endpoint", "e", *argv])


def test_every_embed_option_has_a_flag():
    """Each embed option given as a flag lands in the input, as the wire schema reads it."""
    req = _build_request(parse(
        "--text", "a", "--input-type", "search_query", "--truncate", "none", "--no-normalize",
        "--dimensions", "64", "--embedding-type", "int8", "--embedding-type", "ubinary",
        "--encoding", "base64"))
    assert req["input"] == {"type": "embed", "texts": ["a"], "input_type": "search_query",
                            "truncate": "none", "normalize": False, "dimensions": 64,
                            "embedding_types": ["int8", "ubinary"], "encoding": "base64"}
    assert _build_request(parse("--text", "a", "--prompt-name", "q"))["input"]["prompt_name"] == "q"
    msgspec.convert({"id": "x", "org": "o", "endpoint": "e", **req}, Request)


def test_every_rerank_option_has_a_flag():
    """--max-tokens-per-doc, --return-documents and --truncate build a rerank input."""
    req = _build_request(parse("--query", "q", "--doc", "d", "--top-n", "1",
                               "--max-tokens-per-doc", "32", "--return-documents",
                               "--truncate", "start"))
    assert req["input"] == {"type": "rerank", "query": "q", "documents": ["d"], "top_n": 1,
                            "max_tokens_per_doc": 32, "return_documents": True,
                            "truncate": "start"}


@pytest.mark.parametrize(("argv", "match"), [
    (("--text", "a", "--max-tokens-per-doc", "3"), "max_tokens_per_doc: rerank options"),
    (("--query", "q", "--doc", "d", "--dimensions", "3"), "dimensions: embed options"),
    (("--text", "a", "--dimensions", "0"), r"\$.dimensions"),
    (("--text", "a", "--input-type", "two words"), r"\$.input_type"),
])
def test_bad_or_misplaced_options_are_usage_errors_naming_the_option(argv, match):
    """An option of the other kind, or a value its type refuses, is refused before sending."""
    with pytest.raises(ValueError, match=match):
        _build_request(parse(*argv))


def test_builders_check_options():
    """embed_input / rerank_input refuse unknown options and bad values by name."""
    assert embed_input(["t"], dimensions=8, normalize=None) == {
        "type": "embed", "texts": ["t"], "dimensions": 8}
    with pytest.raises(msgspec.ValidationError, match="unknown field `normalise`"):
        embed_input(["t"], normalise=True)
    with pytest.raises(msgspec.ValidationError, match=r"\$.embedding_types\[0\]"):
        embed_input(["t"], embedding_types=["int4"])
    assert rerank_input("q", ["d"], 2, return_documents=True)["top_n"] == 2


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_decode_embeddings_gives_the_same_arrays_from_numbers_or_bytes(fmt):
    """decode_embeddings reads numbers and packed bytes into equal numpy arrays."""
    codec = codec_for(Result)
    floats = np.random.default_rng(3).standard_normal((2, 10)).astype(np.float32)
    ints = (floats * 50).astype(np.int8)
    arrays = {"float": floats, "int8": ints}
    decoded = []
    for encoding in ("float", "base64"):
        r = Result(id="x", status="ok", dimensions=10, **result_fields(arrays, encoding))
        decoded.append(decode_embeddings(codec.decode(codec.encode(r, fmt), fmt)))
    for got in decoded:
        assert got["float"].dtype == np.float32 and np.array_equal(got["float"], floats)
        assert got["int8"].dtype == np.int8 and np.array_equal(got["int8"], ints)


def test_packed_bytes_of_the_wrong_size_are_a_clear_error():
    """A float vector whose byte count is not a multiple of 4 is refused, naming where."""
    with pytest.raises(ValueError, match=r"embeddings_packed\['float'\]\[0\] has 5 bytes"):
        decode_embeddings(Result(id="x", status="ok", embeddings_packed={"float": [b"12345"]}))


def test_display_shortens_typed_and_packed_embeddings():
    """The printout shows each type's vectors decoded, as dimension and head."""
    v = np.arange(20, dtype=np.float32).reshape(1, 20)
    r = Result(id="x", status="ok", **result_fields({"float": v, "uint8": v.astype(np.uint8)},
                                                    "base64"))
    shown = result_for_display(r)["embeddings_packed"]
    assert shown["float"] == [{"dim": 20, "head": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]}]
    assert shown["uint8"][0]["head"] == list(range(8))
    assert isinstance(result_for_display(r, full=True)["embeddings_packed"]["float"][0], str)
