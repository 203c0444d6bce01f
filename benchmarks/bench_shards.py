"""Vector shards of a published index: what building them costs, and vector search from a
workspace that attaches them, beside a workspace that embeds and holds every document itself.

Corpus: the machine's man pages (``bench_search.man_pages()``), the first ``--max-docs``, as
text files in a temporary directory. Embedder: ``HashingEmbedder(384)`` (deterministic, no
model; 384 is MiniLM's dimension), behind a cache filled once before the rounds, so the figures
separate the embedder's own time (measured once, apart: it is the model's, whatever the index)
from what the shards add (graph, vectors, storage).

* **build**: ``build_index`` in this process, without an embedder and with the cached one, in
  interleaved rounds (median): documents per second, and the shards' share.
* **ready**: a new Workspace (BM25, ``HnswVectorStore``, the embedder) with the index attached:
  ``init()`` and the first vector search; beside a Workspace without it, whose ``init()``
  embeds and indexes every document itself (one round each).
* **query**: ``ws.search(q, mode="vector", top_k=10)`` p50/p95 over the NAME-line descriptions
  of 200 pages, on both workspaces, interleaved query by query after 10 warm-up queries.
* **agreement**: recall@10 of each against the exact top 10 (numpy over every vector).

    python benchmarks/bench_shards.py [--max-docs 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from agentvfs import LocalFilesystem, Workspace  # noqa: E402
from agentvfs.search import HashingEmbedder, HnswVectorStore, build_index  # noqa: E402
from agentvfs.search._workspace import file_documents  # noqa: E402

DIM = 384


class CachedEmbedder:
    """``HashingEmbedder(384)`` with its vectors of known texts looked up (same id). They are
    kept in one array: tens of thousands of lists of floats would make every collection of
    the garbage collector slow down whatever runs in this process."""

    batch = True
    max_batch_size = 512

    def __init__(self, texts: Sequence[str], vectors: list[list[float]]) -> None:
        self.inner = HashingEmbedder(DIM)
        self.model_id = self.inner.model_id
        self.row = {text: i for i, text in enumerate(texts)}
        self.matrix = np.asarray(vectors, dtype=np.float64)

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        rows = [self.row.get(t) for t in texts]
        return [self.matrix[i].tolist() if i is not None else self.inner([t])[0] for i, t in zip(rows, texts, strict=True)]


def corpus(where: Path, limit: int) -> tuple[list[str], list[str]]:
    """Write the pages; their paths and 200 queries (their NAME lines' descriptions)."""
    import bench_search

    pages = bench_search.man_pages()[: limit or None]
    paths = []
    for name, text in pages:
        rel = name.removesuffix(".gz") + ".txt"
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_text(text)
        paths.append(rel)
    rng = random.Random(5)
    queries = []
    for _, text in rng.sample(pages, min(200, len(pages))):
        lines = [line.strip() for line in text.splitlines() if " - " in line]
        queries.append(lines[0].split(" - ", 1)[1] if lines else text[:60])
    return paths, queries


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def workspace(bucket: Path, index_dir: Path, embedder: Any, published: Path | None, cache: Path) -> Workspace:
    extra: dict[str, Any] = {}
    if published is not None:
        extra = {"search_index_url": str(published), "search_index_options": {"cache_dir": str(cache), "refresh_interval": 3600}}
    return Workspace(
        filesystem=LocalFilesystem(bucket), bm25=True, vector_store=HnswVectorStore(), embedder=embedder,
        auto_index_paths=["."], index_dir=str(index_dir), **extra,
    )  # fmt: skip


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="agentvfs-bench-shards-"))
    try:
        bucket = work / "bucket"
        paths, queries = corpus(bucket, args.max_docs)
        texts = [d.content for rel in paths for d in file_documents(rel, (bucket / rel).read_bytes())]
        started = time.perf_counter()
        vectors = HashingEmbedder(DIM)(texts)
        embed_s = time.perf_counter() - started
        embedder = CachedEmbedder(texts, vectors)
        del vectors
        print(f"{len(paths)} pages, {len(texts)} documents; HashingEmbedder({DIM}) alone: {len(texts) / embed_s:,.0f} docs/s")
        # -- build
        times: dict[str, list[float]] = {"bm25 only": [], "bm25 + vector shards": []}
        for r in range(args.rounds):
            order = list(times) if r % 2 == 0 else list(reversed(times))
            for mode in order:
                out = work / f"index-{r}-{'vectors' if 'vector' in mode else 'bm25'}"
                started = time.perf_counter()
                report = build_index(str(bucket), str(out), embedder=embedder if "vector" in mode else None)
                times[mode].append(time.perf_counter() - started)
                assert report.docs == len(texts), (report.docs, len(texts))
        print("\n| build (in-process) | median s | docs/s |\n|---|---:|---:|")
        for mode, values in times.items():
            median = statistics.median(values)
            print(f"| {mode} | {median:.2f} | {len(texts) / median:,.0f} |")
        extra = statistics.median(times["bm25 + vector shards"]) - statistics.median(times["bm25 only"])
        print(f"shards add {extra:.2f} s ({len(texts) / extra:,.0f} docs/s for vectors and graphs alone); "
              f"the embedder at its own {len(texts) / embed_s:,.0f} docs/s comes on top with a real model")  # fmt: skip
        published = work / "published"
        build_index(str(bucket), str(published), embedder=embedder)
        # -- ready
        q0 = queries[0]
        started = time.perf_counter()
        attached = workspace(bucket, work / "agent-attached", embedder, published, work / "segcache")
        await attached.init()
        await attached.search(q0, mode="vector", top_k=10)
        attach_s = time.perf_counter() - started
        started = time.perf_counter()
        alone = workspace(bucket, work / "agent-alone", embedder, None, work / "unused")
        await alone.init()
        await alone.search(q0, mode="vector", top_k=10)
        alone_s = time.perf_counter() - started
        print(f"\n| ready for a vector search | s |\n|---|---:|\n| attached shards | {attach_s:.2f} |\n"
              f"| own store (embeds and indexes all) | {alone_s:.2f} |")  # fmt: skip
        # -- query
        lat: dict[str, list[float]] = {"attached shards": [], "own store": []}
        found: dict[str, list[list[str]]] = {"attached shards": [], "own store": []}
        for query in queries[:10]:
            await attached.search(query, mode="vector", top_k=10)
            await alone.search(query, mode="vector", top_k=10)
        for i, query in enumerate(queries):
            pair = [("attached shards", attached), ("own store", alone)]
            for name, ws in pair if i % 2 == 0 else reversed(pair):
                started = time.perf_counter()
                hits = await ws.search(query, mode="vector", top_k=10)
                lat[name].append((time.perf_counter() - started) * 1000)
                found[name].append([h.id.lstrip("/") for h in hits])
        matrix = embedder.matrix.astype(np.float32)
        ids = [d.id for rel in paths for d in file_documents(rel, (bucket / rel).read_bytes())]
        truth = []
        for query in queries:
            qv = np.asarray(embedder([query])[0], dtype=np.float32)
            scores = matrix @ (qv / (np.linalg.norm(qv) or 1.0))
            truth.append({ids[j] for j in np.argsort(-scores, kind="stable")[:10]})
        print("\n| vector query, top 10 | p50 ms | p95 ms | recall@10 vs exact |\n|---|---:|---:|---:|")
        for name in lat:
            recall = statistics.mean(len(set(got) & want) / 10 for got, want in zip(found[name], truth, strict=True))
            print(f"| {name} | {p(lat[name], 0.5):.2f} | {p(lat[name], 0.95):.2f} | {recall:.3f} |")
        await attached.destroy()
        await alone.destroy()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--max-docs", type=int, default=20000, help="man pages (0: all)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    anyio.run(run, args)


if __name__ == "__main__":
    main()
