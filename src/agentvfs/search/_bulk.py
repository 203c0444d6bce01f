"""Bulk indexing of a whole bucket into segments, on one machine or a Dask cluster.

``build_index(SOURCE_URL, INDEX_URL)`` indexes every file below ``SOURCE_URL`` into immutable
segments (``_segments``) kept in ``INDEX_URL/segments/<blake2b>.seg`` and lists them in a
manifest written last, ``INDEX_URL/manifests/<n>.json``.

Planning. Listing is what costs at millions of objects, so no machine lists everything: the
planner lists the tree with a delimiter from the root, one level at a time, and estimates each
child prefix's size by a count that stops past ``objects_per_task`` (on S3 a flat listing, at
most ``objects_per_task / 1000 + 1`` requests however deep the prefix), of every child or, for
prefixes of very many children, of a sample; it descends into children larger than
``objects_per_task`` and groups the rest, consecutive siblings together, into tasks of at most
that many objects. Each task lists its own prefixes (so the listing is
spread over the workers), reads its files, builds one segment and uploads it. A prefix whose
own files are too many for one task is split by key range.

Manifests. Manifest ``n + 1`` is written with a create-only put (S3 ``If-None-Match``, a GCS
generation precondition, an exclusive create on disk and in memory), by a builder that read
manifest ``n``: of two builders racing, one writes it and the other gets
:class:`~agentvfs.errors.IndexConflictError`; nothing is ever overwritten. Readers take the
highest manifest that parses and validates.

Re-runs. A task records the digest of its listing (sorted key, size, version); a re-run whose
task lists the same digest keeps the segment it had, without reading a file. Segments that no
manifest among the newest two references, and older than a grace period, are deleted at the
end of a build: what a builder killed half-way uploaded goes then. So are manifests past the
newest :data:`MANIFESTS_KEPT` that are older than the grace period (readers take the newest).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import logging
import os
import posixpath
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..errors import IndexConflictError, MissingExtraError, SearchIndexError
from ..vfs import FsspecBackend, check_storage_options, fsspec_backend
from ._embedders import embedder_id
from ._segments import (
    PUBLISHED_TEXT_LIMIT,
    SEGMENTS_DIR,
    SUFFIX,
    Segment,
    SegmentBuilder,
    SourceFile,
    segment_name,
)
from ._tokenize import TokenizeOptions

__all__ = [
    "BuildReport",
    "Manifest",
    "SegmentRef",
    "TaskReport",
    "build_index",
    "fetch_segment",
    "manifests_newest_first",
    "read_manifest",
]

_log = logging.getLogger("agentvfs.search")

MANIFEST_FORMAT = "agentvfs-index-manifest"
MANIFEST_VERSION = 1
MANIFESTS_DIR = "manifests"
#: Manifests a build keeps (the newest ones); older ones go once past the grace period. A
#: reader takes the newest that is valid, and falls back to one before only when it is not.
MANIFESTS_KEPT = 10
#: Digits of a manifest's number in its name, so names sort as numbers.
_DIGITS = 10
_MANIFEST_NAME = re.compile(rf"^(\d{{{_DIGITS}}})\.json$")
_SEGMENT_NAME = re.compile(r"^[0-9a-f]{64}$")
#: Objects a task covers at most (by the planner's estimate).
OBJECTS_PER_TASK = 5000
#: The planner counts every child of a prefix with at most this many children, else a sample
#: of them (each count stops past ``objects_per_task``): see `plan_tasks`.
PLAN_COUNT_ALL = 1024
PLAN_SAMPLE = 32
#: Listings the planner, and files a task, have in flight at once.
LIST_CONCURRENCY = 16
READ_CONCURRENCY = 16
#: Files read ahead of the one being indexed (what a task holds in memory beyond its segment).
READ_AHEAD = 64
#: Files larger than this are not indexed (as a workspace's index: ``max_file_bytes``).
MAX_FILE_BYTES = 16 * 1024 * 1024
#: The largest segment a reader fetches by default (``fetch_segment(max_bytes=...)``, a
#: workspace's ``search_index_options["max_segment_bytes"]``): a task of 5,000 files makes
#: tens of MiB; a segment named larger by its manifest, or larger in storage than its manifest
#: says, is refused before any of it is read.
MAX_SEGMENT_BYTES = 1 << 30
#: The largest manifest read (one of 100,000 tasks is about 50 MiB); a larger one is skipped
#: as invalid, never read whole.
MAX_MANIFEST_BYTES = 64 << 20
#: Bytes of a segment read (and hashed, and written to the cache) at a time.
_FETCH_CHUNK = 8 << 20
#: Unreferenced segments younger than this are kept: they may be a running build's.
GC_GRACE = 3600.0


# ----------------------------------------------------------------------------------- storage


def _open(url: str, storage_options: Mapping[str, Any] | None, what: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec instance and root path of ``url``.

    Raises
    ------
    ValueError
        The URL cannot be opened (unknown protocol, a storage option its class refuses).
    """
    if not isinstance(url, str) or not url:
        raise ValueError(f"the {what} URL must be a non-empty string, got {url!r}")
    options = dict(storage_options or {})
    if "::" not in url:
        protocol = fsspec.core.split_protocol(url)[0] or "file"
        try:
            check_storage_options(protocol, options)
        except ImportError as exc:
            raise ValueError(f"the {what} URL {url} needs a package that is not installed: {exc}") from exc
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ValueError, TypeError, ImportError) as exc:
        raise ValueError(f"the {what} URL {url} cannot be opened: {exc}") from exc
    return fs, str(path).rstrip("/") or ("/" if str(path).startswith("/") else "")


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def _join(root: str, rel: str) -> str:
    if not rel:
        return root
    return f"{root.rstrip('/')}/{rel}" if root not in ("", "/") else (f"/{rel}" if root == "/" else rel)


def _rel(root: str, name: str) -> str | None:
    """``name`` relative to ``root`` (None when it is not below it)."""
    name = name.rstrip("/")
    base = root.rstrip("/")
    if not base:
        return name.lstrip("/") if root == "/" or not root else None
    if name.startswith(base + "/"):
        return name[len(base) + 1 :]
    return None


def _ls(fs: fsspec.AbstractFileSystem, path: str) -> list[dict[str, Any]]:
    """One delimiter listing, never from a cache (an index must see the storage as it is)."""
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)
    try:
        return list(fs.ls(path, detail=True, refresh=True))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_file(info: Mapping[str, Any]) -> bool:
    # Object stores keep zero-byte "dir/" markers for empty directories: not files.
    return info.get("type") == "file" and not str(info.get("name", "")).endswith("/")


def _version(info: Mapping[str, Any]) -> tuple[str | None, int]:
    """The version (ETag or generation) and the modification time in ns a listing shows,
    read as the storage backends read them (``FsspecBackend.stat_of``), so that a record
    compares equal to what a workspace over the same storage sees."""
    etag = None
    for key in ("generation", "ETag", "etag", "md5Hash", "VersionId"):
        value = info.get(key)
        if value not in (None, ""):
            etag = str(value).strip('"')
            break
    mtime_ns = 0
    for key in ("mtime", "LastModified", "updated", "last_modified", "modified", "created", "timeCreated"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime):
            mtime_ns = int(value.timestamp() * 1e9)
        elif isinstance(value, int | float):
            mtime_ns = int(datetime.fromtimestamp(value, UTC).timestamp() * 1e9)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                mtime_ns = int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
        if mtime_ns:
            break
    if etag is None and "ino" in info:
        # Local disk has no version: the backends derive one that every write changes.
        etag = f"{info.get('mtime')}-{info.get('size')}-{info['ino']}"
    return etag, mtime_ns


_BACKENDS: dict[str, tuple[fsspec.AbstractFileSystem, str, FsspecBackend]] = {}
_BACKENDS_LOCK = threading.Lock()


def _index_backend(index_url: str, storage_options: Mapping[str, Any] | None) -> tuple[fsspec.AbstractFileSystem, str, FsspecBackend]:
    """The index's filesystem, root and backend, one per URL and options in a process: a
    worker runs many tasks, and an object store's backend costs tens of ms to make (TLS)."""
    key = json.dumps([index_url, dict(storage_options or {})], sort_keys=True, default=repr)
    with _BACKENDS_LOCK:
        found = _BACKENDS.get(key)
    if found is None:
        fs, root = _open(index_url, storage_options, "index")
        found = (fs, root, fsspec_backend(fs, root))
        with _BACKENDS_LOCK:
            if len(_BACKENDS) >= 16:
                _BACKENDS.clear()
            found = _BACKENDS.setdefault(key, found)
    return found


def _make_dirs(backend: FsspecBackend, rel: str) -> None:
    """Make the directory ``rel`` where storage has real directories (object stores need
    none: a marker object would only clutter the listing)."""
    if backend.capabilities.empty_dirs:
        backend.setup_sync()
        backend.mkdir_sync(rel, rel, True)


# ----------------------------------------------------------------------------------- planning


@dataclass(frozen=True, slots=True)
class Task:
    """What one worker indexes: some children of a prefix (each listed recursively), and/or a
    key range of the prefix's own files.

    Attributes
    ----------
    prefix : str
        The parent prefix, relative to the source root (``""``: the root), no ``/`` at the end.
    children : tuple of str
        Names of child prefixes of ``prefix`` listed recursively.
    direct : bool
        Whether the files directly in ``prefix`` are included.
    after, last : str or None
        With ``direct``: only its files whose names are after ``after`` and up to ``last``
        (None: open); on S3 the listing starts there (``StartAfter``), so the tasks of one
        large directory each list their part of it only.
    estimate : int
        Objects the planner expects.
    """

    prefix: str
    children: tuple[str, ...] = ()
    direct: bool = False
    after: str | None = None
    last: str | None = None
    estimate: int = 0

    @property
    def key(self) -> str:
        """A stable identity (the same on every run for the same prefixes)."""
        text = json.dumps([self.prefix, list(self.children), self.direct, self.after, self.last])
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    @property
    def label(self) -> str:
        """A short description: ``docs/{a..f}``, ``docs/ files [x..y]``."""
        base = f"{self.prefix}/" if self.prefix else "/"
        parts = []
        if self.children:
            kids = self.children[0] if len(self.children) == 1 else f"{{{self.children[0]}..{self.children[-1]}}}"
            parts.append(base + kids)
        if self.direct:
            span = "" if self.after is None and self.last is None else f" ({self.after or ''}..{self.last or ''}]"
            parts.append(f"{base} files{span}")
        return " + ".join(parts)


def _count_upto(fs: fsspec.AbstractFileSystem, path: str, cap: int) -> int:
    """Files below ``path``, counted until more than ``cap`` (then ``cap + 1``).

    On S3 one flat listing (no delimiter) pages through the keys, 1,000 a request, however
    deep the tree: at most ``cap / 1000 + 1`` requests. Elsewhere the directories are walked
    (a request per directory), stopping once the count passes ``cap``.
    """
    if callable(getattr(fs, "call_s3", None)):
        return _s3_count_upto(fs, path, cap)
    count = 0
    stack = [path]
    while stack and count <= cap:
        for info in _ls(fs, stack.pop()):
            if info.get("type") == "directory":
                stack.append(str(info["name"]).rstrip("/"))
            elif _is_file(info):
                count += 1
    return min(count, cap + 1)


def _s3_count_upto(fs: Any, path: str, cap: int) -> int:
    bucket, _, prefix = path.strip("/").partition("/")
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": f"{prefix}/" if prefix else "", "MaxKeys": 1000}
    count = 0
    while count <= cap:
        page = fs.call_s3("list_objects_v2", **request)
        count += sum(1 for item in page.get("Contents", ()) if not str(item["Key"]).endswith("/"))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
        request["ContinuationToken"] = token
    return min(count, cap + 1)


def plan_tasks(
    fs: fsspec.AbstractFileSystem,
    root: str,
    objects_per_task: int = OBJECTS_PER_TASK,
    *,
    sample: int = PLAN_SAMPLE,
    count_all: int = PLAN_COUNT_ALL,
    concurrency: int = LIST_CONCURRENCY,
) -> list[Task]:
    """Split the tree below ``root`` into tasks of at most ``objects_per_task`` objects by
    estimate (see the module documentation).

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The source storage.
    root : str
        The source root, a path of ``fs``.
    objects_per_task : int
        The most objects a task should cover.
    sample, count_all : int
        Each child of a prefix with at most ``count_all`` children is counted; of more, a
        sample of ``sample`` evenly spaced ones is, and the others are estimated as their
        mean, unless the sample is uneven (its largest count more than twice its median):
        then every child is counted. Each count stops past ``objects_per_task``.
    concurrency : int
        Listings in flight at once.

    Returns
    -------
    list of Task
        In key order.
    """
    if objects_per_task < 1:
        raise ValueError(f"objects_per_task must be at least 1, got {objects_per_task}")
    limit = objects_per_task
    tasks: list[Task] = []
    frontier = [""]
    with ThreadPoolExecutor(concurrency, thread_name_prefix="agentvfs-plan") as pool:
        while frontier:
            listings = list(pool.map(lambda rel: _ls(fs, _join(root, rel)), frontier))
            expanded: list[tuple[str, list[str], list[str]]] = []
            probes: list[tuple[str, str]] = []
            for rel, listing in zip(frontier, listings, strict=True):
                files: list[str] = []
                children: list[str] = []
                for info in listing:
                    name = _rel(_join(root, rel), str(info["name"]))
                    if not name or "/" in name:
                        continue
                    if info.get("type") == "directory":
                        children.append(name)
                    elif _is_file(info):
                        files.append(name)
                children = sorted(set(children))
                files.sort()
                expanded.append((rel, files, children))
                if len(children) <= count_all:
                    probes += [(rel, child) for child in children]
                else:
                    step = max(1, len(children) // sample)
                    probes += [(rel, child) for child in children[::step][:sample]]
            def count(probes: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
                found = pool.map(lambda p: _count_upto(fs, _join(root, _join(p[0], p[1])), limit), probes)
                return dict(zip(probes, found, strict=True))

            counted = count(probes)
            # Where the sample is uneven (a heavy tail: some children far larger than the
            # rest), its mean says little of the others: count every child (each count stops
            # past the limit, so this costs at most what the tasks will list anyway).
            uneven = []
            for rel, _, children in expanded:
                sizes = sorted(counted[(rel, c)] for c in children if (rel, c) in counted)
                if sizes and sizes[0] <= limit and sizes[-1] > 2 * sizes[len(sizes) // 2] + 1:
                    uneven += [(rel, c) for c in children if (rel, c) not in counted]
            counted.update(count(uneven))
            frontier = []
            for rel, files, children in expanded:
                sizes = [counted[(rel, c)] for c in children if (rel, c) in counted]
                mean = round(sum(sizes) / len(sizes)) if sizes else 0
                estimates = {c: counted.get((rel, c), mean) for c in children}
                tasks.extend(_group(rel, files, children, estimates, limit, frontier))
    tasks.sort(key=lambda t: (t.prefix, t.children, t.after or ""))
    return tasks


def _group(
    rel: str,
    files: list[str],
    children: list[str],
    estimates: Mapping[str, int],
    limit: int,
    frontier: list[str],
) -> list[Task]:
    """The tasks of one listed prefix: its own files (split by key range past ``limit``)
    and runs of consecutive small children; large children go to ``frontier``."""
    out: list[Task] = []
    group: list[str] = []
    size = 0
    direct = 0 < len(files) <= limit
    if direct:
        size = len(files)
    elif files:
        for start in range(0, len(files), limit):
            part = files[start : start + limit]
            after = files[start - 1] if start else None
            last = part[-1] if start + limit < len(files) else None
            out.append(Task(rel, (), True, after, last, len(part)))

    def flush() -> None:
        nonlocal group, size, direct
        if group or direct:
            out.append(Task(rel, tuple(group), direct, None, None, size))
        group, size, direct = [], 0, False

    for child in children:
        estimate = estimates[child]
        if estimate > limit:
            frontier.append(_join_rel(rel, child))
            continue
        if size + estimate > limit and (group or direct):
            flush()
        group.append(child)
        size += estimate
    flush()
    return out


def _join_rel(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


# ------------------------------------------------------------------------------------ a task


@dataclass(frozen=True, slots=True)
class _Listed:
    rel: str  # the key relative to the source root
    path: str  # the key as the filesystem names it
    size: int
    etag: str | None
    mtime_ns: int


def _list_task(fs: fsspec.AbstractFileSystem, root: str, task: Task) -> list[_Listed]:
    out: list[_Listed] = []
    base = _join(root, task.prefix)

    def add(info: Mapping[str, Any]) -> None:
        rel = _rel(root, str(info["name"]))
        if rel is None or not _is_file(info):
            return
        etag, mtime_ns = _version(info)
        out.append(_Listed(rel, str(info["name"]), int(info.get("size") or 0), etag, mtime_ns))

    if task.direct:
        listing = (
            _s3_range(fs, base, task.after, task.last)
            if task.after is not None and callable(getattr(fs, "call_s3", None))
            else _ls(fs, base)
        )
        for info in listing:
            name = _rel(base, str(info["name"]))
            if not name or "/" in name:
                continue
            if (task.after is None or name > task.after) and (task.last is None or name <= task.last):
                add(info)
    for child in task.children:
        path = _join(base, child)
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)
        try:
            found = fs.find(path, detail=True, withdirs=False)
        except FileNotFoundError:
            continue
        for info in found.values():
            add(info)
    out.sort(key=lambda item: item.rel)
    return out


def _s3_range(fs: Any, base: str, after: str, last: str | None) -> Iterator[dict[str, Any]]:
    """The files directly in ``base`` named after ``after`` and up to ``last``, listed from
    there (``StartAfter``) as info records like ``ls`` gives."""
    bucket, _, prefix = base.strip("/").partition("/")
    prefix = f"{prefix}/" if prefix else ""
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/", "StartAfter": prefix + after}
    while True:
        page = fs.call_s3("list_objects_v2", **request)
        for item in page.get("Contents", ()):
            key = str(item["Key"])
            if last is not None and key[len(prefix) :] > last:
                return
            yield {
                "name": f"{bucket}/{key}", "type": "file", "size": item.get("Size", 0),
                "ETag": item.get("ETag"), "LastModified": item.get("LastModified"),
            }  # fmt: skip
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return
        request["ContinuationToken"] = token


def _listing_digest(listed: Sequence[_Listed]) -> str:
    """SHA-256 of the sorted (key, size, version) lines: the same listing, the same digest.
    The version is the ETag, or the modification time where the storage has none."""
    h = hashlib.sha256()
    for item in listed:
        h.update(f"{item.rel}\t{item.size}\t{item.etag or item.mtime_ns}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _read_in_order(fs: fsspec.AbstractFileSystem, paths: Sequence[str]) -> Iterator[bytes | BaseException]:
    """The bytes of each of ``paths`` (or why it could not be read), in order, read
    ``READ_CONCURRENCY`` at a time and at most ``READ_AHEAD`` ahead of the consumer: the files
    are indexed while the next ones are read."""
    if isinstance(fs, LocalFileSystem):
        def read(path: str) -> bytes:
            # fsspec's local file object costs more per file than the read of a small file.
            with open(path, "rb") as f:
                return f.read()
    else:
        def read(path: str) -> bytes:
            return bytes(fs.cat_file(path))

    def one(path: str) -> bytes | BaseException:
        try:
            return read(path)
        except Exception as exc:
            return exc

    if isinstance(fs, LocalFileSystem):
        # A local read takes microseconds: reader threads would only take the GIL from the
        # indexing thread (each waits a switch interval to get it back), a third slower.
        yield from map(one, paths)
        return

    with ThreadPoolExecutor(READ_CONCURRENCY, thread_name_prefix="agentvfs-read") as pool:
        pending = iter(paths)
        window = collections.deque(pool.submit(one, p) for p in itertools.islice(pending, READ_AHEAD))
        while window:
            got = window.popleft().result()
            following = next(pending, None)
            if following is not None:
                window.append(pool.submit(one, following))
            yield got


def run_task(
    source_url: str,
    storage_options: Mapping[str, Any] | None,
    index_url: str,
    index_storage_options: Mapping[str, Any] | None,
    task: Task,
    tokenize: Mapping[str, Any],
    previous: Mapping[str, Any] | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
    embedder: Any = None,
) -> dict[str, Any]:
    """Index one task: list it, and unless its listing is ``previous``'s (and its segment was
    built with the same embedder, every embedding done), read its files, build a segment
    (with a vector shard when there is an ``embedder``) and upload it. Runs in a Dask worker
    as well as in-process (its arguments pickle).

    Returns
    -------
    dict
        The task's record: ``task``, ``prefix``, ``label``, ``estimate``, ``objects``,
        ``listing_digest``, ``segment`` (name, or None for no files), ``docs``, ``bytes``,
        ``too_large``, ``failed``, ``embedder`` (its id, or None), ``embed_failed``,
        ``reused``, ``seconds``.
    """
    started = time.monotonic()
    fs, root = _open(source_url, storage_options, "source")
    listed = _list_task(fs, root, task)
    digest = _listing_digest(listed)
    record: dict[str, Any] = {
        "task": task.key, "prefix": task.prefix, "label": task.label, "estimate": task.estimate,
        "objects": len(listed), "listing_digest": digest, "segment": None, "docs": 0, "bytes": 0,
        "too_large": 0, "failed": 0, "embedder": embedder_id(embedder) if embedder is not None else None,
        "embed_failed": 0, "reused": False,
    }  # fmt: skip
    index_fs, index_root, backend = _index_backend(index_url, index_storage_options)
    if (
        previous is not None
        and previous.get("listing_digest") == digest
        # Vectors of another embedder (or none) are no use, and failed embeddings are retried.
        and previous.get("embedder") == record["embedder"]
        and not previous.get("embed_failed")
    ):
        name = previous.get("segment")
        if name is None or _stored_size(index_fs, _join(index_root, _segment_rel(name))) == previous.get("bytes"):
            record.update(segment=name, docs=previous.get("docs", 0), bytes=previous.get("bytes", 0))
            record.update(too_large=previous.get("too_large", 0), failed=previous.get("failed", 0))
            record.update(reused=True, seconds=time.monotonic() - started)
            return record
    wanted = [item for item in listed if item.size <= max_file_bytes]
    record["too_large"] = len(listed) - len(wanted)
    with SegmentBuilder(tokenize, embedder=embedder) as builder:
        # The listing is in key order, the order a segment keeps its files in.
        for item, raw in zip(wanted, _read_in_order(fs, [item.path for item in wanted]), strict=True):
            if not isinstance(raw, bytes):
                _log.warning("not indexing %s: it could not be read (%s)", item.path, raw)
                record["failed"] += 1
            elif len(raw) > max_file_bytes:
                record["too_large"] += 1
            else:
                builder.add(SourceFile("/" + item.rel, raw, item.size, item.mtime_ns, item.etag))
        blob = builder.finish() if builder.files else None
    failures = builder.embedding_failures
    if failures:
        record["embed_failed"] = len(failures)
        shown = "; ".join(list(failures.values())[:3])
        _log.warning("%d documents of %s have no vector (retried by the next build): %s", len(failures), task.label, shown)
    if blob is not None:
        name = segment_name(blob)
        if len(blob) > MAX_SEGMENT_BYTES:
            _log.warning(
                "the segment of %s is %d bytes, past the %d bytes a workspace fetches by default: "
                "attach the index with search_index_options max_segment_bytes at least that, or "
                "build it with fewer objects_per_task", task.label, len(blob), MAX_SEGMENT_BYTES,
            )
        _upload_segment(index_fs, index_root, backend, name, blob)
        record.update(segment=name, bytes=len(blob), docs=Segment.from_bytes(blob, name=name).n_docs)
    record["seconds"] = time.monotonic() - started
    return record


def _stored_size(fs: fsspec.AbstractFileSystem, path: str) -> int | None:
    """The size of the object at ``path``, None when there is none."""
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)
    try:
        return int(fs.info(path).get("size") or 0)
    except FileNotFoundError:
        return None


def _stored_segments(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, int]:
    """The segments in the index, name -> size (one listing)."""
    out = {}
    for info in _ls(fs, _join(root, SEGMENTS_DIR)):
        base = posixpath.basename(str(info["name"]).rstrip("/"))
        if _is_file(info) and base.endswith(SUFFIX):
            out[base.removesuffix(SUFFIX)] = int(info.get("size") or 0)
    return out


def _segment_rel(name: str) -> str:
    return f"{SEGMENTS_DIR}/{name}{SUFFIX}"


def _upload_segment(fs: fsspec.AbstractFileSystem, root: str, backend: FsspecBackend, name: str, blob: bytes) -> None:
    """Put the segment unless it is there: a segment of this name has these bytes (its name
    is their hash), unless it was damaged, which its size nearly always shows."""
    rel = _segment_rel(name)
    if _stored_size(fs, _join(root, rel)) == len(blob):
        return
    if not backend.capabilities.empty_dirs:
        # An object store's PUT is atomic already; the backend's write would first list the
        # segments (to refuse a file over a directory), a cost that grows with the index.
        fs.pipe_file(_join(root, rel), blob)
        return
    _make_dirs(backend, SEGMENTS_DIR)
    backend.write_sync(rel, rel, blob, recursive=True, overwrite=True)


# --------------------------------------------------------------------------------- manifests


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """A segment as a manifest lists it.

    Attributes
    ----------
    name : str
        Its BLAKE2b-256 hex name (the file ``segments/<name>.seg``).
    prefix : str
        The source prefix its task covered.
    docs, bytes : int
        Its documents and size.
    listing_digest : str
        The digest of its task's listing when it was built.
    """

    name: str
    prefix: str
    docs: int
    bytes: int
    listing_digest: str

    def to_dict(self) -> dict[str, Any]:
        """The entry as the manifest's JSON holds it."""
        return {
            "name": self.name, "prefix": self.prefix, "docs": self.docs, "bytes": self.bytes,
            "listing_digest": self.listing_digest,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Manifest:
    """One version of an index: its segments and how they were built.

    Attributes
    ----------
    number : int
        Its number (``manifests/<number>.json``); each build writes the next.
    created : str
        When it was written (ISO 8601, UTC).
    source : str
        The URL indexed.
    tokenize : dict
        The tokenizer options of every segment (``TokenizeOptions.to_dict()``).
    segments : tuple of SegmentRef
        The segments, in the order of their prefixes.
    tasks : tuple of dict
        Each task's record (``task``, ``prefix``, ``listing_digest``, ``segment``...), what a
        re-run compares its listings with.
    totals : dict
        ``segments``, ``docs``, ``bytes``, ``objects``.
    embedder : str or None
        The id of the embedder of the segments' vector shards (None: no vectors).
    """

    number: int
    created: str
    source: str
    tokenize: dict[str, Any]
    segments: tuple[SegmentRef, ...]
    tasks: tuple[dict[str, Any], ...] = ()
    totals: dict[str, Any] = field(default_factory=dict)
    embedder: str | None = None

    @property
    def docs(self) -> int:
        """Documents over all segments."""
        return sum(s.docs for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        """The manifest's JSON object."""
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "number": self.number,
            "created": self.created,
            "source": self.source,
            "tokenize": self.tokenize,
            "embedder": self.embedder,
            "segments": [s.to_dict() for s in self.segments],
            "tasks": list(self.tasks),
            "totals": self.totals,
        }

    @classmethod
    def from_dict(cls, value: Any, where: str) -> Manifest:
        """Parse and check a manifest's JSON object.

        Raises
        ------
        SearchIndexError
            Not a manifest this version reads (the message says what is wrong).
        """
        def bad(why: str) -> SearchIndexError:
            return SearchIndexError(f"manifest {where} cannot be read: {why}")

        if not isinstance(value, dict) or value.get("format") != MANIFEST_FORMAT:
            raise bad(f"format {value.get('format') if isinstance(value, dict) else None!r}, expected {MANIFEST_FORMAT!r}")
        if value.get("version") != MANIFEST_VERSION:
            raise bad(f"version {value.get('version')!r}; this version reads {MANIFEST_VERSION}")
        segments = value.get("segments")
        if not isinstance(segments, list) or not isinstance(value.get("tokenize"), dict):
            raise bad("no segments list or tokenize options")
        refs = []
        for entry in segments:
            try:
                ref = SegmentRef(
                    str(entry["name"]), str(entry.get("prefix", "")), int(entry["docs"]),
                    int(entry["bytes"]), str(entry.get("listing_digest", "")),
                )  # fmt: skip
            except (KeyError, TypeError, ValueError) as exc:
                raise bad(f"a segment entry is malformed ({entry!r:.120}): {exc}") from None
            if not _SEGMENT_NAME.match(ref.name):
                raise bad(f"segment name {ref.name!r} is not a 64-digit BLAKE2b hex digest")
            refs.append(ref)
        tasks = value.get("tasks", [])
        totals = value.get("totals")
        embedder = value.get("embedder")
        if embedder is not None and not isinstance(embedder, str):
            raise bad(f"its embedder {embedder!r} is not a string")
        return cls(
            number=int(value.get("number", 0)),
            created=str(value.get("created", "")),
            source=str(value.get("source", "")),
            tokenize=value["tokenize"],
            segments=tuple(refs),
            tasks=tuple(t for t in tasks if isinstance(t, dict)) if isinstance(tasks, list) else (),
            totals=totals if isinstance(totals, dict) else {},
            embedder=embedder,
        )


def _manifest_listing(fs: fsspec.AbstractFileSystem, root: str) -> list[tuple[int, dict[str, Any]]]:
    """Each manifest's number and listing entry, in number order."""
    found = []
    for info in _ls(fs, _join(root, MANIFESTS_DIR)):
        match = _MANIFEST_NAME.match(posixpath.basename(str(info["name"]).rstrip("/")))
        if match and _is_file(info):
            found.append((int(match.group(1)), info))
    return sorted(found, key=lambda item: item[0])


def _manifest_numbers(fs: fsspec.AbstractFileSystem, root: str) -> list[int]:
    return [number for number, _ in _manifest_listing(fs, root)]


def _manifest_rel(number: int) -> str:
    return f"{MANIFESTS_DIR}/{number:0{_DIGITS}d}.json"


def _load_manifest(fs: fsspec.AbstractFileSystem, root: str, number: int, listed_size: int | None = None) -> Manifest:
    """Read and check manifest ``number``: refused unread when its listing shows it past
    :data:`MAX_MANIFEST_BYTES`, and never read past that whatever it holds."""
    where = _join(root, _manifest_rel(number))
    too_large = f"manifest {where} is larger than a manifest may be ({MAX_MANIFEST_BYTES} bytes): not read"
    if listed_size is not None and listed_size > MAX_MANIFEST_BYTES:
        raise SearchIndexError(f"{too_large} ({listed_size} bytes)")
    try:
        raw = fs.cat_file(where, start=0, end=MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise SearchIndexError(f"manifest {where} is missing") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise SearchIndexError(too_large)
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise SearchIndexError(f"manifest {where} cannot be read: not JSON ({exc})") from None
    manifest = Manifest.from_dict(value, where)
    if manifest.number != number:
        raise SearchIndexError(f"manifest {where} says it is number {manifest.number}")
    return manifest


def _newest_manifests(fs: fsspec.AbstractFileSystem, root: str, count: int) -> tuple[list[Manifest], int]:
    """The newest ``count`` valid manifests (newest first) and the highest number present."""
    listing = _manifest_listing(fs, root)
    found: list[Manifest] = []
    for number, info in reversed(listing):
        try:
            found.append(_load_manifest(fs, root, number, _listed_size(info)))
        except SearchIndexError as exc:
            _log.warning("skipping %s", exc)
            continue
        if len(found) == count:
            break
    return found, (listing[-1][0] if listing else 0)


def _listed_size(info: Mapping[str, Any]) -> int | None:
    size = info.get("size")
    return int(size) if isinstance(size, int | float) else None


def manifests_newest_first(
    index_url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    count: int = MANIFESTS_KEPT,
    newer_than: int | None = None,
) -> Iterator[tuple[int, Manifest | SearchIndexError]]:
    """The newest ``count`` manifests of an index (those numbered above ``newer_than`` only,
    when given), newest first, each read when it is reached: ``(number, manifest)``, or
    ``(number, error)`` for one that cannot be read.

    A reader that finds the newest one unusable (a segment missing, damaged or too large)
    takes the next (see ``SharedIndex.load``). ``count`` is :data:`MANIFESTS_KEPT` by
    default: a build keeps that many, and the segments of older ones may be gone.

    Raises
    ------
    ValueError
        The URL cannot be opened.
    """
    fs, root = _open(index_url, storage_options, "index")
    for number, info in list(reversed(_manifest_listing(fs, root)))[:count]:
        if newer_than is not None and number <= newer_than:
            return
        try:
            yield number, _load_manifest(fs, root, number, _listed_size(info))
        except SearchIndexError as exc:
            yield number, exc


def read_manifest(index_url: str, storage_options: Mapping[str, Any] | None = None) -> Manifest:
    """The index's current manifest: the highest-numbered one that parses and validates.

    Raises
    ------
    SearchIndexError
        The index has no valid manifest (the message names the URL).
    ValueError
        The URL cannot be opened.
    """
    fs, root = _open(index_url, storage_options, "index")
    found, highest = _newest_manifests(fs, root, 1)
    if not found:
        why = "no manifest" if not highest else f"no valid manifest among {highest} (see the warnings)"
        raise SearchIndexError(f"index {index_url} has {why}; build it with: agentvfs index SOURCE --out {index_url}")
    return found[0]


def fetch_segment(
    index_url: str,
    ref: SegmentRef | str,
    cache_dir: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    verify_cached: bool = False,
    max_bytes: int = MAX_SEGMENT_BYTES,
) -> Segment:
    """A segment of the index, from ``cache_dir`` or downloaded into it, checked and opened.

    The download is bounded before it starts: a segment its manifest says is larger than
    ``max_bytes``, or whose object in storage is not the size its manifest says (or past
    ``max_bytes``, for a bare name), is refused unread. It is read a piece at a time into a
    staged file and hashed as it comes (never held whole in memory), verified against its
    name (the BLAKE2b-256 hash of its bytes) and opened before it is kept: a segment that
    fails is never put in the cache. A cached copy whose size or header is wrong is fetched
    again. Cached copies were verified when they were downloaded: ``verify_cached`` hashes
    them again (a full read).

    Raises
    ------
    SearchIndexError
        The segment is missing from the index, larger than ``max_bytes``, not the size its
        manifest says, its bytes do not match its name, or it is not a segment (the message
        names the segment and the index).
    """
    name = ref.name if isinstance(ref, SegmentRef) else str(ref)
    if not _SEGMENT_NAME.match(name):
        raise ValueError(f"{name!r} is not a segment name (64 hex digits)")
    expected = ref.bytes if isinstance(ref, SegmentRef) else None
    what = f"segment {name} of index {index_url}"
    too_large = (
        f"past the limit of {max_bytes} bytes a segment may have here; if the index is yours, "
        "attach it with a larger search_index_options max_segment_bytes (or build it with fewer "
        "objects_per_task), else its manifest is not to be trusted"
    )
    if expected is not None and expected > max_bytes:
        raise SearchIndexError(f"{what} is {expected} bytes by its manifest, {too_large}")
    cache = os.fspath(cache_dir)
    os.makedirs(cache, exist_ok=True)
    local = os.path.join(cache, name + SUFFIX)
    cached = os.path.getsize(local) if os.path.exists(local) else None
    if cached is not None and cached <= max_bytes and expected in (None, cached):
        try:
            segment = Segment.open(local)
            segment.text_limit = PUBLISHED_TEXT_LIMIT
            if not verify_cached or _file_name(local) == name:
                return segment
            segment.close()
            _log.warning("fetching %s again: the cached copy does not hash to its name", name)
        except SearchIndexError as exc:
            _log.warning("fetching %s again: the cached copy is damaged (%s)", name, exc)
    fs, root = _open(index_url, storage_options, "index")
    remote = _join(root, _segment_rel(name))
    stored = _stored_size(fs, remote)
    if stored is None:
        raise SearchIndexError(
            f"{what} is missing ({remote}); rebuild the index "
            "(agentvfs index SOURCE --out INDEX) to write a manifest without it"
        )
    if expected is not None and stored != expected:
        raise SearchIndexError(
            f"{what} is {stored} bytes in storage, and its manifest says {expected}: replaced or "
            "damaged; rebuild the index"
        )
    if stored > max_bytes:
        raise SearchIndexError(f"{what} is {stored} bytes, {too_large}")
    fd, staged = tempfile.mkstemp(prefix=f".{name[:16]}-", suffix=".part", dir=cache)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _download(fs, remote, out, stored, what)
        if digest != name:
            raise SearchIndexError(
                f"{what} is corrupt: its bytes hash to {digest[:16]}..., not its name; rebuild the index"
            )
        # Opened (its header and arrays checked) before it is kept: the mapping stays valid
        # once the file is renamed into the cache.
        segment = Segment.open(staged, name=name)
        os.replace(staged, local)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
    segment.path = local
    segment.text_limit = PUBLISHED_TEXT_LIMIT
    return segment


def _download(fs: fsspec.AbstractFileSystem, remote: str, out: Any, size: int, what: str) -> str:
    """Copy the object ``remote`` of ``size`` bytes into ``out`` a piece at a time and
    return :func:`segment_name` of its bytes.

    Raises
    ------
    SearchIndexError
        The object is not ``size`` bytes as it is read (replaced meanwhile).
    """
    digest = hashlib.blake2b(digest_size=32)
    copied = 0
    with fs.open(remote, "rb") as source:
        while copied <= size:
            # One byte past the size: an object grown since its size was read is caught.
            block = source.read(min(_FETCH_CHUNK, size + 1 - copied))
            if not block:
                break
            digest.update(block)
            out.write(block)
            copied += len(block)
    if copied != size:
        raise SearchIndexError(f"{what} changed while it was read ({copied} bytes, not {size}); fetch it again")
    return digest.hexdigest()


def _file_name(path: str) -> str:
    """:func:`segment_name` of a file's bytes, read in pieces."""
    h = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------- build


@dataclass(frozen=True, slots=True)
class TaskReport:
    """What one task did.

    Attributes
    ----------
    label : str
        Its prefixes (``docs/{a..f}``).
    estimate, objects : int
        The objects the planner expected, and those listed.
    docs, bytes : int
        Documents and bytes of its segment.
    segment : str or None
        The segment's name (None: no files).
    reused : bool
        Its listing was unchanged, so the segment it had was kept.
    too_large, failed : int
        Files not indexed: larger than the limit, or unreadable.
    seconds : float
        Time it took in its worker.
    embed_failed : int
        Documents without a vector: the embedder failed on them (the task is built again by
        the next build).
    """

    label: str
    estimate: int
    objects: int
    docs: int
    bytes: int
    segment: str | None
    reused: bool
    too_large: int
    failed: int
    seconds: float
    embed_failed: int = 0


@dataclass(frozen=True, slots=True)
class BuildReport:
    """What a build did.

    Attributes
    ----------
    manifest : int
        The number of the manifest it wrote.
    tasks : tuple of TaskReport
        Each task, in prefix order.
    built, reused, deleted : int
        Segments built, kept from the previous manifest, and garbage-collected.
    manifests_deleted : int
        Old manifests deleted (past the newest :data:`MANIFESTS_KEPT` and the grace period).
    docs, objects : int
        Documents in the index, and objects listed.
    seconds, planning_seconds : float
        The whole build, and the planning part of it.
    embedder : str or None
        The id of the embedder of the segments' vector shards (None: BM25 only).
    embed_failed : int
        Documents without a vector (see :attr:`TaskReport.embed_failed`).
    """

    manifest: int
    tasks: tuple[TaskReport, ...]
    built: int
    reused: int
    deleted: int
    docs: int
    objects: int
    seconds: float
    planning_seconds: float
    manifests_deleted: int = 0
    embedder: str | None = None
    embed_failed: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-friendly values (what ``agentvfs index --json`` prints)."""
        return {
            "manifest": self.manifest, "built": self.built, "reused": self.reused,
            "deleted": self.deleted, "manifests_deleted": self.manifests_deleted,
            "docs": self.docs, "objects": self.objects, "embedder": self.embedder,
            "embed_failed": self.embed_failed,
            "seconds": round(self.seconds, 3), "planning_seconds": round(self.planning_seconds, 3),
            "tasks": [
                {
                    "label": t.label, "estimate": t.estimate, "objects": t.objects, "docs": t.docs,
                    "bytes": t.bytes, "segment": t.segment, "reused": t.reused,
                    "too_large": t.too_large, "failed": t.failed, "embed_failed": t.embed_failed,
                    "seconds": round(t.seconds, 3),
                }
                for t in self.tasks
            ],
        }  # fmt: skip


def _tokenize_differences(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(recorded) | set(wanted)):
        if recorded.get(key) != wanted.get(key):
            before, after = recorded.get(key), wanted.get(key)
            if key == "stopwords" and isinstance(before, list) and isinstance(after, list):
                added, dropped = sorted(set(after) - set(before)), sorted(set(before) - set(after))
                out.append(f"stopwords differ (added {added[:5]}, removed {dropped[:5]})")
            else:
                out.append(f"{key} {before!r} (in the index) != {after!r}")
    return out


@contextlib.contextmanager
def _dask_client(scheduler: str | None, workers: int | None, client: Any) -> Iterator[Any]:
    """The Dask client to run tasks on (None: in this process)."""
    if client is not None:
        yield client
        return
    if scheduler is None and workers is None:
        yield None
        return
    try:
        import distributed
    except ModuleNotFoundError as exc:
        if exc.name not in ("distributed", "dask"):
            raise
        raise MissingExtraError("Distributed index builds (scheduler=, workers=)", "dask", exc.name) from None
    if scheduler is not None:
        _probe_scheduler(scheduler)
        try:
            made = distributed.Client(scheduler, timeout=10, set_as_default=False)  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError, ValueError) as exc:
            raise ConnectionError(
                f"Cannot reach the Dask scheduler at {scheduler}: {' '.join(str(exc).split())}; "
                "check the address (tcp://HOST:8786) and that the scheduler runs"
            ) from exc
        with made:
            yield made
        return
    assert workers is not None
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    with (
        local_cluster(workers) as cluster,
        distributed.Client(cluster, set_as_default=False) as made,  # type: ignore[no-untyped-call]
    ):
        yield made


def local_cluster(workers: int) -> Any:
    """A ``distributed.LocalCluster`` of ``workers`` one-thread processes, set up for index
    builds.

    Dask starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (memory goes back to the
    system sooner); every free of a block past 64 KiB then trims the heap, and a segment
    build, which allocates and frees many such blocks, runs about 30 % slower. These workers
    keep glibc's own, adaptive threshold.
    """
    import dask
    import distributed

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        return distributed.LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        )


def _probe_scheduler(address: str) -> None:
    """Fail at once when nothing listens at a TCP scheduler address (Dask itself retries until
    its timeout)."""
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "tcp", "tls"):
        return  # another transport (inproc, ucx): Dask knows how to reach it
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"the Dask scheduler address {address!r} has no port; use tcp://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise ConnectionError(
            f"Cannot reach the Dask scheduler at {address}: {exc.strerror or exc}; check the address "
            "(tcp://HOST:8786) and that the scheduler runs"
        ) from exc


def _run_all(client: Any, calls: list[tuple[Any, ...]]) -> Iterator[dict[str, Any]]:
    """Run ``run_task(*call)`` for each call, in this process or on the client's cluster,
    yielding the records as they finish."""
    if client is None:
        for call in calls:
            yield run_task(*call)
        return
    from distributed import as_completed

    run = uuid.uuid4().hex[:8]
    futures = [
        client.submit(run_task, *call, key=f"agentvfs-index-{run}-{call[4].key}", pure=False)
        for call in calls
    ]
    try:
        for future in as_completed(futures, loop=client.loop):  # type: ignore[no-untyped-call]
            yield future.result()
    except BaseException:
        # One task failed (or the build was interrupted): the others are of no use now.
        client.cancel([f for f in futures if not f.done()])
        raise


def build_index(
    source_url: str,
    index_url: str,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    index_storage_options: Mapping[str, Any] | None = None,
    tokenize: TokenizeOptions | Mapping[str, Any] | None = None,
    objects_per_task: int = OBJECTS_PER_TASK,
    client: Any = None,
    gc_grace: float = GC_GRACE,
    max_file_bytes: int = MAX_FILE_BYTES,
    progress: Callable[[TaskReport], None] | None = None,
    embedder: Any = None,
) -> BuildReport:
    """Index every file below ``source_url`` into segments under ``index_url`` and write its
    next manifest (see the module documentation).

    Parameters
    ----------
    source_url : str
        What to index (``s3://bucket/prefix``, ``gcs://bucket``, ``file:///dir``...). Ids are
        the files' paths below it, ``/`` first.
    index_url : str
        Where the index lives (created on first use).
    scheduler : str, optional
        A Dask scheduler's address: the tasks run on its cluster.
    workers : int, optional
        Run the tasks on a local Dask cluster of this many one-thread worker processes.
        With neither, they run in this process (Dask not needed).
    storage_options, index_storage_options : mapping, optional
        fsspec options of the two URLs (workers get them too: they must pickle).
    tokenize : TokenizeOptions or mapping, optional
        Tokenizer options (default: the reference's); an index keeps one set.
    objects_per_task : int
        The most objects a task covers, by the planner's estimate.
    client : distributed.Client, optional
        A client to run on, instead of one made from ``scheduler`` or ``workers``.
    gc_grace : float
        Seconds an unreferenced segment is kept (it may be a running build's).
    max_file_bytes : int
        Larger files are not indexed (counted in each task's ``too_large``).
    progress : callable, optional
        Called with each task's report as it finishes.
    embedder : callable, optional
        Also embed every document into a vector shard per segment (unit vectors and their
        hnswlib graph), for workspaces that attach the index with the same embedder (same
        :func:`embedder_id`). It runs where the tasks run, so on Dask it must pickle (a
        module-level function or an object such as :class:`HashingEmbedder`). A build with
        another embedder than the index's previous one builds every segment again.

    Returns
    -------
    BuildReport

    Raises
    ------
    IndexConflictError
        Another builder wrote the next manifest first; this build's segments stay until a
        later build collects them.
    ValueError
        A URL cannot be opened, or the index was built with other tokenizer options (named).
    MissingExtraError
        ``scheduler`` or ``workers`` without Dask (``pip install 'agentvfs[dask]'``).
    ConnectionError
        The scheduler cannot be reached.
    """
    started = time.monotonic()
    if scheduler is not None and workers is not None:
        raise ValueError("give scheduler or workers, not both")
    options = TokenizeOptions.from_value(tokenize).to_dict()
    fs, root = _open(source_url, storage_options, "source")
    if (scheduler is not None or workers is not None or client is not None) and "memory" in _protocols(fs):
        raise ValueError(
            f"{source_url} is in this process's memory, which Dask workers (other processes) cannot "
            "see; build it in this process (no scheduler or workers), or from shared storage"
        )
    index_fs, index_root, backend = _index_backend(index_url, index_storage_options)
    if not _ls(fs, root) and not fs.exists(root):
        raise ValueError(f"the source URL {source_url} does not exist (nothing is listed there)")
    newest, highest = _newest_manifests(index_fs, index_root, 1)
    base = newest[0] if newest else None
    if base is not None:
        differences = _tokenize_differences(base.tokenize, options)
        if differences:
            raise ValueError(
                f"index {index_url} was built with other tokenizer options: {'; '.join(differences)}. "
                "Build with the recorded options, or into a new index URL"
            )
    previous = {t.get("task"): t for t in base.tasks} if base is not None else {}
    plan_started = time.monotonic()
    tasks = plan_tasks(fs, root, objects_per_task)
    planning = time.monotonic() - plan_started
    calls = [
        (
            source_url, dict(storage_options or {}), index_url, dict(index_storage_options or {}),
            task, options, previous.get(task.key), max_file_bytes, embedder,
        )
        for task in tasks
    ]
    records: list[dict[str, Any]] = []
    with _dask_client(scheduler, workers, client) as dask:
        for record in _run_all(dask, calls):
            records.append(record)
            if progress is not None:
                progress(_task_report(record))
    records.sort(key=lambda r: (r["prefix"], r["label"]))
    segments = tuple(
        SegmentRef(r["segment"], r["prefix"], r["docs"], r["bytes"], r["listing_digest"])
        for r in records
        if r["segment"] is not None
    )
    # Each segment must still be there: a concurrent build with a short grace period may have
    # collected one of ours (never the case with the default hour).
    stored = _stored_segments(index_fs, index_root)
    for ref in segments:
        if stored.get(ref.name) != ref.bytes:
            raise SearchIndexError(
                f"segment {ref.name} vanished from {index_url} before the manifest was written "
                "(collected by a concurrent build with a short gc_grace?); run the build again"
            )
    number = highest + 1
    task_records = [{k: v for k, v in r.items() if k != "seconds"} for r in records]
    manifest = Manifest(
        number=number,
        created=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        source=source_url,
        tokenize=options,
        segments=segments,
        tasks=tuple(task_records),
        totals={
            "segments": len(segments), "docs": sum(s.docs for s in segments),
            "bytes": sum(s.bytes for s in segments), "objects": sum(r["objects"] for r in records),
        },
        embedder=embedder_id(embedder) if embedder is not None else None,
    )
    _write_manifest(index_fs, index_root, backend, index_url, manifest)
    deleted = _collect_garbage(index_fs, index_root, backend, gc_grace)
    manifests_deleted = _collect_manifests(index_fs, index_root, backend, gc_grace)
    return BuildReport(
        manifest=number,
        tasks=tuple(_task_report(r) for r in records),
        built=sum(1 for r in records if r["segment"] is not None and not r["reused"]),
        reused=sum(1 for r in records if r["segment"] is not None and r["reused"]),
        deleted=deleted,
        docs=manifest.totals["docs"],
        objects=manifest.totals["objects"],
        seconds=time.monotonic() - started,
        planning_seconds=planning,
        manifests_deleted=manifests_deleted,
        embedder=manifest.embedder,
        embed_failed=sum(int(r.get("embed_failed", 0)) for r in records),
    )


def _task_report(record: Mapping[str, Any]) -> TaskReport:
    return TaskReport(
        label=record["label"], estimate=record["estimate"], objects=record["objects"],
        docs=record["docs"], bytes=record["bytes"], segment=record["segment"],
        reused=record["reused"], too_large=record["too_large"], failed=record["failed"],
        seconds=float(record.get("seconds", 0.0)), embed_failed=int(record.get("embed_failed", 0)),
    )  # fmt: skip


def _write_manifest(
    fs: fsspec.AbstractFileSystem, root: str, backend: FsspecBackend, index_url: str, manifest: Manifest
) -> None:
    rel = _manifest_rel(manifest.number)
    data = json.dumps(manifest.to_dict(), indent=1, sort_keys=False).encode()
    _make_dirs(backend, MANIFESTS_DIR)
    try:
        backend.write_sync(rel, rel, data, recursive=True, overwrite=False)
    except FileExistsError:
        try:
            winner = _load_manifest(fs, root, manifest.number)
            who = f"written at {winner.created} with {len(winner.segments)} segments"
        except SearchIndexError as exc:
            who = f"unreadable: {exc}"
        raise IndexConflictError(
            f"another build wrote manifest {manifest.number} of {index_url} first ({who}); this "
            "build's manifest was not written. Run the build again to index on top of it",
            manifest.number,
        ) from None


def _collect_manifests(fs: fsspec.AbstractFileSystem, root: str, backend: FsspecBackend, grace: float) -> int:
    """Delete the manifests past the newest :data:`MANIFESTS_KEPT` that are older than
    ``grace`` seconds; how many were deleted."""
    now = time.time()
    deleted = 0
    for number, entry in _manifest_listing(fs, root)[:-MANIFESTS_KEPT]:
        deleted += _delete_if_old(backend, _manifest_rel(number), entry, now, grace)
    return deleted


def _delete_if_old(backend: FsspecBackend, rel: str, info: Mapping[str, Any], now: float, grace: float) -> bool:
    """Delete ``rel`` (listed as ``info``) if it is older than ``grace`` seconds (one of no
    known age only with a grace of 0); whether it was deleted here (not first by another
    build)."""
    _, mtime_ns = _version(info)
    if (mtime_ns and now - mtime_ns / 1e9 < grace) or (not mtime_ns and grace > 0):
        return False
    try:
        backend.delete_sync(rel, rel)
    except FileNotFoundError:
        return False  # another build deleted it
    return True


def _collect_garbage(fs: fsspec.AbstractFileSystem, root: str, backend: FsspecBackend, grace: float) -> int:
    """Delete the segments no manifest among the newest two references, older than ``grace``
    seconds; how many were deleted."""
    newest, _ = _newest_manifests(fs, root, 2)
    if not newest:
        return 0
    keep = {ref.name for manifest in newest for ref in manifest.segments}
    now = time.time()
    deleted = 0
    for info in _ls(fs, _join(root, SEGMENTS_DIR)):
        base = posixpath.basename(str(info["name"]).rstrip("/"))
        name = base.removesuffix(SUFFIX)
        if not _is_file(info) or not base.endswith(SUFFIX) or not _SEGMENT_NAME.match(name) or name in keep:
            continue
        deleted += _delete_if_old(backend, _segment_rel(name), info, now, grace)
    return deleted
