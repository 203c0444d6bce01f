"""The bounded archive reader of the adapters (``agentvfs.integrations._archives``): it reads
what tar writers write as :mod:`tarfile` does, and refuses what passes a limit before reading it."""

from __future__ import annotations

import contextlib
import io
import random
import shutil
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any, cast

import pytest

from agentvfs.integrations._archives import (
    CHAIN_REASON,
    EXTRACTED_REASON,
    HEADER_REASON,
    MEMBERS_REASON,
    METADATA_REASON,
    NAME_REASON,
    ArchiveFormatError,
    ArchiveLimitError,
    TarLimits,
    TarReader,
    check_zip,
)
from agentvfs.testing._attacks_inputs import (
    long_name_tar,
    pax_backtracking_tar,
    tar_header,
    zip_extra_fields_bomb,
)
from agentvfs.testing._attacks_tools import peak_rss_growth

MIB = 1 << 20


def _ours(data: bytes, limits: TarLimits | None = None) -> list[tuple[str, str, int, bytes]]:
    reader = TarReader(io.BytesIO(data), limits or TarLimits())
    out: list[tuple[str, str, int, bytes]] = []
    for member in reader:
        parts = []
        while chunk := reader.read(100_000):
            parts.append(chunk)
        out.append((member.name, member.kind, member.size, b"".join(parts)))
    return out


def _tarfile(data: bytes) -> list[tuple[str, str, int, bytes]]:
    out: list[tuple[str, str, int, bytes]] = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            kind = (
                "file" if member.isreg() else "directory" if member.isdir() else "symlink" if member.issym()
                else "hardlink" if member.islnk() else "other"
            )  # fmt: skip
            source = tar.extractfile(member) if member.isreg() else None
            out.append((member.name, kind, member.size if member.isreg() else 0, source.read() if source else b""))
    return out


NAMES = ["a.txt", "dir", "dir/b.bin", "x" * 100, "p/" * 60 + "deep.txt", "uni/é€ü.txt", "empty", "link"]


def _written(fmt: int, compression: str) -> bytes:
    rng = random.Random(fmt)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=cast(Any, f"w:{compression}"), format=fmt) as tar:
        for index, name in enumerate(NAMES):
            if fmt == tarfile.USTAR_FORMAT and (not name.isascii() or ("/" not in name and len(name) > 100)):
                continue
            info = tarfile.TarInfo(name)
            if name == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif name == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "a.txt"
                tar.addfile(info)
            else:
                data = rng.randbytes(0 if name == "empty" else index * 70_000 + 3)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("compression", ["", "gz", "bz2", "xz"])
@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_the_reader_reads_what_tarfile_writes(fmt: int, compression: str) -> None:
    data = _written(fmt, compression)
    assert _ours(data) == _tarfile(data)


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar command here")
@pytest.mark.parametrize("options", [["--format=gnu"], ["--format=posix", "--xattrs", "-z"], ["--format=ustar", "-j"], ["--format=posix", "-J"]])
def test_the_reader_reads_what_gnu_tar_writes(options: list[str], tmp_path: Path) -> None:
    source = tmp_path / "src"
    deep = source / ("d" * 120) / "sub"
    deep.mkdir(parents=True)
    (deep / ("f" * 150)).write_bytes(b"deep\n")
    (source / "é").mkdir()
    (source / "é" / "ü.txt").write_bytes(b"u\n")
    (source / "big.bin").write_bytes(random.Random(1).randbytes(300_000))
    (source / "empty").touch()
    archive = tmp_path / "out.tar"
    names = ["big.bin", "empty", "é"] if "--format=ustar" in options else ["."]
    subprocess.run(["tar", *options, "-cf", str(archive), "-C", str(source), *names], check=True)
    data = archive.read_bytes()
    assert _ours(data) == _tarfile(data)


def test_a_long_name_is_refused_by_its_declared_size_before_it_is_read() -> None:
    bomb = long_name_tar(256 * MIB)  # 256 KiB of gzip
    with peak_rss_growth() as growth:
        started = time.monotonic()
        with pytest.raises(ArchiveLimitError) as caught:
            _ours(bomb)
        elapsed = time.monotonic() - started
    assert (caught.value.reason, caught.value.limit, caught.value.actual) == (NAME_REASON, 4096, 256 * MIB)
    assert str(caught.value) == "archive member name exceeds limit: 268435456 > 4096"
    assert growth[0] < 32 * MIB, f"refusing it took {growth[0] // MIB} MiB"
    assert elapsed < 2


def test_each_limit_names_itself_the_size_found_and_the_member() -> None:
    def pax(records: bytes) -> bytes:
        return tar_header(b"././@PaxHeader", len(records), b"x") + records + bytes(-len(records) % 512)

    def record(key: bytes, value: bytes) -> bytes:
        body = b" " + key + b"=" + value + b"\n"
        length = len(body) + 1
        while len(str(length)) + len(body) != length:
            length += 1
        return str(length).encode() + body

    end = bytes(1024)
    cases: list[tuple[bytes, TarLimits, str, int, int, str | None]] = [
        (pax(record(b"path", b"n" * 5000)) + tar_header(b"x", 0) + end, TarLimits(), NAME_REASON, 4096, 5000, "n" * 200 + "... (5000 characters)"),
        (tar_header(b"././@PaxHeader", 2 * MIB, b"x"), TarLimits(), HEADER_REASON, MIB, 2 * MIB, None),
        (pax(b"") * 9 + tar_header(b"x", 0) + end, TarLimits(), CHAIN_REASON, 8, 9, None),
        (pax(record(b"comment", b"c" * 3000)) * 2 + tar_header(b"x", 0) + end, TarLimits(max_metadata_bytes=5000), METADATA_REASON, 5000, 6028, None),
        (b"".join(tar_header(b"f%d" % i, 0) for i in range(4)) + end, TarLimits(max_members=3), MEMBERS_REASON, 3, 4, "f3"),
        (tar_header(b"big", 5 * MIB) + tar_header(b"small", 1), TarLimits(max_extracted_bytes=4 * MIB), EXTRACTED_REASON, 4 * MIB, 5 * MIB, "big"),
    ]
    for data, limits, reason, limit, actual, member in cases:
        with pytest.raises(ArchiveLimitError) as caught:
            _ours(data, limits)
        found = caught.value
        assert (found.reason, found.limit, found.actual, found.member) == (reason, limit, actual, member), reason
    # Root entries are no members, but each costs a block of the metadata budget.
    roots = b"".join(tar_header(b"./", 0, b"5") for _ in range(20)) + end
    assert _ours(roots, TarLimits(max_members=1)) == [(".", "directory", 0, b"")] * 20
    with pytest.raises(ArchiveLimitError, match=METADATA_REASON):
        _ours(roots, TarLimits(max_metadata_bytes=10 * 512))


def test_many_tiny_pax_records_cost_their_parsing_time_in_the_budget() -> None:
    """A record counts at least 64 bytes: 64 MiB of five-byte records would take seconds to
    walk; the budget stops them at a million, a second's work."""
    records = b"5 a=\n" * (MIB // 5)
    header = tar_header(b"././@PaxHeader", len(records), b"x") + records + bytes(-len(records) % 512)
    one = header + tar_header(b"f", 0)
    started = time.monotonic()
    with pytest.raises(ArchiveLimitError) as caught:
        _ours(one * 6 + bytes(1024))
    assert time.monotonic() - started < 5
    # Five headers pass (13 MiB each); the sixth is refused by its declared size, unread.
    assert caught.value.reason == METADATA_REASON
    assert caught.value.actual == 5 * (MIB // 5) * 64 + len(records)
    assert len(_ours(one * 5 + bytes(1024))) == 5


def test_a_pax_header_tarfile_backtracks_on_is_refused_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(ArchiveFormatError, match="the pax header at offset 0 has a malformed record at byte 0"):
        _ours(pax_backtracking_tar(MIB))  # tarfile before 3.11.10: half an hour
    assert time.monotonic() - started < 1


def test_damaged_truncated_and_unknown_archives_are_format_errors() -> None:
    good = _written(tarfile.PAX_FORMAT, "")
    damaged = bytearray(good)
    damaged[513] ^= 0xFF  # in the first member's content: tar keeps no checksum of it
    cases = {
        b"": "the archive is empty",
        b"plain text, not an archive" * 40: "not a tar archive: the first header's checksum is wrong",
        good[:700]: "it ends inside the content of member",
        good[: 1024 + 300]: "the header at offset 1024 has 300 of 512 bytes",
        _written(tarfile.PAX_FORMAT, "gz")[:100_000]: "the compressed archive is truncated",
        tar_header(b"sparse", 0, b"S") + bytes(1024): "is a GNU sparse file",
        tar_header(b"././@PaxHeader", 0, b"x"): "the archive ends after an extended header",
    }
    for data, message in cases.items():
        with pytest.raises(ArchiveFormatError, match=message):
            _ours(data)
    assert len(_ours(bytes(damaged))) == len(_ours(good))  # content is not checked, only its length
    rng = random.Random(7)
    for compression in ("", "gz", "xz"):
        data = _written(tarfile.PAX_FORMAT, compression)
        for trial in range(200):
            bad = bytearray(data)
            if trial % 2:
                del bad[rng.randrange(len(bad)) :]
            else:
                for _ in range(3):
                    bad[rng.randrange(len(bad))] = rng.randrange(256)
            # Anything but these fails the test.
            with contextlib.suppress(ArchiveFormatError, ArchiveLimitError):
                _ours(bytes(bad))


def _zip(**options: int) -> bytes:
    buffer = io.BytesIO(b"prepended bytes (a self-extractor's stub) " * options.get("prefix", 0))
    buffer.seek(0, io.SEEK_END)
    with zipfile.ZipFile(buffer, "a" if options.get("prefix") else "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.comment = b"a comment" * options.get("comment", 0)
        for index in range(options.get("files", 3)):
            with archive.open(f"dir/f{index}.txt", "w", force_zip64=bool(options.get("zip64"))) as member:
                member.write(b"content %d\n" % index)
    return buffer.getvalue()


def test_check_zip_passes_what_zipfile_writes_and_refuses_bombs_before_zipfile_reads_them() -> None:
    for options in ({}, {"zip64": 1}, {"comment": 1000}, {"prefix": 100}, {"files": 0}):
        data = _zip(**options)
        check_zip(io.BytesIO(data), TarLimits(max_members=3))
        assert len(zipfile.ZipFile(io.BytesIO(data)).infolist()) == options.get("files", 3)
    bomb = zip_extra_fields_bomb(100)
    started = time.monotonic()
    with pytest.raises(ArchiveLimitError, match=r"archive member extra fields exceed limit: 17 > 16 at member 'f000000.txt'"):
        check_zip(io.BytesIO(bomb), TarLimits())
    assert time.monotonic() - started < 1
    with pytest.raises(ArchiveLimitError, match=MEMBERS_REASON):
        check_zip(io.BytesIO(_zip(files=4)), TarLimits(max_members=3))
    with pytest.raises(ArchiveLimitError, match=METADATA_REASON):
        check_zip(io.BytesIO(_zip(files=20)), TarLimits(max_metadata_bytes=1000))
    long_name = io.BytesIO()
    with zipfile.ZipFile(long_name, "w") as archive:
        archive.writestr("n" * 5000, b"x")
    with pytest.raises(ArchiveLimitError, match=NAME_REASON):
        check_zip(long_name, TarLimits())
    for data in (b"", b"not a zip at all" * 10, _zip()[:-30]):
        with pytest.raises(ArchiveFormatError):
            check_zip(io.BytesIO(data), TarLimits())
