"""Traffic logs: the trace format read by the simulator and the live replay.

A trace is JSON Lines, one request per line, in time order::

    {"ts": 0.0, "org": "bulkcorp", "endpoint": "embed", "tokens": 64}
    {"ts": 0.1, "org": "quiet-1", "endpoint": "embed", "texts": ["hello world"],
     "priority": 2, "deadline_ms": 1500, "id": "q1-0"}

Fields:

* ``ts`` -- seconds, a float >= 0: either relative (to the first line, or to
  any origin) or epoch seconds. Which one is detected: a ``ts`` at or above
  1e9 (September 2001) is epoch seconds, and then every line must be; a
  ``ts`` at or above 1e11 is refused as milliseconds. Either way the reader
  shifts the trace so that its earliest request is at 0 (for a log in time
  order, the first line) and returns the records sorted by ``ts``, ties kept
  in line order.
* ``org``, ``endpoint`` -- names, as in the configuration. The tier is never
  read from a trace: like the live system, the simulator takes it from the
  configuration.
* ``tokens`` (int >= 1) and/or ``texts`` (list of strings). With ``texts``
  alone, the tokens are counted by the ``token_counter`` given to the reader
  (a callable on one string) or, by default, estimated by
  :func:`estimate_tokens`. With both, ``tokens`` wins: it is the measured
  count. A rerank request may add ``query``; it is counted once per text,
  since a cross-encoder reads the query with every document.
* ``priority`` (0..100) and ``deadline_ms`` (milliseconds after ``ts``),
  both optional.
* ``id`` -- optional; a missing id becomes ``line-<n>`` (its line number),
  so ids are stable across runs and a simulated and a live run of one trace
  can be joined request by request. Ids must be unique.
* ``options`` -- optional: the request's options
  (:class:`schemas.options.RequestOptions`: ``truncate``, ``dimensions``,
  ``embedding_types``, ``max_tokens_per_doc``...), replayed with the
  request, e.g. ``"options": {"input_type": "search_query", "truncate":
  "none", "embedding_types": ["int8"]}``. Unlike the line itself, an unknown
  key here is an error: a misspelt option must not replay as a default.
  The simulator ignores them (``tokens`` already says what a request costs).

Unknown fields are skipped, so a production log with extra columns can be
read as it is. A bad line raises :class:`TraceError` naming the file, the
line number and the field.

The scenario generators (:func:`noisy_neighbour`, :func:`backlogged`) build
the traces shipped in ``examples/traces/``; ``serving-fairness trace ...``
runs them from the command line (:func:`add_arguments`, :func:`run`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from schemas.messages import DurationMs, EndpointName, OrgId, Priority, RequestId
from schemas.options import RequestOptions

__all__ = [
    "EPOCH_THRESHOLD_S",
    "TokenCounter",
    "TraceError",
    "TraceRecord",
    "add_arguments",
    "backlogged",
    "decode_trace",
    "estimate_tokens",
    "noisy_neighbour",
    "read_trace",
    "run",
    "write_trace",
]

#: A ``ts`` at or above this is epoch seconds (2001-09-09); below it, relative.
EPOCH_THRESHOLD_S = 1e9
#: A ``ts`` at or above this is almost surely epoch milliseconds: refused.
_MS_THRESHOLD = 1e11

TokenCounter = Callable[[str], int]
Tokens = Annotated[int, Meta(ge=1, le=10_000_000)]


class TraceRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One request of a trace, as read: ``ts`` from the trace's start, tokens resolved."""

    ts: float
    org: OrgId
    endpoint: EndpointName
    tokens: Tokens
    id: RequestId
    texts: list[str] | None = None
    query: str | None = None
    priority: Priority = 0
    deadline_ms: DurationMs | None = None
    options: RequestOptions | None = None


class _Line(msgspec.Struct, kw_only=True):
    """One line as written: ``tokens`` and ``id`` may be missing."""

    ts: Annotated[float, Meta(ge=0)]
    org: OrgId
    endpoint: EndpointName
    tokens: Tokens | None = None
    texts: Annotated[list[str], Meta(min_length=1)] | None = None
    query: str | None = None
    priority: Priority = 0
    deadline_ms: DurationMs | None = None
    id: RequestId | None = None
    options: RequestOptions | None = None


class TraceError(ValueError):
    """A trace line is invalid; the message names file, line and field."""

    def __init__(self, source: str, line: int, field: str | None, problem: str):
        self.source = source
        self.line = line
        self.field = field
        self.problem = problem
        where = f"{source}:{line}" + (f": field `{field}`" if field else "")
        super().__init__(f"{where}: {problem}")


_WORD = re.compile(r"[^\W_]+")
_PUNCT = re.compile(r"[^\w\s]|_")


def estimate_tokens(text: str) -> int:
    """Estimate a BERT-style tokenizer's count for ``text``, without a tokenizer.

    ``2 + ceil(1.3 x words) + punctuation marks``: WordPiece splits English
    into about 1.3 pieces per word (rare words into several), each
    punctuation mark is a token of its own, and encoders add ``[CLS]`` and
    ``[SEP]``. Good to about 20% on English prose, which is all a traffic
    log without token counts can give a scheduler; pass the model's own
    tokenizer as ``token_counter`` when it matters.
    """
    words = len(_WORD.findall(text))
    punct = len(_PUNCT.findall(text))
    return 2 + (13 * words + 9) // 10 + punct  # ceil(1.3 x words), in integers


_PATH_IN_ERROR = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def _field_of(err: msgspec.ValidationError) -> tuple[str | None, str]:
    """Split msgspec's ``... - at `$.field` `` into the field and the problem."""
    msg = str(err)
    m = _PATH_IN_ERROR.search(msg)
    if m is None:
        missing = _MISSING.search(msg)
        return (missing.group(1) if missing else None), msg
    return m.group(1) or None, msg[: m.start()]


def _count(line: _Line, counter: TokenCounter) -> int:
    texts = line.texts or []
    q = counter(line.query) if line.query is not None else 0
    return max(1, sum(counter(t) + q for t in texts))


def decode_trace(
    lines: Iterable[bytes | str],
    *,
    source: str = "<trace>",
    token_counter: TokenCounter | None = None,
) -> list[TraceRecord]:
    """Decode trace lines (blank lines skipped): checked, normalised to start at 0, sorted."""
    counter = token_counter or estimate_tokens
    decoder = msgspec.json.Decoder(_Line)
    raw: list[tuple[int, _Line]] = []
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            line = decoder.decode(text)
        except msgspec.ValidationError as e:
            field, problem = _field_of(e)
            raise TraceError(source, n, field, problem) from None
        except msgspec.DecodeError as e:
            raise TraceError(source, n, None, f"not a JSON object: {e}") from None
        if line.tokens is None and line.texts is None:
            raise TraceError(source, n, "tokens", "a request needs `tokens` or `texts`")
        if line.ts >= _MS_THRESHOLD:
            raise TraceError(source, n, "ts", f"{line.ts:g} looks like epoch milliseconds; "
                             "ts is in seconds")
        raw.append((n, line))
    if not raw:
        return []
    epoch = raw[0][1].ts >= EPOCH_THRESHOLD_S
    for n, line in raw:
        if (line.ts >= EPOCH_THRESHOLD_S) != epoch:
            first = "epoch seconds" if epoch else "relative seconds"
            raise TraceError(source, n, "ts", f"{line.ts:g} mixes clocks: the first line's "
                             f"ts is {first}")
    origin = min(line.ts for _, line in raw)
    seen: dict[str, int] = {}
    out: list[TraceRecord] = []
    for n, line in raw:
        rid = line.id if line.id is not None else f"line-{n}"
        if rid in seen:
            raise TraceError(source, n, "id", f"{rid!r} repeats line {seen[rid]}")
        seen[rid] = n
        tokens = line.tokens if line.tokens is not None else _count(line, counter)
        out.append(TraceRecord(
            id=rid, ts=line.ts - origin, org=line.org, endpoint=line.endpoint, tokens=tokens,
            texts=line.texts, query=line.query, priority=line.priority,
            deadline_ms=line.deadline_ms, options=line.options,
        ))
    out.sort(key=lambda r: r.ts)  # stable: ties stay in line order
    return out


def read_trace(path: str | Path, *, token_counter: TokenCounter | None = None) -> list[TraceRecord]:
    """Read the trace file at ``path`` (see the module docstring for the format)."""
    p = Path(path)
    with p.open("rb") as f:
        return decode_trace(f, source=p.name, token_counter=token_counter)


_encoder = msgspec.json.Encoder()


def write_trace(path: str | Path, records: Iterable[TraceRecord]) -> int:
    """Write ``records`` as JSON Lines to ``path``; returns how many were written.

    Tokens are always written, so reading the file back gives the same
    records even where they came from estimated ``texts``.
    """
    n = 0
    with Path(path).open("wb") as f:
        for r in records:
            f.write(_encoder.encode(r))
            f.write(b"\n")
            n += 1
    return n


def noisy_neighbour(
    burst: int = 10_000,
    *,
    noisy: str = "bulkcorp",
    victim: str = "quiet-1",
    victim_requests: int = 5,
    victim_start_s: float = 0.1,
    victim_interval_s: float = 0.5,
    burst_s: float = 0.05,
    quiet_orgs: Sequence[str] = (),
    tokens: int = 64,
    endpoint: str = "embed",
) -> list[TraceRecord]:
    """The seed's scenario: one org floods the queue, another sends a few requests.

    ``noisy`` sends ``burst`` requests spread evenly over the first
    ``burst_s`` seconds (a client firing as fast as it can); ``victim``
    sends ``victim_requests`` requests, one every ``victim_interval_s``
    from ``victim_start_s``, so they arrive while the burst is queued.
    Each of ``quiet_orgs`` behaves like the victim, offset by 10 ms per org
    so their requests do not tie. The default org names are those of
    ``examples/config.toml`` (both in tier ``standard``).
    """
    recs: list[TraceRecord] = []
    step = burst_s / burst if burst else 0.0
    for i in range(burst):
        recs.append(TraceRecord(id=f"{noisy}-{i}", ts=round(i * step, 6), org=noisy,
                                endpoint=endpoint, tokens=tokens))
    for k, org in enumerate([victim, *quiet_orgs]):
        for i in range(victim_requests):
            ts = victim_start_s + i * victim_interval_s + 0.01 * k
            recs.append(TraceRecord(id=f"{org}-{i}", ts=round(ts, 6), org=org,
                                    endpoint=endpoint, tokens=tokens))
    recs.sort(key=lambda r: r.ts)
    return recs


def backlogged(
    orgs: Sequence[str], requests: int = 2_000, *, tokens: int = 64, endpoint: str = "embed",
) -> list[TraceRecord]:
    """Every org sends ``requests`` requests at t=0, interleaved: all stay backlogged.

    With equal weights DRR must split the served cost equally; with weights
    it must split it in proportion, until the heaviest org drains.
    """
    return [
        TraceRecord(id=f"{org}-{i}", ts=0.0, org=org, endpoint=endpoint, tokens=tokens)
        for i in range(requests) for org in orgs
    ]


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``trace`` subcommands: generate the scenario traces, check a trace."""
    sub = parser.add_subparsers(dest="trace_command", metavar="SCENARIO", required=True)
    nn = sub.add_parser("noisy-neighbour", help="one org bursts, another sends a few requests",
                        description=noisy_neighbour.__doc__)
    nn.add_argument("--burst", type=int, default=10_000, help="requests in the burst")
    nn.add_argument("--tokens", type=int, default=64, help="tokens per request")
    nn.add_argument("--noisy-org", default="bulkcorp", help="the org that bursts")
    nn.add_argument("--victim-org", default="quiet-1", help="the org that sends a few requests")
    nn.add_argument("--victim-requests", type=int, default=5)
    nn.add_argument("--quiet-orgs", type=_names, default=[], metavar="ORG,ORG",
                    help="more orgs that behave like the victim (comma-separated)")
    nn.add_argument("--endpoint", default="embed")
    nn.add_argument("--out", required=True, help="trace file to write ('-' for stdout)")
    bl = sub.add_parser("backlogged", help="several orgs each send a burst at t=0",
                        description=backlogged.__doc__)
    bl.add_argument("--orgs", type=_names, required=True, metavar="ORG,ORG")
    bl.add_argument("--requests", type=int, default=2_000, help="requests per org")
    bl.add_argument("--tokens", type=int, default=64, help="tokens per request")
    bl.add_argument("--endpoint", default="embed")
    bl.add_argument("--out", required=True, help="trace file to write ('-' for stdout)")
    ck = sub.add_parser("check", help="validate a trace and summarise it")
    ck.add_argument("file")


def run(args: argparse.Namespace) -> int:
    """Run a ``trace`` subcommand; 0 on success, 2 on a bad trace."""
    if args.trace_command == "check":
        try:
            recs = read_trace(args.file)
        except TraceError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        per: dict[tuple[str, str], list[int]] = {}
        for r in recs:
            c = per.setdefault((r.org, r.endpoint), [0, 0])
            c[0] += 1
            c[1] += r.tokens
        span = recs[-1].ts if recs else 0.0
        print(f"{len(recs)} requests over {span:.3f} s")
        for (org, ep), (n, tok) in sorted(per.items(), key=lambda kv: -kv[1][0]):
            print(f"  {org:<24} {ep:<12} {n:>9} requests {tok:>12} tokens")
        return 0
    if args.trace_command == "noisy-neighbour":
        recs = noisy_neighbour(args.burst, noisy=args.noisy_org, victim=args.victim_org,
                               victim_requests=args.victim_requests, quiet_orgs=args.quiet_orgs,
                               tokens=args.tokens, endpoint=args.endpoint)
    else:
        recs = backlogged(args.orgs, args.requests, tokens=args.tokens, endpoint=args.endpoint)
    if args.out == "-":
        for r in recs:
            sys.stdout.write(_encoder.encode(r).decode() + "\n")
    else:
        n = write_trace(args.out, recs)
        print(f"wrote {n} requests to {args.out}", file=sys.stderr)
    return 0
