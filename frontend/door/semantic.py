"""A static text-embedding model for tool search, loaded from files shipped inside a package.

The model is WordLlama's 256-dimension `l2_supercat` table: one vector per token of the Llama 2
vocabulary, trained so that the mean of a text's token vectors places texts of similar meaning
close together. The weights (16 MB, float16) and the tokenizer come inside the `wordllama` wheel;
they are read straight from the installed package's folder, without importing `wordllama` (whose
loader downloads files it does not find and configures the root logger on import), so nothing here
touches the network.

`VectorCache` keeps computed vectors in a file, so a restart does not embed every tool again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from tokenizers import Tokenizer

__all__ = [
    "CACHE_FILE_NAME",
    "Embedder",
    "ModelUnavailable",
    "VectorCache",
    "default_model_dir",
    "load_embedder",
    "text_key",
]

log = logging.getLogger(__name__)

WEIGHTS_FILE = Path("weights") / "l2_supercat_256.safetensors"
TOKENIZER_FILE = Path("tokenizers") / "l2_supercat_tokenizer_config.json"
TENSOR_NAME = "embedding.weight"
CACHE_FILE_NAME = "tool-vectors.npz"
# Part of every cache key: a change to how tool text is built or embedded must not reuse vectors
# computed the old way.
RECIPE_VERSION = "1"
# Token vectors of a text beyond this many are ignored: a tool description the length of a manual
# says what the tool does in its first paragraphs, and the cost of embedding stays bounded.
MAX_TOKENS = 512
# Token vectors gathered at once while embedding many texts (float16: 512 bytes each).
CHUNK_TOKENS = 16_384


class ModelUnavailable(Exception):
    """The embedding model's files are missing or unreadable; the reason is the message."""


def default_model_dir() -> Path | None:
    """Return the folder of the installed `wordllama` package, or None when it is not installed.

    `find_spec` locates the package without running its `__init__`.
    """
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass(frozen=True, slots=True)
class Embedder:
    """A loaded model: turns texts into unit vectors whose dot product measures likeness of meaning."""

    tokenizer: Tokenizer
    table: np.ndarray  # (vocabulary, dimension) float16
    fingerprint: str

    @property
    def dimension(self) -> int:
        return int(self.table.shape[1])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return one float32 row per text: the normalized mean of its token vectors (zeros for none)."""
        import numpy as np

        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        start = 0
        while start < len(texts):
            ids: list[int] = []
            counts: list[int] = []
            # Texts are summed a chunk at a time, so that an upstream of thousands of long tools
            # costs a few MB of token vectors at once rather than one per token of all of them.
            while start + len(counts) < len(texts) and len(ids) < CHUNK_TOKENS:
                # encode() one at a time: encode_batch starts a thread pool, and a process that
                # forks after using it has the tokenizers library print warnings and disable it.
                token_ids = self.tokenizer.encode(texts[start + len(counts)], add_special_tokens=False).ids
                ids.extend(token_ids[:MAX_TOKENS])
                counts.append(min(len(token_ids), MAX_TOKENS))
            chunk = np.asarray(counts, dtype=np.int64)
            present = chunk > 0
            if ids:
                offsets = np.concatenate(([0], np.cumsum(chunk)[:-1]))[present]
                sums = np.add.reduceat(self.table[np.asarray(ids, dtype=np.int64)], offsets, axis=0, dtype=np.float32)
                vectors[start : start + len(counts)][present] = sums
            start += len(counts)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors


def load_embedder(model_dir: Path | None = None) -> Embedder:
    """Load the model from `model_dir` (default: the installed `wordllama` package's folder).

    Raises ModelUnavailable with a reason fit for a log line when a file or library is missing or
    a file cannot be read.
    """
    try:
        import numpy as np
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError as error:
        raise ModelUnavailable(f"a library the model needs is not installed ({error.name})") from error

    folder = model_dir if model_dir is not None else default_model_dir()
    if folder is None:
        raise ModelUnavailable("the wordllama package, which holds the model's files, is not installed")
    weights_path = folder / WEIGHTS_FILE
    tokenizer_path = folder / TOKENIZER_FILE
    for path in (weights_path, tokenizer_path):
        if not path.is_file():
            raise ModelUnavailable(f"model file {path} not found")
    try:
        table = load_file(str(weights_path)).get(TENSOR_NAME)
    except (OSError, SafetensorError) as error:
        raise ModelUnavailable(f"cannot read model weights {weights_path}: {error}") from error
    if table is None or table.ndim != 2:
        raise ModelUnavailable(f"model weights {weights_path} hold no 2-dimensional {TENSOR_NAME!r} table")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    # The tokenizers library reports a malformed file as a bare Exception from its Rust core.
    except Exception as error:
        raise ModelUnavailable(f"cannot read tokenizer {tokenizer_path}: {error}") from error
    if tokenizer.get_vocab_size() > table.shape[0]:
        raise ModelUnavailable(
            f"tokenizer {tokenizer_path} has {tokenizer.get_vocab_size()} tokens, the weights only {table.shape[0]}"
        )
    size = weights_path.stat().st_size
    fingerprint = f"wordllama-l2_supercat-{table.shape[1]}-{size}-r{RECIPE_VERSION}"
    return Embedder(tokenizer, np.ascontiguousarray(table, dtype=np.float16), fingerprint)


def text_key(fingerprint: str, text: str) -> bytes:
    """The cache key of one text's vector under one model: 32 bytes."""
    return hashlib.sha256(f"{fingerprint}\0{text}".encode()).digest()


class VectorCache:
    """Tool vectors kept in a file (mode 0600), keyed by `text_key`, so restarts skip re-embedding."""

    def __init__(self, path: Path, fingerprint: str, dimension: int) -> None:
        self.path = path
        self._fingerprint = fingerprint
        self._dimension = dimension

    def load(self) -> dict[bytes, np.ndarray]:
        """Return the stored vectors; an absent, unreadable or other model's file gives none."""
        import numpy as np

        try:
            # Opened here rather than by np.load, which leaves the file open when it is no archive.
            with self.path.open("rb") as file, np.load(file, allow_pickle=False) as stored:
                fingerprint = str(stored["fingerprint"])
                keys = stored["keys"]
                vectors = stored["vectors"]
        except FileNotFoundError:
            return {}
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as error:
            log.warning("ignoring the tool vector cache %s: %s", self.path, error)
            return {}
        if fingerprint != self._fingerprint:
            log.info("the tool vector cache %s was made by another model; it will be rebuilt", self.path)
            return {}
        if keys.ndim != 2 or keys.shape[1] != 32 or vectors.shape != (len(keys), self._dimension):
            log.warning("ignoring the tool vector cache %s: unexpected shapes", self.path)
            return {}
        vectors = vectors.astype(np.float32, copy=False)
        return {bytes(key): vectors[i] for i, key in enumerate(keys)}

    def save(self, entries: Mapping[bytes, np.ndarray] | Iterable[tuple[bytes, np.ndarray]]) -> None:
        """Replace the file with `entries`, atomically and readable by the owner only."""
        import numpy as np

        items = list(entries.items() if isinstance(entries, Mapping) else entries)
        keys = np.frombuffer(b"".join(key for key, _ in items), dtype=np.uint8).reshape(len(items), 32)
        vectors = np.zeros((len(items), self._dimension), dtype=np.float32)
        for i, (_, vector) in enumerate(items):
            vectors[i] = vector
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as file:
                np.savez(file, fingerprint=np.array(self._fingerprint), keys=keys, vectors=vectors)
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
