"""HnswVectorStore at 100,000 real-text embeddings: build time, recall@10 against exact search,
query latency, filtered queries, and writing and reopening the store on disk.

Texts: chunks of the man pages and Python sources on this machine, half each (English man pages
under ``/usr/share/man``; ``.py`` files under ``/usr/lib/python3*`` and the pyenv Pythons,
site-packages included), files in a fixed shuffled order, 40 lines or 2,000 characters per chunk,
exact duplicates dropped. 1,000 chunks spread over the corpus are held out; their first 40 words
are the queries. The indexed items carry the metadata the search engine stores (``id``, ``text``,
``sourceFile``) plus ``kind`` (man/py) and ``bucket`` (item number mod 100) for the filters.

Embeddings are made offline, deterministically, without model weights:

* ``hashing``: signed feature hashing of word unigrams and bigrams into 384 dimensions, log term
  frequency, L2-normalised. Its spectrum is flat (every direction carries about as much as any
  other), which makes it close to the worst case for a graph index.
* ``lsa``: the same features hashed into 2,048 buckets with tf-idf, projected on the top 384
  eigenvectors of the corpus' Gram matrix (latent semantic analysis). Its spectrum decays like a
  learned embedding's, so it is closer to what a real embedding model gives.

Recall@10 counts a returned item as a hit when its exact cosine is at least the 10th best exact
cosine among the allowed items (ties are not misses). Latency is the wall time of
``await store.query(...)``, one query at a time after 20 warm-up queries, worker-thread hop and
DuckDB metadata lookup included; "hnswlib alone" is ``knn_query`` on the same graph;
"uncached filter" forgets the filter's cached answer before each query (200 queries).

Usage: ``python benchmarks/bench_vectors.py [--n 100000] [--queries 1000] [--embedders hashing,lsa]
[--ef 32,64,128,256,512]``
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import os
import platform
import re
import resource
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from agentvfs.search._vectors import HnswVectorStore

CHUNK_LINES = 40
CHUNK_CHARS = 2000
QUERY_WORDS = 40
TOKEN = re.compile(r"[a-z0-9_]+")
ROFF_ESCAPE = re.compile(r"\\(f[BIRPC0-9]|f\[[^]]*\]|\(..|\*\(..|\*.|s[+-]?\d|[&|^,/0-9]|.)")


# -- corpus --------------------------------------------------------------------------------


def man_text(path: Path) -> str:
    """A roff man page as plain text: macro names dropped (their arguments kept), escapes removed."""
    raw = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    lines: list[str] = []
    for line in raw.splitlines():
        if line.startswith((".\\\"", "'\\\"")):
            continue
        if line.startswith((".", "'")):
            parts = line.split(None, 1)
            line = parts[1] if len(parts) > 1 else ""
        line = ROFF_ESCAPE.sub(lambda m: "-" if m.group(1) == "-" else " ", line)
        lines.append(line)
    return "\n".join(lines)


def shuffled(paths: list[Path]) -> list[Path]:
    """A fixed order that mixes directories (sections, Python versions, packages)."""
    return sorted(paths, key=lambda p: hashlib.blake2b(str(p).encode(), digest_size=8).digest())


def sources() -> Iterator[tuple[str, str, Callable[[], str]]]:
    """(path, kind, read) of the files: man pages, then Python sources, each in a fixed order."""
    for path in shuffled(list(Path("/usr/share/man").glob("man*/*.gz"))):
        yield str(path), "man", functools.partial(man_text, path)
    roots = sorted(Path("/usr/lib").glob("python3*")) + sorted(Path("/root/.pyenv/versions").glob("*/lib/python3*"))
    files = shuffled([path for root in roots for path in root.rglob("*.py")])
    for path in files:
        yield str(path), "py", functools.partial(path.read_text, "utf-8", "replace")


def chunks(total: int) -> tuple[list[str], list[str], list[str]]:
    """``total`` distinct chunks with at least 20 words: texts, source paths, kinds."""
    texts: list[str] = []
    paths: list[str] = []
    kinds: list[str] = []
    seen: set[bytes] = set()
    n_man = 0
    man_cap = total // 2  # at most half man pages, the rest Python
    for path, kind, read in sources():
        if kind == "man" and n_man >= man_cap:
            continue
        try:
            lines = read().splitlines()
        except (OSError, EOFError, zlib.error):
            continue
        start = 0
        while start < len(lines):
            piece: list[str] = []
            size = 0
            while start < len(lines) and len(piece) < CHUNK_LINES and size + len(lines[start]) <= CHUNK_CHARS:
                piece.append(lines[start])
                size += len(lines[start]) + 1
                start += 1
            if not piece:  # one over-long line
                piece, start = [lines[start][:CHUNK_CHARS]], start + 1
            chunk = "\n".join(piece).strip()
            digest = hashlib.blake2b(chunk.encode(), digest_size=16).digest()
            if len(TOKEN.findall(chunk.lower())) >= 20 and digest not in seen:
                seen.add(digest)
                texts.append(chunk)
                paths.append(path)
                kinds.append(kind)
                n_man += kind == "man"
                if kind == "man" and n_man >= man_cap:
                    break
                if len(texts) == total:
                    return texts, paths, kinds
    raise SystemExit(f"only {len(texts)} chunks found, {total} needed")


# -- embedder ------------------------------------------------------------------------------


class HashingEmbedder:
    """Signed feature hashing of word unigrams and bigrams, log-tf, L2-normalised."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._unigram: dict[str, int] = {}

    def _hash(self, token: str) -> int:
        h = self._unigram.get(token)
        if h is None:
            h = self._unigram[token] = zlib.crc32(token.encode())
        return h

    def __call__(self, text: str) -> np.ndarray:
        words = np.array([self._hash(t) for t in TOKEN.findall(text.lower())], np.uint64)
        vector = np.zeros(self.dim, np.float64)
        if len(words) == 0:
            return vector.astype(np.float32)
        bigrams = (words[:-1] * np.uint64(0x9E3779B1) + words[1:] + np.uint64(0x7F4A7C15)) & np.uint64(0xFFFFFFFF)
        features = np.concatenate([words, bigrams | np.uint64(1 << 32)])
        # mix the bits (splitmix64 finaliser), then bucket and sign from different bits
        features = (features ^ (features >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        features = (features ^ (features >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        features ^= features >> np.uint64(31)
        unique, counts = np.unique(features, return_counts=True)
        buckets = (unique % np.uint64(self.dim)).astype(np.int64)
        signs = np.where((unique >> np.uint64(63)) == 1, -1.0, 1.0)
        np.add.at(vector, buckets, signs * (1.0 + np.log(counts)))
        norm = np.linalg.norm(vector)
        return (vector / norm if norm else vector).astype(np.float32)


class LsaEmbedder:
    """Latent semantic analysis fitted on the corpus itself: word unigrams and bigrams hashed
    into ``width`` buckets, log-tf x idf, rows L2-normalised, projected on the top ``dim``
    eigenvectors of the Gram matrix, L2-normalised. Its spectrum decays like a learned
    embedding's (a few directions carry most of the variance), unlike the flat spectrum of
    hashed features."""

    def __init__(self, dim: int, width: int = 2048) -> None:
        self.dim = dim
        self.width = width
        self._unigram: dict[str, int] = {}
        self.idf = np.ones(width, np.float32)
        self.basis = np.zeros((width, dim), np.float32)

    def _features(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        words = np.array(
            [self._unigram.setdefault(t, zlib.crc32(t.encode())) for t in TOKEN.findall(text.lower())], np.uint64
        )
        if len(words) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        bigrams = (words[:-1] * np.uint64(0x9E3779B1) + words[1:] + np.uint64(0x7F4A7C15)) & np.uint64(0xFFFFFFFF)
        features = np.concatenate([words, bigrams | np.uint64(1 << 32)])
        features = (features ^ (features >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        features ^= features >> np.uint64(31)
        buckets, counts = np.unique((features % np.uint64(self.width)).astype(np.int64), return_counts=True)
        return buckets, (1.0 + np.log(counts)).astype(np.float32)

    def _rows(self, features: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        rows = np.zeros((len(features), self.width), np.float32)
        for i, (buckets, weights) in enumerate(features):
            rows[i, buckets] = weights * self.idf[buckets]
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return np.asarray(np.divide(rows, norms, out=rows, where=norms > 0))

    def fit_transform(self, texts: list[str]) -> np.ndarray:
        features = [self._features(t) for t in texts]
        df = np.zeros(self.width, np.float64)
        for buckets, _ in features:
            df[buckets] += 1
        self.idf = np.log((1 + len(texts)) / (1 + df)).astype(np.float32) + 1.0
        gram = np.zeros((self.width, self.width), np.float64)
        for start in range(0, len(features), 5000):
            block = self._rows(features[start : start + 5000])
            gram += block.T @ block
        _, vectors = np.linalg.eigh(gram)
        self.basis = np.ascontiguousarray(vectors[:, ::-1][:, : self.dim], np.float32)
        return np.asarray(np.concatenate([self._project(features[i : i + 5000]) for i in range(0, len(features), 5000)]))

    def _project(self, features: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        out = self._rows(features) @ self.basis
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.asarray(np.divide(out, norms, out=out, where=norms > 0))

    def __call__(self, text: str) -> np.ndarray:
        return np.asarray(self._project([self._features(text)])[0])


# -- measurement ---------------------------------------------------------------------------


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def recall_at_k(found: list[list[int]], exact_scores: np.ndarray, x: np.ndarray, q: np.ndarray, k: int, allowed: np.ndarray | None) -> float:
    hits = 0
    for row, ids in enumerate(found):
        scores = exact_scores[row] if allowed is None else np.where(allowed, exact_scores[row], -np.inf)
        kth = np.partition(scores, -k)[-k]
        got = x[ids] @ q[row] if ids else np.zeros(0)
        hits += int(np.count_nonzero(got >= kth - 1e-5))
    return hits / (k * len(found))


async def run_queries(
    store: HnswVectorStore, q: np.ndarray, k: int, flt: dict[str, Any] | None, *, cached: bool = True
) -> tuple[list[list[int]], list[float]]:
    """Run every query once (after 20 warm-ups); ``cached=False`` forgets the filter masks first."""
    found: list[list[int]] = []
    times: list[float] = []
    masks = store._store._indexes["chunks"].masks
    for vector in q[:20]:
        await store.query("chunks", vector.tolist(), k, flt)
    for vector in q:
        listed = vector.tolist()
        if not cached:
            masks.clear()
        started = time.perf_counter()
        hits = await store.query("chunks", listed, k, flt)
        times.append(time.perf_counter() - started)
        found.append([int(h["id"]) for h in hits])
    return found, times


def hnswlib_times(store: HnswVectorStore, q: np.ndarray, k: int, ef: int) -> list[float]:
    graph = store._store._indexes["chunks"].graph
    graph.set_ef(ef)
    times: list[float] = []
    for vector in q:
        row = vector.reshape(1, -1)
        started = time.perf_counter()
        graph.knn_query(row, k=k)
        times.append(time.perf_counter() - started)
    graph.set_ef(store._store.ef_search)
    return times


def ms(samples: list[float], p: float = 50) -> str:
    return f"{percentile(samples, p) * 1000:.2f}"


def machine() -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_kb / 2**20:.0f} GiB RAM, {platform.platform()}, "
        f"CPython {platform.python_version()}, hnswlib {version('hnswlib')}, numpy {np.__version__}, "
        f"duckdb {version('duckdb')}"
    )


async def build(
    path: Path | None, x: np.ndarray, metadata: list[dict[str, Any]], args: argparse.Namespace, **options: Any
) -> tuple[HnswVectorStore, float]:
    store = HnswVectorStore(path, m=args.m, ef_construction=args.ef_construction, **options)
    await store.create_index("chunks", x.shape[1])
    ids = [str(j) for j in range(len(x))]
    started = time.perf_counter()
    for start in range(0, len(x), args.batch):
        end = start + args.batch
        # The store takes any sequence of rows; an array slice is one (no copy to lists).
        rows: Any = x[start:end]
        await store.upsert("chunks", rows, metadata[start:end], ids[start:end])
    return store, time.perf_counter() - started


async def main(args: argparse.Namespace) -> None:
    load_before = os.getloadavg()
    started = time.perf_counter()
    texts, paths, kinds = chunks(args.n + args.queries)
    collect_s = time.perf_counter() - started
    query_rows = np.arange(0, len(texts), max(1, len(texts) // args.queries))[: args.queries]
    is_query = np.zeros(len(texts), np.bool_)
    is_query[query_rows] = True
    doc_rows = np.flatnonzero(~is_query)[: args.n]
    n = len(doc_rows)
    n_man = sum(1 for i in doc_rows if kinds[i] == "man")
    query_texts = [" ".join(texts[i].split()[:QUERY_WORDS]) for i in query_rows]
    metadata = [
        {"id": str(j), "text": texts[i], "sourceFile": paths[i], "kind": kinds[i], "bucket": j % 100}
        for j, i in enumerate(doc_rows)
    ]
    bucket = np.arange(n) % 100
    kind = np.array([kinds[i] for i in doc_rows])
    source = np.array([paths[i] for i in doc_rows], dtype=object)
    names, counts = np.unique(source, return_counts=True)
    biggest = str(names[np.argmax(counts)])
    filters: list[tuple[str, dict[str, Any], np.ndarray]] = [
        ("engine default: skillScope $exists false", {"skillScope": {"$exists": False}}, np.ones(n, np.bool_)),
        ("sourceFile = the file with most chunks", {"sourceFile": biggest}, source == biggest),
        ("bucket $in [7, 42]", {"bucket": {"$in": [7, 42]}}, np.isin(bucket, [7, 42])),
        ("bucket $in 0..9", {"bucket": {"$in": list(range(10))}}, bucket < 10),
        ("bucket $in 0..29", {"bucket": {"$in": list(range(30))}}, bucket < 30),
        ("kind = man AND bucket $ne 3", {"$and": [{"kind": "man"}, {"bucket": {"$ne": 3}}]}, (kind == "man") & (bucket != 3)),
    ]

    build_rows: list[str] = []
    query_table: list[str] = []
    notes: list[str] = [f"corpus collected in {collect_s:.0f} s"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-vectors-"))
    try:
        for name in args.embedders.split(","):
            started = time.perf_counter()
            if name == "hashing":
                embed: Any = HashingEmbedder(args.dim)
                x = np.stack([embed(texts[i]) for i in doc_rows])
            else:
                embed = LsaEmbedder(args.dim)
                x = embed.fit_transform([texts[i] for i in doc_rows])
            embed_s = time.perf_counter() - started
            q = np.stack([embed(t) for t in query_texts])
            notes.append(f"{name}: embedded {n:,} chunks in {embed_s:.0f} s ({n / embed_s:,.0f}/s, fit included)")
            exact_scores = q @ x.T  # both unit length: cosine

            store, build_s = await build(None, x, metadata, args, ef_search=64)
            build_rows.append(f"| {name} | memory | {n:,} | {build_s:.1f} | {n / build_s:,.0f} | — | — | — |")
            for ef in args.ef:
                store._store.ef_search = ef
                found, times = await run_queries(store, q, 10, None)
                raw = hnswlib_times(store, q, 10, ef)
                query_table.append(
                    f"| {name} | no filter (100 %) | hnswlib ef={ef} | {recall_at_k(found, exact_scores, x, q, 10, None):.4f} "
                    f"| {ms(times)} | {ms(times, 95)} | — | {ms(raw)} |"
                )
            store._store.ef_search = 64
            store._store.exact_limit = n
            found, times = await run_queries(store, q, 10, None)
            query_table.append(
                f"| {name} | no filter (100 %) | exact numpy (exact_limit ≥ n) | {recall_at_k(found, exact_scores, x, q, 10, None):.4f} "
                f"| {ms(times)} | {ms(times, 95)} | — | — |"
            )
            store._store.exact_limit = HnswVectorStore()._store.exact_limit
            for label, flt, allowed in filters:
                count = int(allowed.sum())
                exact_path = count <= store._store.exact_limit or count * 20 <= n
                fetch = min(n, -(-40 * n // count))
                ef = min(n, max(-(-64 * n // count), fetch))
                how = (
                    "hnswlib ef=64 (all allowed)"
                    if allowed.all()
                    else "exact numpy"
                    if exact_path
                    else f"hnswlib k={fetch} ef={ef}, then the filter"
                )
                found, times = await run_queries(store, q, 10, flt)
                _, uncached = await run_queries(store, q[:200], 10, flt, cached=False)
                query_table.append(
                    f"| {name} | {label} ({100 * count / n:.3g} %) | {how} | "
                    f"{recall_at_k(found, exact_scores, x, q, min(10, count), allowed):.4f} | {ms(times)} | "
                    f"{ms(times, 95)} | {ms(uncached)} | — |"
                )
            await store.close()

            if name == args.embedders.split(",")[0]:
                path = tmp / "store"
                store, build_s = await build(path, x, metadata, args)
                started = time.perf_counter()
                await store.close()
                close_s = time.perf_counter() - started
                disk_mb = sum(f.stat().st_size for f in path.iterdir()) / 2**20
                store = HnswVectorStore(path)
                started = time.perf_counter()
                await store.query("chunks", q[0].tolist(), 10)
                reopen_s = time.perf_counter() - started
                await store.close()
                build_rows.append(
                    f"| {name} | disk | {n:,} | {build_s:.1f} | {n / build_s:,.0f} | {close_s:.1f} | {reopen_s:.1f} | {disk_mb:,.0f} |"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load_after = os.getloadavg()
    print(f"### HnswVectorStore at {n:,} real-text chunks ({args.dim}-d), M={args.m}, ef_construction={args.ef_construction}\n")
    print(f"Machine: {machine()}. Load average {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end "
          "(a shared machine: latencies carry noise).  ")
    print(f"Command: `{' '.join(['python', *sys.argv])}`  ")
    print(f"Corpus: {n_man:,} man-page chunks and {n - n_man:,} Python-source chunks, {len(query_rows)} held-out "
          f"queries (the first {QUERY_WORDS} words of other chunks). {'; '.join(notes)}. Peak RSS {peak_mb:,.0f} MB.\n")
    print(f"| embedder | store | vectors | build s (upserts of {args.batch:,}) | vectors/s | close s | reopen + first query s | disk MB |")
    print("| --- | --- | --: | --: | --: | --: | --: | --: |")
    print("\n".join(build_rows))
    print()
    print("| embedder | query (share of items allowed) | search | recall@10 | p50 ms | p95 ms | uncached filter p50 ms | hnswlib alone p50 ms |")
    print("| --- | --- | --- | --: | --: | --: | --: | --: |")
    print("\n".join(query_table))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="vectors indexed")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1000, help="vectors per upsert")
    parser.add_argument("--embedders", default="hashing,lsa", help="comma-separated: hashing, lsa")
    parser.add_argument("--ef", type=lambda v: [int(x) for x in v.split(",")], default=[32, 64, 128, 256, 512])
    anyio.run(main, parser.parse_args())
