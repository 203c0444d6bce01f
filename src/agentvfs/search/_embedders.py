"""Calling embedders: single-text functions (sync or async) and batch functions, in batches
with bounded concurrency, with every vector checked; and a deterministic hashing embedder.

An embedder is the user's: ``fn(text) -> list[float]`` (may be async), or a function marked
``fn.batch = True`` (optional ``fn.max_batch_size``) taking ``list[str]`` and returning one
vector per text.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.to_thread

__all__ = ["DEFAULT_BATCH_SIZE", "HashingEmbedder", "embed_texts", "embedder_id"]

#: Texts per call of a batch embedder without ``max_batch_size`` (the reference's group).
DEFAULT_BATCH_SIZE = 256
#: Single-text calls in flight at once.
DEFAULT_CONCURRENCY = 8





def embedder_id(embedder: Any) -> str:
    """A stable name for ``embedder``: its ``model_id`` attribute, else its qualified name."""
    model = getattr(embedder, "model_id", None)
    if isinstance(model, str) and model:
        return model
    fn = getattr(embedder, "__func__", embedder)
    module = getattr(fn, "__module__", None) or type(embedder).__module__
    name = getattr(fn, "__qualname__", None) or type(embedder).__qualname__
    return f"{module}.{name}"


def _check(vector: Any, where: str, dimension: int | None) -> list[float]:
    try:
        values = [float(x) for x in vector]
    except (TypeError, ValueError):
        raise ValueError(
            f"{where}: the embedder returned {type(vector).__name__}, not a list of numbers"
        ) from None
    if not values:
        raise ValueError(f"{where}: the embedder returned an empty vector")
    if dimension is not None and len(values) != dimension:
        raise ValueError(
            f"{where}: the embedder returned {len(values)} dimensions, expected {dimension}"
        )
    if not all(math.isfinite(x) for x in values):
        raise ValueError(f"{where}: the embedder returned NaN or infinite values")
    return values


async def _call(fn: Callable[..., Any], arg: Any) -> Any:
    method = type(fn).__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else None
    if inspect.iscoroutinefunction(fn) or (method is not None and inspect.iscoroutinefunction(method)):
        return await fn(arg)
    # A plain function may run a model for seconds: never on the event loop.
    value = await anyio.to_thread.run_sync(fn, arg)
    return await value if inspect.isawaitable(value) else value


async def embed_texts(
    embedder: Callable[..., Any],
    texts: Sequence[str],
    *,
    dimension: int | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    names: Sequence[str] | None = None,
) -> tuple[list[list[float] | None], dict[int, str]]:
    """Embed ``texts``; return the vectors (None where one failed) and the failures.

    A batch embedder is called with groups of ``max_batch_size`` texts (default 256); a
    single-text one with up to ``concurrency`` texts at once. A failing call fails only its
    texts; the others are embedded. Vectors must all have the same dimension (``dimension``,
    or that of the first vector) and finite values.

    Parameters
    ----------
    names : sequence of str, optional
        How to name each text in failure messages (e.g. its document id).
    """
    out: list[list[float] | None] = [None] * len(texts)
    failures: dict[int, str] = {}
    label = list(names) if names is not None else [f"text {i}" for i in range(len(texts))]
    expected = [dimension]

    def accept(index: int, vector: Any) -> None:
        try:
            values = _check(vector, label[index], expected[0])
        except ValueError as exc:
            failures[index] = str(exc)
            return
        if expected[0] is None:
            expected[0] = len(values)
        out[index] = values

    if getattr(embedder, "batch", False):
        size = int(getattr(embedder, "max_batch_size", None) or DEFAULT_BATCH_SIZE)
        if size < 1:
            raise ValueError(f"max_batch_size must be positive, got {size}")
        for start in range(0, len(texts), size):
            group = list(texts[start : start + size])
            try:
                vectors = await _call(embedder, group)
                vectors = list(vectors)
                if len(vectors) != len(group):
                    raise ValueError(
                        f"the batch embedder returned {len(vectors)} vectors for {len(group)} texts"
                    )
            except Exception as exc:
                for offset in range(len(group)):
                    failures[start + offset] = f"{label[start + offset]}: {exc}"
                continue
            for offset, vector in enumerate(vectors):
                accept(start + offset, vector)
        return out, failures

    limiter = anyio.Semaphore(max(1, concurrency))

    async def one(index: int) -> None:
        async with limiter:
            try:
                vector = await _call(embedder, texts[index])
            except Exception as exc:
                failures[index] = f"{label[index]}: {exc}"
                return
        accept(index, vector)

    if texts:
        # The first call alone fixes the dimension the others must match.
        await one(0)
        async with anyio.create_task_group() as tg:
            for index in range(1, len(texts)):
                tg.start_soon(one, index)
    return out, failures


_WORD = re.compile(r"[a-z0-9]+")


class HashingEmbedder:
    """A deterministic embedder: signed feature hashing of word unigrams and bigrams into
    ``dimension`` buckets, log term frequency, L2-normalised.

    No model and no downloads; texts sharing words get similar vectors, which is enough for
    tests and as a weak baseline. It is a batch embedder (``batch = True``).

    Parameters
    ----------
    dimension : int
        Vector length (default 384).
    """

    batch = True
    max_batch_size = 512

    def __init__(self, dimension: int = 384) -> None:
        if dimension < 8:
            raise ValueError(f"dimension must be at least 8, got {dimension}")
        self.dimension = dimension
        self.model_id = f"agentvfs-hashing-{dimension}"

    def _one(self, text: str) -> list[float]:
        words = _WORD.findall(text.lower())
        counts: dict[str, int] = {}
        for i, word in enumerate(words):
            counts[word] = counts.get(word, 0) + 1
            if i:
                pair = f"{words[i - 1]} {word}"
                counts[pair] = counts.get(pair, 0) + 1
        vector = [0.0] * self.dimension
        for feature, count in counts.items():
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dimension
            sign = 1.0 if digest[4] & 1 else -1.0
            vector[bucket] += sign * (1.0 + math.log(count))
        norm = math.sqrt(sum(x * x for x in vector))
        if norm == 0.0:
            vector[0] = 1.0  # an empty text still gets a valid (unit) vector
            return vector
        return [x / norm for x in vector]

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._one(text) for text in texts]

    def __repr__(self) -> str:
        return f"HashingEmbedder(dimension={self.dimension})"
