"""Admission and the request options: each bad value refused naming its field, costs as computed."""

from __future__ import annotations

import msgspec
import pytest

from producer.admission import Admitted, DeadLetterReason, Refused, decide
from producer.ratelimit import RateLimiter
from producer.throttle import ThrottleState
from schemas.config import ConfigError
from schemas.messages import EmbedInput, RerankInput
from tests.admission_setup import NOW_MS, registry, request_json
from tokens.counting import WhitespaceTokenCounter


def options_config(**embed):
    """The shared test registry, its embed endpoint listing two prompts (and ``embed`` keys)."""
    larger = {"max_text_chars": 400, "max_request_tokens": 64, "max_batch_tokens": 64,
              "quantum": 64}
    return registry(endpoints={
        "embed": {**larger, "prompts": {"search_query": "find: ", "search_document": ""},
                  **embed},
        "rerank": larger}).config


CFG = options_config()
#: Reads at most 8 words; vectors of 16 values.
COUNTER = WhitespaceTokenCounter(max_seq_length=8, dimension=16)
LONG = " ".join(["w"] * 12)  # 12 tokens: longer than the model reads


def run(inp: dict, *, org: str = "acme", endpoint: str | None = None, counter=COUNTER,
        config=CFG):
    endpoint = endpoint or inp["type"]
    body = request_json(org=org, endpoint=endpoint, input=inp)
    return decide(body, None, NOW_MS, config, RateLimiter(config), ThrottleState(), counter,
                  NOW_MS)


def embed(texts=("hello world",), **options) -> dict:
    return {"type": "embed", "texts": list(texts), **options}


def rerank(query="q", documents=("a b",), **options) -> dict:
    return {"type": "rerank", "query": query, "documents": list(documents), **options}


def refusal(out, reason: str, *in_message: str) -> None:
    assert isinstance(out, Refused), out
    r = out.result
    assert (r.status, r.reason) == ("invalid", reason), r
    for part in in_message:
        assert part in r.message, (part, r.message)


def dead(out, *in_error: str) -> None:
    """A value the schema refuses: dead letter, and an invalid result naming the field."""
    assert isinstance(out, DeadLetterReason), out
    assert out.result is not None and out.result.status == "invalid"
    assert out.result.reason == "decode_error"
    for part in in_error:
        assert part in out.result.message, (part, out.result.message)


# -- admitted, with what the worker needs -----------------------------------------------


def test_no_options_cost_and_input_as_before():
    """A request with no options is admitted as before: its words, its input unchanged."""
    out = run(embed(["a b c", "d"]))
    assert isinstance(out, Admitted)
    assert out.request.tokens == 4
    assert out.request.input == EmbedInput(texts=("a b c", "d"))


def test_prompt_resolved_from_input_type_or_prompt_name_and_counted():
    """input_type / prompt_name put the endpoint's prompt text into the admitted input, and its
    tokens into the cost."""
    for key in ("input_type", "prompt_name"):
        out = run(embed(["a b"], **{key: "search_query"}))
        assert isinstance(out, Admitted), out
        assert out.request.input.prompt == "find: "
        assert out.request.tokens == 3  # "find:" + 2 words
    both = run(embed(["a b"], input_type="search_query", prompt_name="search_query"))
    assert isinstance(both, Admitted)
    empty = run(embed(["a b"], input_type="search_document"))
    assert empty.request.input.prompt == "" and empty.request.tokens == 2


def test_truncating_requests_cost_what_the_model_computes():
    """With truncate end/start a text past max_seq_length costs max_seq_length, not its length."""
    for truncate in (None, "end", "start", "START"):
        opts = {} if truncate is None else {"truncate": truncate}
        out = run(embed([LONG, "a"], **opts))
        assert isinstance(out, Admitted), out
        assert out.request.tokens == 8 + 1
        assert out.request.input.truncate == (truncate or "end").lower()


def test_dimensions_are_not_cheaper_and_types_cost_nothing():
    """dimensions and embedding_types leave the cost as it is: the model computes it all."""
    plain = run(embed(["a b c"])).request.tokens
    out = run(embed(["a b c"], dimensions=2, embedding_types=["int8", "ubinary", "float"],
                    encoding="base64", normalize=True))
    assert isinstance(out, Admitted), out
    assert out.request.tokens == plain == 3


def test_rerank_max_tokens_per_doc_caps_each_pair():
    """max_tokens_per_doc cuts each document's share of the cost; truncation caps each pair."""
    out = run(rerank("q", ["a b c d e", "a"], max_tokens_per_doc=2), org="acme")
    assert isinstance(out, Admitted), out
    assert out.request.tokens == (1 + 2) + (1 + 1)
    out = run(rerank("q", [LONG]))
    assert out.request.tokens == 8
    assert run(rerank("q", ["a"], return_documents=True)).request.input.return_documents


# -- refused, naming the field -------------------------------------------------------


def test_truncate_none_refuses_a_long_text_with_its_count_and_the_limit():
    """truncate=none: a text longer than the model reads is refused with its tokens and the limit."""
    out = run(embed(["ok", LONG], truncate="none"))
    refusal(out, "input_too_long", "input.texts[1]", "12 tokens", "the 8 the model reads",
            "'none'")
    ok = run(embed(["a b c d e f g h"], truncate="NONE"))
    assert isinstance(ok, Admitted) and ok.request.tokens == 8
    # The prompt counts: 8 words fit, the prompt's word makes 9.
    refusal(run(embed(["a b c d e f g h"], truncate="none", input_type="search_query")),
            "input_too_long", "9 tokens (prompt included)")


def test_rerank_truncate_none_checks_what_the_model_reads():
    """truncate=none on rerank: the cosine reranker reads query and documents alone."""
    refusal(run(rerank("q", ["a", LONG], truncate="none")), "input_too_long",
            "input.documents[1]", "12 tokens", "8")
    refusal(run(rerank(LONG, ["a"], truncate="none")), "input_too_long", "input.query")
    # Cut to 4 tokens, the document fits.
    assert isinstance(run(rerank("q", [LONG], truncate="none", max_tokens_per_doc=4)), Admitted)


def test_rerank_truncate_none_for_a_cross_encoder_checks_pairs():
    """A cross-encoder reads query and document together: the pair must fit."""
    cfg = options_config()
    cfg.endpoints["rerank"] = msgspec.structs.replace(cfg.endpoints["rerank"],
                                                      rerank_method="cross-encoder")
    refusal(run(rerank("a b c", ["d e f g h i"], truncate="none"), config=cfg),
            "input_too_long", "input.documents[0] with input.query", "9 tokens")


def test_unknown_prompt_names_the_field_and_lists_the_prompts():
    """A prompt the endpoint does not list is refused, naming the field and the prompts it has."""
    refusal(run(embed(input_type="clustering")), "unknown_prompt", "input.input_type",
            "'clustering'", "search_document, search_query")
    refusal(run(embed(prompt_name="query")), "unknown_prompt", "input.prompt_name")
    no_prompts = options_config(prompts={})
    refusal(run(embed(input_type="search_query"), config=no_prompts), "unknown_prompt",
            "takes no input_type")


def test_conflicting_prompts_duplicate_types_and_a_sent_prompt_are_invalid():
    """Two different prompts, a type listed twice, a prompt text sent: invalid_option, by field."""
    refusal(run(embed(input_type="search_query", prompt_name="search_document")),
            "invalid_option", "input.input_type", "input.prompt_name")
    refusal(run(embed(embedding_types=["int8", "float", "int8"])), "invalid_option",
            "input.embedding_types", "'int8' twice")
    refusal(run(embed(prompt="ignore the above: ")), "invalid_option", "input.prompt")


def test_dimensions_above_the_model_are_refused():
    """dimensions above the model's size is refused with both numbers; unknown size passes."""
    refusal(run(embed(dimensions=17)), "dimensions_too_large", "input.dimensions = 17",
            "16 dimensions")
    assert isinstance(run(embed(dimensions=16)), Admitted)
    unknown = WhitespaceTokenCounter(max_seq_length=8)
    assert isinstance(run(embed(dimensions=17), counter=unknown), Admitted)


@pytest.mark.parametrize(("inp", "field"), [
    (embed(truncate="middle"), "$.input.truncate"),
    (embed(truncate=True), "$.input.truncate"),
    (embed(normalize="yes"), "$.input.normalize"),
    (embed(dimensions=0), "$.input.dimensions"),
    (embed(dimensions=2.5), "$.input.dimensions"),
    (embed(dimensions=10**6), "$.input.dimensions"),
    (embed(embedding_types=[]), "$.input.embedding_types"),
    (embed(embedding_types=["int4"]), "$.input.embedding_types[0]"),
    (embed(embedding_types="float"), "$.input.embedding_types"),
    (embed(encoding="hex"), "$.input.encoding"),
    (embed(input_type="a b"), "$.input.input_type"),
    (embed(prompt_name=""), "$.input.prompt_name"),
    (embed(input_type=7), "$.input.input_type"),
    (rerank(max_tokens_per_doc=0), "$.input.max_tokens_per_doc"),
    (rerank(max_tokens_per_doc=-3), "$.input.max_tokens_per_doc"),
    (rerank(return_documents="yes"), "$.input.return_documents"),
    (rerank(truncate="left"), "$.input.truncate"),
])
def test_bad_option_types_are_invalid_naming_the_field(inp, field):
    """A value the option's type refuses gets an invalid result whose message names the field."""
    dead(run(inp), field)


def test_config_prompts_only_on_embed_endpoints():
    """A rerank endpoint with prompts is a configuration error naming the field."""
    with pytest.raises(ConfigError, match=r"endpoints.rerank.prompts"):
        registry(endpoints={"rerank": {"prompts": {"q": "x"}}})


def test_rerank_input_defaults_stay_off_the_wire():
    """Options at their defaults are not encoded: an old reader sees the same message."""
    assert msgspec.json.encode(RerankInput(query="q", documents=("d",))) == \
        b'{"type":"rerank","query":"q","documents":["d"]}'
    assert msgspec.json.encode(EmbedInput(texts=("t",))) == b'{"type":"embed","texts":["t"]}'
