"""The numbers of the vector store: unit vectors for cosine, exact scores, and scores from
hnswlib's distances, so that an exact and an approximate search rank alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Floats", "Labels", "Mask", "prepare", "rowdot", "score", "scores_from_distances"]

Mask = npt.NDArray[np.bool_]
Labels = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float32]


def prepare(metric: str, matrix: Floats) -> Floats:
    """``matrix`` as the index keeps it: rows of unit length for cosine, else as they are."""
    if metric != "cosine":
        return np.ascontiguousarray(matrix)
    norms = np.linalg.norm(matrix.astype(np.float64), axis=1, keepdims=True)
    # hnswlib leaves a zero vector at zero (cosine 0 with everything); do the same.
    unit = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    return np.ascontiguousarray(unit, dtype=np.float32)


def score(metric: str, vectors: Floats, q: Floats) -> npt.NDArray[np.floating[Any]]:
    """The exact score of each row of ``vectors`` against ``q`` (higher is closer)."""
    dots = rowdot(vectors, q)
    if metric == "euclidean":
        squared = rowdot(vectors, vectors) - 2.0 * dots + float(rowdot(q, q))
        distance: npt.NDArray[np.floating[Any]] = np.sqrt(np.maximum(squared, 0.0))
        return 1.0 / (1.0 + distance)
    return np.clip(dots, -1.0, 1.0) if metric == "cosine" else dots


def rowdot(a: Floats, b: Floats) -> npt.NDArray[np.floating[Any]]:
    """Dot products along the last axis, one single-threaded dot per row. A BLAS matrix-vector
    product would be multi-threaded and, on a busy machine, wait milliseconds for its helper
    threads. ``np.vecdot`` is NumPy 2; ``einsum`` does the same on NumPy 1."""
    if _VECDOT is not None:
        result: npt.NDArray[np.floating[Any]] = _VECDOT(a, b)
    else:
        result = np.einsum("...i,...i->...", a, b)
    return result


_VECDOT: Callable[..., Any] | None = getattr(np, "vecdot", None)


def scores_from_distances(
    metric: str, distances: npt.NDArray[np.float32]
) -> npt.NDArray[np.float64]:
    """The scores of hnswlib's ``distances``, as :func:`score` gives them."""
    d = distances.astype(np.float64)
    if metric == "euclidean":  # hnswlib's l2 is the squared distance
        return 1.0 / (1.0 + np.sqrt(np.maximum(d, 0.0)))
    scores = 1.0 - d  # cosine and ip distances are 1 - dot
    return np.clip(scores, -1.0, 1.0) if metric == "cosine" else scores
