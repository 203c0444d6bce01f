"""The Cranfield collection for the retrieval benchmarks: where it is, and its parser and
metrics from ``agentvfs.bench`` (the same ones ``agentvfs bench search`` uses)."""

from __future__ import annotations

import os
from pathlib import Path

from agentvfs.bench import _corpus
from agentvfs.bench._corpus import ndcg_recall

__all__ = ["CRANFIELD", "cranfield", "ndcg_recall"]

_ROOT = Path(__file__).resolve().parent.parent
CRANFIELD = Path(os.environ.get("CRANFIELD_DIR", _ROOT.parent / "shared" / "data" / "cranfield"))
if not CRANFIELD.exists():
    CRANFIELD = Path("/work/shared/data/cranfield")


def cranfield(*, with_title: bool) -> tuple[list[tuple[str, str]], list[str], dict[int, dict[str, int]]]:
    """Documents (id, text; title first when ``with_title``), queries in file order, qrels
    query number -> doc -> gain (5 - code)."""
    return _corpus.cranfield(CRANFIELD, with_title=with_title)
