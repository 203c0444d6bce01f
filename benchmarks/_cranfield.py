"""The Cranfield collection for the retrieval benchmarks: documents, queries, graded qrels, and
nDCG@k / recall@k."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CRANFIELD", "cranfield", "ndcg_recall"]

_ROOT = Path(__file__).resolve().parent.parent
CRANFIELD = Path(os.environ.get("CRANFIELD_DIR", _ROOT.parent / "shared" / "data" / "cranfield"))
if not CRANFIELD.exists():
    CRANFIELD = Path("/work/shared/data/cranfield")


def _records(text: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    field = ""
    for line in text.split("\n"):
        if line.startswith(".I "):
            out.append({"I": line[3:].strip()})
            field = ""
        elif len(line) == 2 and line.startswith("."):
            field = line[1]
            out[-1][field] = ""
        elif field and out:
            out[-1][field] += line + "\n"
    return out


def cranfield(*, with_title: bool) -> tuple[list[tuple[str, str]], list[str], dict[int, dict[str, int]]]:
    """Documents (id, text; title first when ``with_title``, the usual fields), queries in file
    order, qrels query number -> doc -> gain (5 - code)."""
    records = _records((CRANFIELD / "cran.all.1400").read_text())
    if with_title:
        docs = [(r["I"], r.get("T", "") + "\n" + r.get("W", "")) for r in records]
    else:
        docs = [(r["I"], r.get("W", "")) for r in records]
    queries = [r.get("W", "").strip() for r in _records((CRANFIELD / "cran.qry").read_text())]
    qrels: dict[int, dict[str, int]] = {}
    for line in (CRANFIELD / "cranqrel").read_text().split("\n"):
        parts = line.split()
        # cranqrel numbers the queries 1-225 in file order; code -1 (and 5) is not relevant.
        if len(parts) == 3 and 1 <= int(parts[2]) <= 4:
            qrels.setdefault(int(parts[0]), {})[parts[1]] = 5 - int(parts[2])
    return docs, queries, qrels


def ndcg_recall(ranked: Sequence[str], gains: dict[str, int], k: int = 10) -> tuple[float, float]:
    """nDCG@k and recall@k of one ranking against graded ``gains``."""
    dcg = sum(gains.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(gains.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    recall = len(set(ranked[:k]) & set(gains)) / len(gains)
    return (dcg / idcg if idcg else 0.0), recall
