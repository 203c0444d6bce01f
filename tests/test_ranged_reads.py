"""Ranged reads through signed URLs (``agentvfs.vfs.backend.ranged``): on the S3 and GCS emulators
through ``FsspecFilesystem.read_range``, and against a scripted HTTP server for every answer
that must send the read back to fsspec."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FileNotFound, FileTooLarge, FsspecFilesystem, IsDirectory
from agentvfs.bench._backends import find_s3rver
from agentvfs.testing import FakeGcsServer, MotoServer
from agentvfs.vfs import ObjectStoreBackend, PosixAttributes
from agentvfs.vfs._ranged import SignedRangeReader, signed_range_reader
from conftest import GCS_BUCKET, S3_BUCKET, unique
from test_fsspec_backend import _count_s3_calls

pytestmark = pytest.mark.anyio

DATA = bytes(range(256)) * 4096  # 1 MiB, every offset distinguishable
BIG = os.urandom(5 << 20)  # served for paths under /big


def _check_ranges(read: Callable[[int, int], bytes]) -> None:
    size = len(DATA)
    for start, end in [(0, 1), (0, 4096), (12345, 678901), (size - 10, size), (size - 10, size + 500), (0, size)]:
        assert read(start, end) == DATA[start:end], (start, end)


@pytest.mark.s3
async def test_s3_ranges_go_through_signed_urls(moto: MotoServer) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    fs = FsspecFilesystem(raw, root=f"{S3_BUCKET}/{unique('rr')}")
    await fs.write_file("d/big.bin", DATA)
    await fs.mkdir("d/sub")
    assert isinstance(fs.backend, ObjectStoreBackend) and fs.backend.ranged is not None
    calls = _count_s3_calls(raw)
    pieces: dict[tuple[int, int], bytes] = {}
    for start, end in [(0, 1), (0, 4096), (12345, 678901), (len(DATA) - 10, len(DATA)), (len(DATA) - 10, len(DATA) + 500)]:
        pieces[(start, end)] = await fs.read_range("d/big.bin", start, end)
    assert calls == []  # not one request through s3fs: each range was one plain GET
    assert all(data == DATA[start:end] for (start, end), data in pieces.items())
    # What the signed URL cannot answer goes through s3fs, with its errors.
    assert await fs.read_range("d/big.bin", len(DATA) + 1, len(DATA) + 10) == b""
    with pytest.raises(FileNotFound):
        await fs.read_range("d/missing.bin", 0, 10)
    with pytest.raises(IsDirectory):
        await fs.read_range("d/sub", 0, 10)
    assert "get_object" in calls or "head_object" in calls
    # Straight into a caller's buffer, and fewer bytes at the end of the file.
    calls.clear()
    buffer = bytearray(300_000)
    assert await fs.read_range_into("d/big.bin", 5000, memoryview(buffer)) == 300_000
    assert buffer == DATA[5000:305_000]
    assert await fs.read_range_into("d/big.bin", len(DATA) - 7, memoryview(buffer)) == 7
    assert buffer[:7] == DATA[-7:]
    assert calls == []
    # Whole files: one GET each, no HEAD first.
    await fs.write_file("d/empty.bin", b"")
    calls.clear()
    assert await fs.read_file("d/big.bin") == DATA
    assert await fs.read_file("d/empty.bin") == b""
    assert calls == []
    with pytest.raises(FileNotFound):
        await fs.read_file("d/missing.bin")
    with pytest.raises(IsDirectory):
        await fs.read_file("d/sub")
    # Batches (read_many, grep): one GET each; a missing file is reported as missing.
    calls.clear()
    many = await fs.read_many(["d/big.bin", "d/empty.bin", "d/missing.bin"])
    assert many["d/big.bin"] == DATA and many["d/empty.bin"] == b""
    assert isinstance(many["d/missing.bin"], FileNotFound)
    assert [c for c in calls if c != "list_objects_v2"] == ["get_object"]  # only the missing one
    # With max_bytes: one ranged GET of the limit and one byte, never the whole object.
    calls.clear()
    capped = await fs.read_many(["d/big.bin", "d/empty.bin", "d/missing.bin"], max_bytes=1000)
    assert isinstance(capped["d/big.bin"], FileTooLarge) and capped["d/empty.bin"] == b""
    assert isinstance(capped["d/missing.bin"], FileNotFound)
    assert (await fs.read_many(["d/big.bin"], max_bytes=len(DATA)))["d/big.bin"] == DATA
    calls.clear()
    await fs.write_file("d/needle.txt", "hay\nneedle here\nhay\n")
    calls.clear()
    found = await fs.grep("needle", "d")
    assert [(r.path, len(r.matches)) for r in found] == [("d/needle.txt", 1)]
    assert "get_object" not in calls  # the files were read through their URLs
    calls.clear()
    # Names that URLs must escape.
    for name in ("d/a b+c%20ü?x#y.bin", "d/~!$&'()*,;=@.bin"):
        await fs.write_file(name, name.encode())
        calls.clear()
        assert await fs.read_range(name, 2, 9) == name.encode()[2:9]
        assert await fs.read_file(name) == name.encode()
        assert calls == []
    # A file replaced reads as the new bytes at once (the URL names the key, not a version).
    await fs.write_file("d/big.bin", b"replaced")
    assert await fs.read_range("d/big.bin", 0, 100) == b"replaced"


@pytest.mark.s3
def test_s3_settings_a_url_cannot_carry_keep_reads_in_s3fs(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert signed_range_reader(moto.s3fs()) is not None
    assert signed_range_reader(moto.s3fs(requester_pays=True)) is None
    assert signed_range_reader(moto.s3fs(s3_additional_kwargs={"SSECustomerAlgorithm": "AES256"})) is None
    assert signed_range_reader(moto.s3fs(config_kwargs={"proxies": {"http": "http://127.0.0.1:9"}})) is None
    assert signed_range_reader(MemoryFileSystem(skip_instance_cache=True)) is None
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.delenv("no_proxy", raising=False)
    assert signed_range_reader(moto.s3fs()) is None  # the proxy would be bypassed


@pytest.mark.gcs
async def test_gcs_ranges_go_through_the_media_url(fake_gcs: FakeGcsServer) -> None:
    raw = fake_gcs.gcsfs()
    fs = FsspecFilesystem(raw, root=f"{GCS_BUCKET}/{unique('rr')}")
    data = DATA[: 512 * 1024]  # a larger body makes aiohttp warn on the upload
    await fs.write_file("big.bin", data)
    assert isinstance(fs.backend, ObjectStoreBackend) and fs.backend.ranged is not None
    fetched: list[str] = []
    original = raw.cat_file

    def counting(path: str, *args: Any, **kwargs: Any) -> Any:
        fetched.append(path)
        return original(path, *args, **kwargs)

    raw.cat_file = counting
    for start, end in [(0, 1), (12345, 478901), (len(data) - 10, len(data) + 500)]:
        assert await fs.read_range("big.bin", start, end) == data[start:end]
    weird = "a b+c%20ü?x#y.bin"
    await fs.write_file(weird, weird.encode())
    assert await fs.read_range(weird, 2, 9) == weird.encode()[2:9]
    assert await fs.read_file(weird) == weird.encode()
    assert await fs.read_file("big.bin") == data
    assert fetched == []
    assert await fs.read_range("big.bin", len(data), len(data) + 10) == b""  # nothing left there
    with pytest.raises(FileNotFound):
        await fs.read_range("missing.bin", 0, 10)


# -- a scripted server for the answers a real store rarely gives ---------------------------


class _Script:
    """What the server does with each request, and what it saw."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.connections: set[tuple[str, int]] = set()
        self.refuse_first = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: _Script

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _refused(self, seen: str) -> bool:
        """Note the request (as ``seen``); refuse it while the script says so."""
        script = self.script
        script.paths.append(seen)
        script.headers.append(dict(self.headers))
        script.connections.add(self.client_address)
        if script.refuse_first <= 0:
            return False
        script.refuse_first -= 1
        self._send(403, b"expired" if self.command == "GET" else b"", {})
        return True

    def do_GET(self) -> None:
        if self._refused(self.path):
            return
        script = self.script
        mode = script.mode
        data = BIG if self.path.startswith("/big") else DATA
        if "Range" not in self.headers:  # a whole-file GET
            if mode == "gzip":  # a store that transcodes what it stored compressed
                self._send(200, data, {"Content-Encoding": "gzip"})
            elif mode == "chunked":  # no length given
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data[:100]), data[:100]))
            elif mode == "missing":
                self._send(404, b"<Error>NoSuchKey</Error>", {})
            else:
                self._send(200, data, {})
            return
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        assert match is not None
        start, last = int(match[1]), min(int(match[2]), len(data) - 1)
        body = data[start : last + 1]
        if mode == "whole":  # a server that ignores Range
            self._send(200, data, {})
        elif mode == "wrong-range":
            self._send(206, body, {"Content-Range": f"bytes {start + 1}-{last + 1}/{len(data)}"})
        elif mode == "short":  # promises more than it sends, then hangs up
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{last}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
        elif mode == "stall":  # sends half, then nothing for longer than the reader waits
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{last}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            time.sleep(3)
            self.close_connection = True
        elif mode == "close-after":  # answers, then closes the kept-alive connection
            self._send(206, body, {"Content-Range": f"bytes {start}-{last}/{len(data)}"})
            self.close_connection = True
        elif mode == "missing":
            self._send(404, b"<Error>NoSuchKey</Error>", {})
        else:
            self._send(206, body, {"Content-Range": f"bytes {start}-{last}/{len(data)}"})

    def do_HEAD(self) -> None:
        if self._refused("HEAD " + self.path):
            return
        status = {"missing": 404, "error": 500, "redirect": 307}.get(self.script.mode, 200)
        self.send_response(status)
        if status == 200:
            self.send_header("ETag", '"e1"')
            self.send_header("Last-Modified", "Wed, 02 Dec 2026 10:00:00 GMT")
            self.send_header("X-Amz-Meta-Mode", "33261")
        self.send_header("Content-Length", str(len(DATA)) if status == 200 else "0")
        self.end_headers()

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def scripted() -> Iterator[tuple[_Script, str]]:
    script = _Script()
    handler = type("Handler", (_Handler,), {"script": script})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield script, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _reader(base: str, signed: list[str] | None = None, **kwargs: Any) -> SignedRangeReader:
    def sign(path: str, fresh: bool) -> tuple[str, dict[str, str]]:
        if signed is not None:
            signed.append(path)
        return f"{base}/{path}?sig={len(signed or [])}", {"Authorization": "Bearer t"}

    def sign_head(path: str, fresh: bool) -> tuple[str, dict[str, str]]:
        if signed is not None:
            signed.append("HEAD " + path)
        return f"{base}/{path}?head={len(signed or [])}", {}

    return SignedRangeReader(sign, timeout=5.0, sign_head=sign_head, **kwargs)


def test_ranges_and_kept_alive_connections(scripted: tuple[_Script, str]) -> None:
    script, base = scripted
    signed: list[str] = []
    reader = _reader(base, signed, reuse=60.0)
    _check_ranges(lambda start, end: reader.read("obj", start, end) or b"")
    assert len(script.connections) == 1  # one connection carried every request
    assert signed == ["obj"]  # one signature, reused
    assert all(h["Authorization"] == "Bearer t" for h in script.headers)
    assert reader.read("obj", 10, 10) is None and len(script.paths) == 6  # nothing to ask
    reader.close()


def test_a_connection_the_server_closed_is_replaced(scripted: tuple[_Script, str]) -> None:
    script, base = scripted
    reader = _reader(base)
    script.mode = "close-after"
    for start in (0, 100, 200):
        assert reader.read("obj", start, start + 50) == DATA[start : start + 50]
    assert len(script.connections) == 3


@pytest.mark.parametrize("mode", ["whole", "wrong-range", "short", "missing"])
def test_answers_other_than_the_range_go_back_to_fsspec(scripted: tuple[_Script, str], mode: str) -> None:
    script, base = scripted
    reader = _reader(base)
    script.mode = mode
    assert reader.read("obj", 10, 20) is None
    script.mode = "ok"
    assert reader.read("obj", 10, 20) == DATA[10:20]  # the reader is still usable


def test_a_refused_url_is_signed_again_once(scripted: tuple[_Script, str]) -> None:
    script, base = scripted
    signed: list[str] = []
    reader = _reader(base, signed, reuse=60.0)
    assert reader.read("obj", 0, 10) == DATA[:10]
    script.refuse_first = 1  # the cached URL has expired
    assert reader.read("obj", 0, 10) == DATA[:10]
    assert signed == ["obj", "obj"] and script.paths[-1].endswith("sig=2")
    script.refuse_first = 2  # refused however signed: fsspec says why
    assert reader.read("obj", 0, 10) is None
    assert len(signed) == 3  # the cached URL refused, then the new one


def test_a_failing_signer_goes_back_to_fsspec() -> None:
    def sign(path: str, fresh: bool) -> tuple[str, dict[str, str]]:
        raise RuntimeError("no credentials")

    assert SignedRangeReader(sign).read("obj", 0, 10) is None
    # A URL that is not plain HTTP is not read here either.
    assert SignedRangeReader(lambda p, fresh: ("ftp://127.0.0.1/x", {})).read("obj", 0, 10) is None


def test_an_unreachable_endpoint_rests_the_reader() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    signed: list[str] = []
    reader = _reader(f"http://127.0.0.1:{port}", signed)
    for _ in range(3):
        assert reader.read("obj", 0, 10) is None
    assert len(signed) == 3
    assert reader.read("obj", 0, 10) is None
    assert len(signed) == 3  # resting: not even signed, straight to fsspec


def test_https_uses_the_configured_trust(moto: MotoServer, tmp_path: Any) -> None:
    # An https endpoint gets a verifying context; a CA bundle that does not exist means the
    # reads stay with s3fs rather than verifying against the wrong roots.
    raw = moto.s3fs(client_kwargs={"verify": os.fspath(tmp_path / "missing.pem")})
    assert signed_range_reader(raw) is None
    reader = signed_range_reader(moto.s3fs(client_kwargs={"verify": False}))
    assert reader is not None and reader._ssl is not None and not reader._ssl.check_hostname


def test_read_into_fills_the_buffer_and_stops_at_the_end(scripted: tuple[_Script, str]) -> None:
    script, base = scripted
    reader = _reader(base)
    buffer = bytearray(b"\xff" * 1000)
    assert reader.read_into("obj", 777, memoryview(buffer)) == 1000
    assert buffer == DATA[777:1777]
    assert reader.read_into("obj", len(DATA) - 10, memoryview(buffer)) == 10
    assert buffer[:10] == DATA[-10:] and buffer[10:] == DATA[787:1777]  # the rest untouched
    script.mode = "short"
    assert reader.read_into("obj", 0, memoryview(buffer)) is None


def test_large_bodies_land_in_the_buffer_from_the_socket(scripted: tuple[_Script, str]) -> None:
    # From 256 KiB on a body is read by the socket itself into the buffer (MSG_WAITALL), after
    # what http.client had buffered with the headers; the connection then carries the next
    # request as before.
    script, base = scripted
    reader = _reader(base)
    buffer = bytearray(len(DATA))
    assert reader.read_into("obj", 100, memoryview(buffer)) == len(DATA) - 100
    assert buffer[: len(DATA) - 100] == DATA[100:]
    assert reader.read_into("obj", 0, memoryview(buffer)[: 300 * 1024]) == 300 * 1024
    assert buffer[: 300 * 1024] == DATA[: 300 * 1024]
    assert reader.read("obj", 5, 50) == DATA[5:50]
    assert len(script.connections) == 1  # one kept-alive connection for all three
    script.mode = "short"  # the server hangs up halfway: fsspec reads it instead
    assert reader.read_into("obj", 0, memoryview(buffer)) is None
    script.mode = "ok"
    assert reader.read_into("obj", 1, memoryview(buffer)[: 512 * 1024]) == 512 * 1024
    assert buffer[: 512 * 1024] == DATA[1 : 512 * 1024 + 1]


def test_bodies_of_several_mib_wake_the_reader_in_steps(scripted: tuple[_Script, str]) -> None:
    # Beyond the first MiB the socket wakes its thread every 512 KiB (SO_RCVLOWAT), the last
    # 512 KiB with the default: every length and offset lands whole, and the connection is
    # kept with its default for the next, small, read.
    script, base = scripted
    reader = _reader(base)
    buffer = bytearray(len(BIG))
    for start, size in ((0, len(BIG)), (7, 3 << 20), (1, (1 << 20) + 1), (12345, len(BIG) - 12345)):
        assert reader.read_into("big", start, memoryview(buffer)[:size]) == size
        assert buffer[:size] == BIG[start : start + size]
    assert reader.read("big", 3, 9) == BIG[3:9]
    assert len(script.connections) == 1
    script.mode = "short"
    assert reader.read_into("big", 0, memoryview(buffer)) is None
    script.mode = "stall"
    reader = SignedRangeReader(lambda path, fresh: (f"{base}/{path}", {}), timeout=0.5)
    started = time.monotonic()
    assert reader.read_into("big", 0, memoryview(buffer)) is None
    assert time.monotonic() - started < 2.5


def test_a_large_body_that_stalls_times_out(scripted: tuple[_Script, str]) -> None:
    # The socket blocks while it fills the buffer, with the reader's timeout as its own.
    script, base = scripted
    reader = SignedRangeReader(lambda path, fresh: (f"{base}/{path}", {}), timeout=0.5)
    script.mode = "stall"
    buffer = bytearray(len(DATA))
    started = time.monotonic()
    assert reader.read_into("obj", 0, memoryview(buffer)) is None
    assert time.monotonic() - started < 2.5
    script.mode = "ok"
    assert reader.read_into("obj", 0, memoryview(buffer)) == len(DATA) and buffer == DATA


async def test_read_into_without_a_native_way_copies(tmp_path: Any) -> None:
    # A filesystem without signed URLs (memory) reads the range and copies it in.
    from agentvfs.vfs._base import read_range_into

    raw = MemoryFileSystem(skip_instance_cache=True)
    fs = FsspecFilesystem(raw, root=f"/{unique('ri')}")
    await fs.write_file("f.bin", DATA[:5000])
    buffer = bytearray(4000)
    assert await read_range_into(fs, "f.bin", 3000, memoryview(buffer)) == 2000
    assert buffer[:2000] == DATA[3000:5000]


def test_whole_files_in_one_get(scripted: tuple[_Script, str]) -> None:
    script, base = scripted
    reader = _reader(base)
    assert reader.read_whole("obj") == DATA
    assert "Range" not in script.headers[-1]
    assert reader.read_whole("obj") == DATA and len(script.connections) == 1  # kept alive
    for mode in ("gzip", "chunked", "missing"):
        script.mode = mode
        assert reader.read_whole("obj") is None, mode
    script.mode = "ok"
    assert reader.read_whole("obj") == DATA


def test_heads_answer_the_headers_or_go_back_to_fsspec(scripted: tuple[_Script, str]) -> None:
    script, base = scripted
    signed: list[str] = []
    reader = _reader(base, signed, reuse=60.0)
    headers = reader.head("obj")
    assert headers is not None
    assert headers["etag"] == '"e1"' and headers["x-amz-meta-mode"] == "33261"
    assert headers["content-length"] == str(len(DATA))
    assert reader.head("obj") is not None and signed == ["HEAD obj"]  # its own URL, reused
    assert reader.read("obj", 0, 10) == DATA[:10] and signed == ["HEAD obj", "obj"]  # a GET's is another
    assert len(script.connections) == 1  # the HEADs and the GET shared one connection
    script.mode = "missing"
    with pytest.raises(FileNotFoundError):
        reader.head("gone")
    for mode in ("error", "redirect"):
        script.mode = mode
        assert reader.head("obj") is None, mode
    script.mode = "ok"
    script.refuse_first = 1  # the cached URL has expired: signed again, once
    assert reader.head("obj") is not None and signed.count("HEAD obj") == 2
    script.refuse_first = 2
    assert reader.head("obj") is None
    # A store without signed HEADs (GCS lists its metadata) never asks.
    asked = len(script.paths)
    assert SignedRangeReader(lambda p, fresh: (f"{base}/{p}", {})).head("obj") is None
    assert len(script.paths) == asked
    reader.close()


@pytest.mark.s3
async def test_s3_stat_goes_through_a_signed_head(moto: MotoServer) -> None:
    # A mount stats each file an S3 listing shows it first (the listing has no metadata):
    # one plain HEAD each, answering what s3fs's HEAD answers.
    raw = moto.s3fs(use_listings_cache=False)
    fs = FsspecFilesystem(raw, root=f"{S3_BUCKET}/{unique('hd')}")
    backend = fs.backend
    assert isinstance(backend, ObjectStoreBackend) and backend.ranged is not None
    names = ["d/plain.txt", "d/a b+c%20ü?x#y.txt", "d/~!$&'()*,;=@.txt"]
    for name in names:
        await fs.write_file(name, name.encode())
    await fs.mkdir("d/sub")
    await fs.set_attributes("d/plain.txt", PosixAttributes(mode=0o100750, uid=12, gid=34, mtime_ns=10**18))
    ranged = backend.ranged
    calls = _count_s3_calls(raw)
    signed = {name: await fs.stat(name) for name in names}
    assert calls == []
    backend.ranged = None  # the same through s3fs
    try:
        through_s3fs = {name: await fs.stat(name) for name in names}
    finally:
        backend.ranged = ranged
    assert calls == ["head_object"] * len(names)
    assert signed == through_s3fs
    assert signed["d/plain.txt"].mode == 0o750 and signed["d/plain.txt"].uid == 12
    assert signed["d/plain.txt"].metadata == through_s3fs["d/plain.txt"].metadata
    # Not a file: the HEAD answers 404 and the directory is found as before.
    calls.clear()
    assert (await fs.stat("d/sub")).type == "directory"
    with pytest.raises(FileNotFound):
        await fs.stat("d/missing.txt")


def _same_url(make: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    """Two URLs signed one after the other, retried until they fall in the same second (a
    signature covers the time it was made)."""
    for _ in range(5):
        ours, theirs = make()
        if ours == theirs:
            break
    return ours, theirs


@pytest.mark.s3
@pytest.mark.parametrize(
    "options",
    [
        {},  # a custom endpoint: botocore presigns with signature version 2
        {"config_kwargs": {"signature_version": "s3v4"}},
        {"token": "session-token", "config_kwargs": {"signature_version": "s3v4"}},
        {"endpoint_url": None, "client_kwargs": {"region_name": "eu-west-1"}},  # virtual-hosted, v2
        {
            "endpoint_url": None,
            "client_kwargs": {"region_name": "eu-west-1"},
            "config_kwargs": {"signature_version": "s3v4", "s3": {"addressing_style": "virtual"}},
        },
        {"anon": True},
    ],
)
def test_urls_signed_here_are_the_urls_s3fs_signs(options: dict[str, Any], moto: MotoServer) -> None:
    # Only the key differs from one URL of a bucket to the next: the URLs built on a template
    # must be byte for byte the ones s3fs (botocore's presigner) makes.
    import s3fs

    from agentvfs.vfs._ranged import _S3Signer

    kwargs: dict[str, Any] = {"key": "testing", "secret": "testing", "endpoint_url": moto.endpoint_url, **options}
    if kwargs.pop("anon", False):
        kwargs = {"anon": True, "endpoint_url": moto.endpoint_url}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **kwargs)
    signer = _S3Signer(fs)
    keys = ["first.txt", "d/a b+c%20ü?x#y.txt", "d/~!$&'()*,;=@.txt", "d/東京/ünï.bin", "d//double", "e/x y/"]
    for method, client_method in (("GET", "get_object"), ("HEAD", "head_object")):
        for key in keys:
            path = f"{S3_BUCKET}/{key}"
            def both(p: str = path, m: str = method, c: str = client_method) -> tuple[str, str]:
                return signer.url(p, m), str(fs.url(p, expires=3600, client_method=c))

            ours, theirs = _same_url(both)
            if key.endswith("/"):
                assert ours == theirs  # s3fs strips the slash: the template is not used for it
            else:
                assert ours == theirs, (method, key)
        template = signer._templates[(S3_BUCKET, method)]
        assert template is not None  # the URLs were built here, not asked of s3fs


@pytest.mark.s3
def test_urls_signed_here_go_back_to_s3fs_after_refusals(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentvfs.vfs._ranged import _S3Signer

    fs = moto.s3fs()
    asked: list[str] = []
    url = fs.url

    def counting(path: str, **kwargs: Any) -> str:
        asked.append(path)
        return str(url(path, **kwargs))

    monkeypatch.setattr(fs, "url", counting)
    signer = _S3Signer(fs)
    for i in range(3):
        signer.url(f"{S3_BUCKET}/k{i}", "GET")
    assert asked == [f"{S3_BUCKET}/k0"]  # the template; the others were signed here
    for i in range(3):  # three refused URLs: each signed again by s3fs
        signer.url(f"{S3_BUCKET}/r{i}", "GET", fresh=True)
    assert len(asked) == 4
    signer.url(f"{S3_BUCKET}/after", "GET")
    assert asked[-1] == f"{S3_BUCKET}/after"  # from now on s3fs signs every URL


@contextlib.contextmanager
def _s3rver(tmp_path: Any) -> Iterator[Any]:
    """An s3fs filesystem on an s3rver of its own with the bucket ``signed``."""
    import s3fs

    from agentvfs.bench._backends import S3rverServer

    exe = find_s3rver()
    assert exe is not None
    with S3rverServer(exe, str(tmp_path / "data"), "signed") as server:
        yield s3fs.S3FileSystem(
            key="S3RVER", secret="S3RVER", endpoint_url=server.endpoint_url,
            skip_instance_cache=True, use_listings_cache=False,
        )  # fmt: skip


@pytest.mark.s3
@pytest.mark.skipif(find_s3rver() is None, reason="s3rver not installed (scripts/setup.sh installs it)")
def test_urls_signed_here_are_accepted_by_a_server_that_checks_signatures(tmp_path: Any) -> None:
    # moto takes any signature; s3rver checks those of version 2 (what botocore presigns with
    # for a custom endpoint), not those of version 4, which the test above proves equal to
    # botocore's own.
    with _s3rver(tmp_path) as fs:
        names = ["a.txt", "d/a b+c%20ü?x#y.txt", "d/~!$&'()*,;=@.txt", "d/東京.bin"]
        for name in names:
            fs.pipe_file(f"signed/{name}", name.encode(), Metadata={"mode": "33188"})
        reader = signed_range_reader(fs)
        assert reader is not None
        asked: list[str] = []
        url = fs.url

        def counting(path: str, **kwargs: Any) -> str:
            asked.append(path)
            return str(url(path, **kwargs))

        fs.url = counting
        for name in names:
            assert reader.read_whole(f"signed/{name}") == name.encode(), name
            headers = reader.head(f"signed/{name}")
            assert headers is not None and headers["x-amz-meta-mode"] == "33188", name
            assert headers["content-length"] == str(len(name.encode()))
        assert asked == ["signed/a.txt", "signed/a.txt"]  # the templates (GET, HEAD); the rest signed here
        # The server does refuse a bad signature: the test above can fail.
        good = fs.url("signed/a.txt", expires=3600)
        bad = re.sub(r"(Signature=)[^&]+", r"\1AAAA", good)
        assert bad != good
        status = _status(bad)
        assert status == 403, status
        with pytest.raises(FileNotFoundError):
            reader.head("signed/missing.txt")
        reader.close()


def _status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


def _listing_key(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(
        (r["name"], r["type"], r["size"], r.get("ETag"), r["LastModified"].timestamp() if r.get("LastModified") else None,
         r.get("StorageClass"))
        for r in records
    )  # fmt: skip


LISTED_NAMES = [
    "a.txt", "sp ace.txt", "plus+sign.txt", "pct%20.txt", "amp&<>'\".txt", "ünï 東京.txt", "d1/x", "d2/y/z", "d3/",
]  # fmt: skip


def _check_signed_listings(fs: Any, root: str, dirs: list[str]) -> None:
    backend = FsspecFilesystem(fs, root=root).backend
    assert isinstance(backend, ObjectStoreBackend)
    sent = _count_s3_calls(fs)
    for rel in dirs:
        signed = backend._list_signed(rel)  # type: ignore[attr-defined]
        assert signed is not None, rel
        assert sent == [], sent  # not through s3fs
        fs.invalidate_cache()
        expected = fs.ls(backend.bpath(rel), detail=True)
        sent.clear()
        assert _listing_key(signed) == _listing_key(expected), rel
    # An empty or missing directory is for s3fs to tell apart.
    assert backend._list_signed("no-such-dir") is None  # type: ignore[attr-defined]
    assert not backend._signed_listing_off  # type: ignore[attr-defined]
    assert backend.ranged is not None
    backend.ranged.close()


@pytest.mark.s3
def test_s3_listings_through_signed_urls_are_s3fs_listings(moto: MotoServer) -> None:
    # What a mount lists, parsed here in place of botocore: the same records as s3fs's ls,
    # awkward names (URL-encoded by the server, decoded here), markers, and several pages.
    fs = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('lists')}"
    fs.pipe({f"{root}/{name}": name.encode() for name in LISTED_NAMES})
    fs.pipe({f"{root}/many/f{i:05d}": b"x" * (i % 5) for i in range(2100)})
    _check_signed_listings(fs, root, ["", "d1", "d2", "d3", "many"])


@pytest.mark.s3
@pytest.mark.skipif(find_s3rver() is None, reason="s3rver not installed (scripts/setup.sh installs it)")
def test_s3_listings_signed_here_are_accepted_by_s3rver(tmp_path: Any) -> None:
    with _s3rver(tmp_path) as fs:
        fs.pipe({f"signed/root/{name}": name.encode() for name in LISTED_NAMES if not name.endswith("/")})
        _check_signed_listings(fs, "signed/root", ["", "d1", "d2"])


@pytest.mark.s3
def test_a_listing_answer_not_understood_goes_to_s3fs_from_then_on(moto: MotoServer) -> None:
    fs = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('lists')}"
    fs.pipe_file(f"{root}/a.txt", b"a")

    class NotAListing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>a captive portal</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotAListing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        backend = FsspecFilesystem(fs, root=root).backend
        assert isinstance(backend, ObjectStoreBackend) and backend.ranged is not None
        backend.ranged.sign_list = lambda bucket, params: f"http://127.0.0.1:{server.server_address[1]}/{bucket}?list"
        sent = _count_s3_calls(fs)
        assert [r["name"].rsplit("/", 1)[-1] for r in backend.list_raw("", "")] == ["a.txt"]
        assert sent == ["list_objects_v2"]
        assert backend._signed_listing_off  # type: ignore[attr-defined]
        backend.list_raw("", "")
        assert sent == ["list_objects_v2", "list_objects_v2"]  # not asked of the server again
        backend.ranged.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_listing_page_without_etags_gives_no_version() -> None:
    # As botocore: what a page leaves out is left out; an empty ETag is no version.
    from agentvfs.vfs._object_store import _parse_list_page

    body = (
        b'<?xml version="1.0"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<IsTruncated>false</IsTruncated><Contents><Key>p/a.txt</Key>"
        b"<LastModified>2026-12-05T08:00:39.000Z</LastModified><ETag></ETag><Size>3</Size></Contents>"
        b"<CommonPrefixes><Prefix>p/d/</Prefix></CommonPrefixes></ListBucketResult>"
    )
    page = _parse_list_page(body, "bkt")
    assert page is not None
    records, token = page
    assert token is None
    assert [(r["name"], r["type"]) for r in records] == [("bkt/p/d", "directory"), ("bkt/p/a.txt", "file")]
    assert "ETag" not in records[1] and "StorageClass" not in records[1] and records[1]["size"] == 3
    assert _parse_list_page(b"<html>no</html>", "bkt") is None
    assert _parse_list_page(body.replace(b"<IsTruncated>false", b"<IsTruncated>true"), "bkt") is None  # no token
