"""The embedding model behind hybrid tool search: loading it from the package, embedding, the cache file."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from mcpvisor.frontend.door import semantic
from mcpvisor.frontend.door.semantic import (
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    Embedder,
    ModelUnavailable,
    VectorCache,
    default_model_dir,
    load_embedder,
    text_key,
)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


def model_copy(folder: Path, *, weights: dict[str, np.ndarray] | None = None, tokenizer: bytes | None = None) -> Path:
    """Lay out a model folder like the package's, with the given weights and tokenizer file."""
    source = default_model_dir()
    assert source is not None
    (folder / WEIGHTS_FILE).parent.mkdir(parents=True)
    (folder / TOKENIZER_FILE).parent.mkdir(parents=True)
    if weights is None:
        (folder / WEIGHTS_FILE).write_bytes((source / WEIGHTS_FILE).read_bytes())
    else:
        save_file(weights, str(folder / WEIGHTS_FILE))
    (folder / TOKENIZER_FILE).write_bytes(
        tokenizer if tokenizer is not None else (source / TOKENIZER_FILE).read_bytes()
    )
    return folder


# --- Loading ------------------------------------------------------------------------------------


def test_the_model_comes_from_the_installed_package(embedder: Embedder) -> None:
    folder = default_model_dir()

    assert folder is not None and (folder / WEIGHTS_FILE).is_file() and (folder / TOKENIZER_FILE).is_file()
    assert embedder.dimension == 256
    assert embedder.table.dtype == np.float16
    assert embedder.fingerprint.startswith("wordllama-l2_supercat-256-")


def test_a_copy_of_the_package_files_loads_the_same_model(tmp_path: Path, embedder: Embedder) -> None:
    copy = load_embedder(model_copy(tmp_path))

    assert copy.fingerprint == embedder.fingerprint
    assert np.array_equal(copy.embed(["hello world"]), embedder.embed(["hello world"]))


def test_an_empty_folder_is_reported_as_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match=r"model file .*l2_supercat_256\.safetensors not found"):
        load_embedder(tmp_path)


def test_weights_without_the_embedding_table_are_refused(tmp_path: Path) -> None:
    folder = model_copy(tmp_path, weights={"something.else": np.zeros((4, 4), dtype=np.float16)})

    with pytest.raises(ModelUnavailable, match=r"hold no 2-dimensional 'embedding\.weight' table"):
        load_embedder(folder)


def test_a_table_smaller_than_the_vocabulary_is_refused(tmp_path: Path) -> None:
    folder = model_copy(tmp_path, weights={"embedding.weight": np.zeros((10, 8), dtype=np.float16)})

    with pytest.raises(ModelUnavailable, match="has 32000 tokens, the weights only 10"):
        load_embedder(folder)


def test_a_malformed_tokenizer_is_refused(tmp_path: Path) -> None:
    folder = model_copy(tmp_path, tokenizer=b'{"version": "1.0", "model": ')

    with pytest.raises(ModelUnavailable, match="cannot read tokenizer"):
        load_embedder(folder)


# --- Embedding ----------------------------------------------------------------------------------


def test_texts_become_unit_vectors_and_an_empty_text_a_zero_vector(embedder: Embedder) -> None:
    vectors = embedder.embed(["Get the weather forecast for a city", "", "x"])

    assert vectors.shape == (3, 256) and vectors.dtype == np.float32
    assert np.linalg.norm(vectors[0]) == pytest.approx(1.0, abs=1e-5)
    assert not vectors[1].any()
    assert np.linalg.norm(vectors[2]) == pytest.approx(1.0, abs=1e-5)
    assert embedder.embed([]).shape == (0, 256)


def test_a_text_embeds_the_same_alone_and_in_a_batch(embedder: Embedder) -> None:
    texts = ["Convert an amount between currencies", "List the files of a directory", "Merge a pull request"]

    batch = embedder.embed(texts)

    for text, row in zip(texts, batch, strict=True):
        assert embedder.embed([text])[0] == pytest.approx(row, abs=1e-6)


def test_a_batch_larger_than_one_chunk_embeds_as_its_texts_do_alone(
    embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = [f"Tool number {number} reads invoices and writes receipts" for number in range(40)] + ["", "ok"]
    alone = np.stack([embedder.embed([text])[0] for text in texts])
    monkeypatch.setattr(semantic, "CHUNK_TOKENS", 25)

    chunked = embedder.embed(texts)

    assert chunked == pytest.approx(alone, abs=1e-6)
    assert not chunked[-2].any()


@pytest.mark.parametrize(
    ("query", "near", "far"),
    [
        ("will it rain tomorrow", "Get the weather forecast for a city", "Record staged changes in the repository"),
        ("how many yen is one dollar", "Convert an amount between two currencies", "Take a screenshot of the page"),
        ("remove a folder", "Delete a directory and everything below it", "Send a message to a channel"),
    ],
)
def test_texts_of_like_meaning_are_closer_than_unrelated_ones(
    embedder: Embedder, query: str, near: str, far: str
) -> None:
    query_vector, near_vector, far_vector = embedder.embed([query, near, far])

    assert query_vector @ near_vector > query_vector @ far_vector


def test_very_long_texts_are_cut_to_a_bounded_number_of_tokens(embedder: Embedder) -> None:
    head = "Get the weather forecast for a city. " * 200
    tail_a, tail_b = "Send money abroad. " * 200, "Play chess online. " * 200

    first, second = embedder.embed([head + tail_a, head + tail_b])

    assert np.array_equal(first, second)


# --- The cache file -----------------------------------------------------------------------------


def some_vectors(count: int, dimension: int = 8) -> dict[bytes, np.ndarray]:
    rng = np.random.default_rng(7)
    return {text_key("fp", f"tool {i}"): rng.standard_normal(dimension).astype(np.float32) for i in range(count)}


def test_text_keys_depend_on_model_and_text() -> None:
    key = text_key("model-a", "Get the weather")

    assert len(key) == 32
    assert key == text_key("model-a", "Get the weather")
    assert key != text_key("model-b", "Get the weather")
    assert key != text_key("model-a", "Get the weather!")


def test_the_cache_round_trips_and_is_readable_by_the_owner_only(tmp_path: Path) -> None:
    entries = some_vectors(5)
    cache = VectorCache(tmp_path / "sub" / "vectors.npz", "fp", 8)

    cache.save(entries)
    loaded = VectorCache(tmp_path / "sub" / "vectors.npz", "fp", 8).load()

    assert stat.S_IMODE(cache.path.stat().st_mode) == 0o600
    assert loaded.keys() == entries.keys()
    for key, vector in entries.items():
        assert np.array_equal(loaded[key], vector)
    assert [path.name for path in cache.path.parent.iterdir()] == ["vectors.npz"]


def test_saving_replaces_the_whole_file_and_restores_its_mode(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path / "vectors.npz", "fp", 8)
    cache.save(some_vectors(5))
    cache.path.chmod(0o644)

    cache.save(dict(list(some_vectors(5).items())[:2]))

    assert len(cache.load()) == 2
    assert stat.S_IMODE(cache.path.stat().st_mode) == 0o600


def test_an_empty_cache_round_trips(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path / "vectors.npz", "fp", 8)

    cache.save({})

    assert cache.load() == {}


def test_a_missing_cache_file_gives_nothing(tmp_path: Path) -> None:
    assert VectorCache(tmp_path / "absent.npz", "fp", 8).load() == {}


def test_a_cache_of_another_model_or_dimension_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "vectors.npz"
    VectorCache(path, "fp", 8).save(some_vectors(3))

    assert VectorCache(path, "another model", 8).load() == {}
    assert VectorCache(path, "fp", 16).load() == {}


@pytest.mark.parametrize("content", [b"", b"garbage", b"PK\x03\x04truncated zip"])
def test_an_unreadable_cache_file_gives_nothing_and_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    path = tmp_path / "vectors.npz"
    path.write_bytes(content)

    with caplog.at_level(logging.WARNING, logger="mcpvisor.frontend.door.semantic"):
        assert VectorCache(path, "fp", 8).load() == {}

    assert any("ignoring the tool vector cache" in record.getMessage() for record in caplog.records)
