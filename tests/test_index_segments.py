"""Index segments: the same postings, documents and scores as a BM25 index of the same files,
the file layout, fast lazy opening, and clear errors for damaged files."""

from __future__ import annotations

import json
import math
import os
import struct
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from agentvfs.errors import SearchIndexError
from agentvfs.search import (
    BM25Index,
    Segment,
    SourceFile,
    TokenizeOptions,
    build_segment,
    fetch_segment,
)
from agentvfs.search._bm25 import _term_hashes
from agentvfs.search._segments import ALIGN, MAGIC, SegmentBuilder, encode_segment, segment_name
from agentvfs.search._tokenize import Tokenizer
from agentvfs.search._workspace import file_documents

K1, B = 1.5, 0.75


def _long_file(lines: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "kernel", "socket", "buffer", "thread"]
    return "".join(f"line {i} {words[i % 8]} {words[(i * 3) % 8]} search index\n" for i in range(lines))


CORPUS: dict[str, bytes] = {
    "/docs/a.md": b"# Alpha\nThe quick brown fox jumps over the lazy dog.\nTODO: write more\n",
    "/docs/b.md": b"Foxes and dogs: a story of quick thinking and lazy afternoons. fox fox\n",
    "/src/app.py": b"def main():\n    return 'hello'  # TODO: greet the fox by name\n",
    "/notes/empty.txt": b"",
    "/notes/latin1.txt": "caf\xe9 na\xefve r\xe9sum\xe9 fox".encode("latin-1"),  # not UTF-8
    "/notes/unicode.txt": "Ærøskøbing straße 東京 naïve café 🦊 fox\n".encode(),
    "/long/manual.txt": _long_file(400).encode(),  # several chunks
}


def _files(corpus: dict[str, bytes] = CORPUS) -> list[SourceFile]:
    return [SourceFile(path, raw, len(raw), 1_000 + i, f"etag-{i}") for i, (path, raw) in enumerate(corpus.items())]


def _bm25_of(corpus: dict[str, bytes]) -> BM25Index:
    index = BM25Index(k1=K1, b=B)
    rows = []
    for path in sorted(corpus):
        for doc in file_documents(path, corpus[path]):
            rows.append((doc.id, doc.content, doc.metadata, doc.start_line_offset))
    index.add_many(rows)
    return index


def _segment_scores(segment: Segment, query: str) -> dict[str, float]:
    """BM25 from the segment's postings, as the reference adds it up (token by token)."""
    tokens = Tokenizer(TokenizeOptions())(query)
    n = segment.n_docs
    avgdl = segment.total_len / n
    lengths = segment.lengths.astype(np.float64)
    scores: dict[int, float] = {}
    for term in _term_hashes(tokens).tolist():
        slots, tfs = segment.postings(term)
        df = len(slots)
        if not df:
            continue
        idf = math.log((n - df + 0.5) / (df + 0.5) + 1)
        for slot, tf in zip(slots.tolist(), tfs.tolist(), strict=True):
            part = idf * (tf * (K1 + 1)) / (tf + K1 * (1 - B + B * (lengths[slot] / avgdl)))
            scores[slot] = scores.get(slot, 0.0) + part
    return {segment.doc_id(slot): score for slot, score in scores.items()}


def test_a_segment_holds_what_a_bm25_index_of_the_same_files_holds() -> None:
    segment = Segment.from_bytes(build_segment(reversed(_files())))
    index = _bm25_of(CORPUS)
    try:
        ids = index.ids()
        assert [segment.doc_id(slot) for slot in range(segment.n_docs)] == ids == segment.ids()
        assert len(ids) > len(CORPUS)  # the long file is chunked
        rows = index._con.execute(
            "SELECT d.id, d.len, d.start_line_offset, p.term, p.tf FROM bm25_postings p JOIN bm25_docs d USING (doc)"
        ).fetchall()
        expected = {(id, term, tf) for id, _, _, term, tf in rows}
        lengths = {id: length for id, length, _, _, _ in rows}
        starts = {id: start for id, _, start, _, _ in rows}
        found: set[tuple[str, int, int]] = set()
        for i, term in enumerate(segment.terms.tolist()):
            slots, tfs = segment.postings(term)
            assert list(slots) == sorted(slots)
            found.update((segment.doc_id(s), term, tf) for s, tf in zip(slots.tolist(), tfs.tolist(), strict=True))
            assert i == 0 or term > segment.terms[i - 1]
        assert found == expected
        for slot, id in enumerate(ids):
            content, metadata = index.get(id) or ("", None)
            assert segment.content(slot) == content
            assert segment.metadata(slot) == metadata
            assert segment.start_line(slot) == starts.get(id)
            assert segment.slot_of(id) == slot
            if id in lengths:
                assert int(segment.lengths[slot]) == lengths[id]
        assert segment.total_len == int(segment.lengths.sum()) == sum(
            len(Tokenizer(TokenizeOptions())(segment.content(s))) for s in range(segment.n_docs)
        )
        assert segment.metadata(segment.slot_of("/long/manual.txt#chunk-1") or 0) == {"source_file": "/long/manual.txt"}
        assert segment.slot_of("/nope") is None
        absent = segment.postings(12345)
        assert absent[0].size == 0 and absent[1].size == 0
        for query in ("quick fox", "fox fox lazy", "kernel socket buffer", "TODO", "café naïve", "東京", "nothing-here"):
            mine = _segment_scores(segment, query)
            theirs = {hit.id: hit.score for hit in index.search(query, top_k=1000)}
            assert mine.keys() == theirs.keys(), query
            for id, score in theirs.items():
                assert mine[id] == pytest.approx(score, rel=0, abs=1e-9), (query, id)
    finally:
        index.close()


def test_source_records_and_their_slots() -> None:
    segment = Segment.from_bytes(build_segment(_files()))
    records = segment.sources()
    assert list(records) == sorted(CORPUS)
    manual = records["/long/manual.txt"]
    raw = CORPUS["/long/manual.txt"]
    assert (manual.size, manual.chunks) == (len(raw), len(file_documents("/long/manual.txt", raw)))
    assert manual.etag == "etag-6" and manual.mtime_ns == 1_006 and len(manual.digest) == 64
    assert [segment.doc_id(s) for s in segment.slots_of_source("/long/manual.txt")] == [
        f"/long/manual.txt#chunk-{i}" for i in range(manual.chunks)
    ]
    assert segment.slots_of_source("/docs/a.md") == range(records["/docs/a.md"].first_slot, records["/docs/a.md"].first_slot + 1)
    assert segment.slots_of_source("/missing") == range(0)
    assert records["/notes/empty.txt"].chunks == 1 and segment.content(segment.slot_of("/notes/empty.txt") or 0) == ""
    assert "\ufffd" in segment.content(segment.slot_of("/notes/latin1.txt") or 0)
    none = Segment.from_bytes(build_segment([SourceFile("/x", b"hi", 2)]))
    assert none.sources()["/x"].etag is None


def test_the_layout_is_the_documented_one_and_the_bytes_are_deterministic() -> None:
    data = build_segment(_files(), tokenize={"stem": False, "min_length": 2})
    assert data == build_segment(reversed(_files()))  # order of input does not matter
    assert data[:8] == MAGIC
    (length,) = struct.unpack_from("<I", data, 8)
    header = json.loads(data[12 : 12 + length])
    assert header["format"] == "agentvfs-segment" and header["version"] == 2
    assert header["tokenize"] == TokenizeOptions().to_dict()
    assert header["docs"] == Segment.from_bytes(data).n_docs
    assert set(data[12 + length : min(a["offset"] for a in header["arrays"].values())]) <= {0}
    for name, array in header["arrays"].items():
        assert array["offset"] % ALIGN == 0, name
    assert Segment.from_bytes(data).name == segment_name(data)
    other = build_segment(_files(), tokenize={"stem": True})
    assert Segment.from_bytes(other).tokenize["stem"] == "english"
    assert segment_name(other) != segment_name(data)


def _without_postings(
    contents: list[bytes],
    *,
    ids: list[bytes] | None = None,
    lengths: list[int] | None = None,
    metadata: list[bytes] | None = None,
    start_lines: list[int] | None = None,
    has_start_line: list[int] | None = None,
) -> bytes:
    """A segment of documents (``/0``, ``/1``... unless ``ids``) holding ``contents`` as
    stored, and no terms."""
    n = len(contents)
    return encode_segment(
        tokenize=TokenizeOptions().to_dict(),
        terms=np.zeros(0, dtype=np.int64),
        starts=np.zeros(1, dtype=np.int64),
        slots=np.zeros(0, dtype=np.int32),
        tfs=np.zeros(0, dtype=np.int32),
        lengths=np.array(lengths or [0] * n, dtype=np.int32),
        ids=ids or [f"/{i}".encode() for i in range(n)],
        contents=contents,
        metadata=metadata or [b""] * n,
        start_lines=np.array(start_lines or [0] * n, dtype=np.int64),
        has_start_line=np.array(has_start_line or [0] * n, dtype=np.uint8),
    )


def test_a_version_1_segment_with_zlib_texts_is_read() -> None:
    texts = ["first text\nwith lazy words", "second text"]
    data = _without_postings(
        [zlib.compress(t.encode(), 1) for t in texts], ids=[b"/a", b"/b"], lengths=[4, 2], metadata=[b"", b'{"k": 1}'],
        start_lines=[0, 7], has_start_line=[0, 1],
    )  # fmt: skip
    (length,) = struct.unpack_from("<I", data, 8)
    header = json.loads(data[12 : 12 + length])
    assert header["version"] == 2
    old = json.dumps(dict(header, version=1), sort_keys=True, separators=(",", ":")).encode()
    data = data[:12] + old.ljust(length) + data[12 + length :]
    segment = Segment.from_bytes(data)
    assert segment.header["version"] == 1
    assert segment.document(0) == ("/a", texts[0], None, None)
    assert segment.document(1) == ("/b", texts[1], {"k": 1}, 7)
    assert [segment.content(i) for i in range(2)] == texts
    with pytest.raises(IndexError, match="slot 2 out of range"):
        segment.document(2)


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="given twice"):
        build_segment([SourceFile("/a", b"x", 1), SourceFile("/a", b"y", 1)])
    with pytest.raises(ValueError, match="must start with '/'"):
        build_segment([SourceFile("a.md", b"x", 1)])
    with SegmentBuilder() as builder:
        builder.add(SourceFile("/b", b"x", 1))
        with pytest.raises(ValueError, match="in path order: /a came after /b"):
            builder.add(SourceFile("/a", b"y", 1))
        assert builder.files == 1
        assert builder.finish() == build_segment([SourceFile("/b", b"x", 1)])
    empty = Segment.from_bytes(build_segment([]))
    assert (empty.n_docs, empty.total_len, empty.n_terms, empty.sources()) == (0, 0, 0, {})


def test_reopening_a_large_segment_takes_milliseconds(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(5000)]
    files = [
        SourceFile(f"/d{i // 1000}/f{i}.txt", " ".join(words[(i * 7 + k * 13) % 5000] for k in range(40)).encode(), 200)
        for i in range(20_000)
    ]
    data = build_segment(files)
    path = tmp_path / f"{segment_name(data)}.seg"
    path.write_bytes(data)
    best = math.inf
    for _ in range(5):
        started = time.perf_counter()
        segment = Segment.open(path)
        best = min(best, time.perf_counter() - started)
        assert segment.n_docs == 20_000
        segment.close()
    assert best < 0.02, f"opening took {best * 1000:.1f} ms"
    with Segment.open(path) as segment:
        assert segment.name == segment_name(data) and segment.path == str(path)
        assert segment.doc_id(19_999) == max(f.path for f in files)  # slots in path order
        assert segment.doc_id(segment.slot_of("/d19/f19999.txt") or 0) == "/d19/f19999.txt"
        slots, tfs = segment.postings(int(_term_hashes(["w7"])[0]))
        assert len(slots) == len(tfs) > 0 and Counter(tfs.tolist())


def _write(tmp_path: Path, data: bytes, name: str = "bad.seg") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_damaged_segments_raise_naming_the_file_and_the_fault(tmp_path: Path) -> None:
    data = build_segment(_files())
    (length,) = struct.unpack_from("<I", data, 8)
    header = json.loads(data[12 : 12 + length])
    cases = {
        "empty": (b"", "empty"),
        "short": (data[:5], "shorter than"),
        "magic": (b"NOTASEG!" + data[8:], "does not start with"),
        "truncated header": (data[: 12 + length // 2], "runs past the end"),
        "truncated": (data[: len(data) - 100], "outside the file"),
        "not json": (data[:12] + b"{" * length + data[12 + length :], "not JSON"),
    }
    for label, (bad, why) in cases.items():
        path = _write(tmp_path, bad, f"{label.replace(' ', '-')}.seg")
        with pytest.raises(SearchIndexError, match=why) as caught:
            Segment.open(path)
        assert str(path) in str(caught.value), label
    for key, value, why in (
        ("version", 3, "format version 3"),
        ("format", "something-else", "format 'something-else'"),
    ):
        changed = dict(header, **{key: value})
        encoded = json.dumps(changed, sort_keys=True, separators=(",", ":")).encode()
        encoded += b" " * (length - len(encoded))
        assert len(encoded) == length
        with pytest.raises(SearchIndexError, match=why):
            Segment.from_bytes(data[:12] + encoded + data[12 + length :])
    arrays = dict(header["arrays"])
    arrays["starts"] = dict(arrays["starts"], count=arrays["starts"]["count"] - 1)
    encoded = json.dumps(dict(header, arrays=arrays), sort_keys=True, separators=(",", ":")).encode()
    assert len(encoded) <= length
    with pytest.raises(SearchIndexError, match="'starts' has"):
        Segment.from_bytes(data[:12] + encoded.ljust(length) + data[12 + length :])


def test_a_segment_file_stays_readable_while_views_of_it_are_alive(tmp_path: Path) -> None:
    data = build_segment(_files())
    path = _write(tmp_path, data, f"{segment_name(data)}.seg")
    segment = Segment.open(path)
    lengths = segment.lengths
    segment.close()  # a view is still held: the mapping stays until it goes
    assert int(lengths.sum()) > 0
    os.unlink(path)


def test_a_published_text_that_expands_past_its_bound_is_refused_not_allocated(tmp_path: Path) -> None:
    """A forged segment's text (a zstd frame declaring gigabytes, one expanding to more than a
    document can hold, a zlib bomb, bytes that are no frame) fails its search with the
    segment named; the workspace's own checkpoints, which hold any text, are not bounded."""
    import zstandard

    big = b"a" * (2 << 20)
    blobs = [
        zstandard.ZstdCompressor().compress(big),  # declares 2 MiB
        zstandard.ZstdCompressor(write_content_size=False).compress(big),  # declares nothing
        zlib.compress(big),
        b"\x28\xb5\x2f\xfd garbage",
    ]
    data = _without_postings(blobs)
    name = segment_name(data)
    (tmp_path / "index" / "segments").mkdir(parents=True)
    (tmp_path / "index" / "segments" / f"{name}.seg").write_bytes(data)
    published = fetch_segment(str(tmp_path / "index"), name, tmp_path / "cache")
    for slot in range(len(blobs)):
        with pytest.raises(SearchIndexError, match=f"segment {name}: the text of document {slot} cannot be read"):
            published.document(slot)
    trusted = Segment.from_bytes(data)
    assert trusted.content(0) == trusted.content(1) == trusted.content(2) == big.decode()
