"""Corpora of the ``search`` suite and how rankings are judged.

Two corpora, each with its own judgement:

- **Cranfield** (when ``--cranfield DIR`` or ``CRANFIELD_DIR`` names the collection): 1,400
  abstracts (title + text), 225 queries, graded relevance (gain 5 - code). Judged by nDCG@10
  and recall@10, so scores compare with published BM25 figures (on the whole collection).
- **Python standard library** (always present): every ``.py`` file of the running
  interpreter's stdlib, with *known-item* queries: one distinctive line of a sampled file
  (occurring in no other file of the corpus) whose file is the one right answer. Judged by
  recall@10 (share of queries whose file is in the top 10) and MRR@10. A docs limit samples
  files of up to 8 kB only, so a quick run stays quick.

Sampling (``docs`` / ``queries`` limits) is deterministic: a fixed seed, sorted inputs.
"""

from __future__ import annotations

import math
import random
import re
import sysconfig
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KNOWN_ITEM_QUERIES", "SAMPLE_MAX_BYTES", "SEED", "Corpus", "cranfield", "load", "ndcg_recall", "python_stdlib",
           "reciprocal_rank"]  # fmt: skip

SEED = 20240611
#: Known-item queries when no limit is given (a generated query set has no natural size).
KNOWN_ITEM_QUERIES = 200
#: A sample of the standard library (a docs limit) is drawn from files up to this size.
SAMPLE_MAX_BYTES = 8000
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Corpus:
    """Documents, queries and what counts as a right answer for each query.

    ``judgements[i]`` maps doc id -> gain for ``queries[i]`` (a single id with gain 1 for a
    known-item query).
    """

    name: str
    docs: list[tuple[str, str]]
    queries: list[str]
    judgements: list[dict[str, int]]
    #: True: graded judgements (nDCG@10, recall@10); False: known-item (recall@10, MRR@10).
    graded: bool
    #: One sentence for the measurements' notes: which corpus, sampled how, judged how.
    description: str

    @property
    def chars(self) -> int:
        return sum(len(t) for _, t in self.docs)


# ----------------------------------------------------------------------------- Cranfield


def _records(text: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    field = ""
    for line in text.split("\n"):
        if line.startswith(".I "):
            out.append({"I": line[3:].strip()})
            field = ""
        elif len(line) == 2 and line.startswith(".") and out:
            field = line[1]
            out[-1][field] = ""
        elif field and out:
            out[-1][field] += line + "\n"
    return out


def cranfield(
    path: Path, *, with_title: bool = True
) -> tuple[list[tuple[str, str]], list[str], dict[int, dict[str, int]]]:
    """Documents (id, title + text, or the text alone without ``with_title``), queries in file
    order, and qrels: query number (1-225, in file order) -> doc id -> gain (5 - code; codes
    -1 and 5 are not relevant)."""
    records = _records((path / "cran.all.1400").read_text())
    if with_title:
        docs = [(r["I"], r.get("T", "") + "\n" + r.get("W", "")) for r in records]
    else:
        docs = [(r["I"], r.get("W", "")) for r in records]
    queries = [r.get("W", "").strip() for r in _records((path / "cran.qry").read_text())]
    qrels: dict[int, dict[str, int]] = {}
    for line in (path / "cranqrel").read_text().split("\n"):
        parts = line.split()
        if len(parts) == 3 and 1 <= int(parts[2]) <= 4:
            qrels.setdefault(int(parts[0]), {})[parts[1]] = 5 - int(parts[2])
    return docs, queries, qrels


def _cranfield_corpus(path: Path, max_docs: int, max_queries: int) -> Corpus:
    docs, queries, qrels = cranfield(path)
    total_docs = len(docs)
    if 0 < max_docs < len(docs):
        docs = sorted(random.Random(SEED).sample(docs, max_docs), key=lambda d: int(d[0]))
    kept = {d for d, _ in docs}
    pairs = []
    for number, query in enumerate(queries, start=1):
        gains = {d: g for d, g in qrels.get(number, {}).items() if d in kept}
        if gains and query:
            pairs.append((query, gains))
    judged = len(pairs)
    if 0 < max_queries < len(pairs):
        pairs = [pairs[i] for i in sorted(random.Random(SEED).sample(range(len(pairs)), max_queries))]
    sampled = "" if len(docs) == total_docs else (
        f" (a sample of {len(docs)} of {total_docs} documents: scores do not compare with published ones)")
    description = (f"Cranfield: {len(docs)} abstracts (title + text){sampled}, {len(pairs)} of {judged} judged "
                   "queries; graded relevance (gain 5 - code), nDCG@10 and recall@10")  # fmt: skip
    return Corpus("cranfield", docs, [q for q, _ in pairs], [g for _, g in pairs], True, description)


# ----------------------------------------------------------------------------- stdlib


def _stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py"))
             if "site-packages" not in p.parts and "dist-packages" not in p.parts and p.is_file()]  # fmt: skip
    return root, files


def _candidate(line: str) -> bool:
    """A line an agent might remember of a file: a few words, not boilerplate."""
    if not 20 <= len(line) <= 160 or line.startswith(("import ", "from ", "#!", "@", "return ", "raise ")):
        return False
    return len(_WORD.findall(line)) >= 4


def python_stdlib(max_docs: int = 0, max_queries: int = 0) -> Corpus:
    """The stdlib's ``.py`` files (ids are paths below the stdlib) and known-item queries."""
    root, files = _stdlib_files()
    # Empty __init__.py files and stubs cannot be found: at least 200 bytes.
    files = [p for p in files if p.stat().st_size >= 200]
    total = len(files)
    rng = random.Random(SEED)
    within = ""
    if 0 < max_docs < len(files):
        # A quick run samples small files only: the whole library is ~30 MB, a fifth of it
        # in files over 64 KB, and a sample drawn from those takes many times longer to index.
        small = [p for p in files if p.stat().st_size <= SAMPLE_MAX_BYTES]
        within = f" of those up to {SAMPLE_MAX_BYTES // 1000} kB"
        files = sorted(rng.sample(small, min(max_docs, len(small))))
    docs: list[tuple[str, str]] = []
    for path in files:
        try:
            docs.append((path.relative_to(root).as_posix(), path.read_text("utf-8", "replace")))
        except OSError:
            continue
    # Lines that occur in exactly one file of the corpus identify it.
    seen: Counter[str] = Counter()
    lines_of: dict[str, list[str]] = {}
    for doc_id, text in docs:
        lines = sorted({s for s in (x.strip() for x in text.split("\n")) if _candidate(s)})
        lines_of[doc_id] = lines
        seen.update(lines)
    wanted = max_queries or KNOWN_ITEM_QUERIES
    order = list(range(len(docs)))
    rng.shuffle(order)
    queries: list[str] = []
    judgements: list[dict[str, int]] = []
    for i in order:
        if len(queries) >= wanted:
            break
        doc_id = docs[i][0]
        unique = [x for x in lines_of[doc_id] if seen[x] == 1]
        if unique:
            queries.append(unique[rng.randrange(len(unique))])
            judgements.append({doc_id: 1})
    sampled = f"{len(docs)}{within} (a sample) of {total}" if len(docs) < total else f"all {total}"
    description = (f"Python {sysconfig.get_python_version()} standard library: {sampled} .py files; "
                   f"{len(queries)} known-item queries (a line found in one file only, which is the "
                   "right answer); recall@10 and MRR@10")  # fmt: skip
    return Corpus("python-stdlib", docs, queries, judgements, False, description)


def load(cranfield_dir: Path | None, max_docs: int = 0, max_queries: int = 0) -> Corpus:
    """Cranfield when its directory is given, else the Python standard library."""
    if cranfield_dir is not None:
        return _cranfield_corpus(Path(cranfield_dir), max_docs, max_queries)
    return python_stdlib(max_docs, max_queries)


# ----------------------------------------------------------------------------- judging


def ndcg_recall(ranked: Sequence[str], gains: dict[str, int], k: int = 10) -> tuple[float, float]:
    """nDCG@k and recall@k of one ranking against graded ``gains`` (doc id -> gain)."""
    dcg = sum(gains.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(gains.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    recall = len(set(ranked[:k]) & set(gains)) / len(gains) if gains else 0.0
    return (dcg / idcg if idcg else 0.0), recall


def reciprocal_rank(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    """1 / rank of the first relevant document in the top ``k``, 0 when none is."""
    for i, d in enumerate(ranked[:k]):
        if d in relevant:
            return 1.0 / (i + 1)
    return 0.0
