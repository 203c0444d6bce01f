"""Archives read with bounds: the tar reader (and zip check) of the adapters that restore a
workspace from an archive someone else made.

An archive handed to an adapter comes from storage or from an agent, so nothing in it is
trusted. CPython's :mod:`tarfile` trusts a header's sizes: a GNU long name or a pax header is
read whole, whatever size it declares (a 509 KiB gzip of long member names took 3.2 GiB), its
pax parsing backtracks quadratically before 3.11.10 (a 1 MiB header held the GIL, and so the
event loop, for minutes), and the members it has seen are kept. So no header is given to
:mod:`tarfile` here. :class:`TarReader` parses ustar, GNU and pax headers itself, one at a time,
and every size an archive declares is checked against a limit (:class:`TarLimits`) before
anything of that size is read:

- a member's name: at most ``max_name_bytes`` (4,096, the longest path Linux takes);
- the extended headers (pax, GNU long names) before one member: at most ``max_header_bytes``
  together (1 MiB), and at most :data:`MAX_EXTENDED_CHAIN` of them;
- all extended headers of the archive: at most ``max_metadata_bytes`` (64 MiB), a pax record
  counted as at least :data:`PAX_RECORD_COST` bytes, so that a header of many tiny records
  costs its parsing time too; each root entry (``./``) counts one block;
- members and the bytes of their content: ``max_members`` and ``max_extracted_bytes`` (the
  ``SandboxArchiveLimits`` of the OpenAI Agents SDK).

Pax records are walked by the lengths they start with (linear in the header), compressed
archives (gzip, bzip2, xz) are decompressed a bounded piece at a time, and the reader keeps
one header at a time: reading an archive of any size takes memory bounded by
``max_header_bytes`` plus the decompressor's (xz at most :data:`XZ_MEMORY_LIMIT`), and time in
proportion to the limits. A header past one is refused with :class:`ArchiveLimitError`
(naming the limit, the size found and the member), anything malformed with
:class:`ArchiveFormatError`.
"""

from __future__ import annotations

import bz2
import lzma
import os
import posixpath
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

__all__ = [
    "CHAIN_REASON",
    "EXTRACTED_REASON",
    "HEADER_REASON",
    "MAX_EXTENDED_CHAIN",
    "MAX_HEADER_BYTES",
    "MAX_METADATA_BYTES",
    "MAX_NAME_BYTES",
    "MAX_ZIP_EXTRA_FIELDS",
    "MEMBERS_REASON",
    "METADATA_REASON",
    "NAME_REASON",
    "PAX_RECORD_COST",
    "XZ_MEMORY_LIMIT",
    "ArchiveFormatError",
    "ArchiveLimitError",
    "TarLimits",
    "TarMember",
    "TarReader",
    "check_zip",
    "shown_name",
]

#: The longest member name read (bytes of UTF-8): Linux's PATH_MAX.
MAX_NAME_BYTES = 4096
#: The most bytes of extended headers (pax records, GNU long names) before one member.
MAX_HEADER_BYTES = 1 << 20
#: The most bytes of extended headers in one archive (see :data:`PAX_RECORD_COST`).
MAX_METADATA_BYTES = 64 << 20
#: What one pax record counts against ``max_metadata_bytes`` at least: parsing a record costs
#: about a microsecond whatever its length, so 64 MiB of five-byte records would cost seconds.
PAX_RECORD_COST = 64
#: The most extended headers in a row before one member (tarfile writes one, GNU tar up to
#: three: a long name, a long link name and a pax header).
MAX_EXTENDED_CHAIN = 8
#: The most memory an xz stream's decoder may ask for (``xz -9`` needs 65 MiB).
XZ_MEMORY_LIMIT = 256 << 20
#: The most fields in one zip entry's extra data (zip64, times, owner, a Unicode name, an
#: alignment pad: a handful); CPython 3.11 decodes them with a copy of the rest per field.
MAX_ZIP_EXTRA_FIELDS = 16

# The reasons a limit gives: the first two are those of the OpenAI Agents SDK's own
# extraction, so callers match one set of strings whichever side refused.
MEMBERS_REASON = "archive member count exceeds limit"
EXTRACTED_REASON = "archive extracted size exceeds limit"
NAME_REASON = "archive member name exceeds limit"
HEADER_REASON = "archive member header size exceeds limit"
METADATA_REASON = "archive metadata size exceeds limit"
CHAIN_REASON = "archive extended header chain exceeds limit"
EXTRA_REASON = "archive member extra fields exceed limit"

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
#: Compressed bytes read at a time, and the largest piece of decompressed output asked for.
_CHUNK = 1 << 20
_CHECKSUMS = (struct.Struct("148B8x356B"), struct.Struct("148b8x356b"))
#: Type flags: a regular file (``"\0"`` is the old one, ``"7"`` contiguous), a directory,
#: the extended headers, the links, and the types whose member carries no content.
_FILE_TYPES = frozenset(b"07\0")
_EXTENDED_TYPES = frozenset(b"xgXLK")
_NO_DATA_TYPES = frozenset(b"123456")
#: The pax keywords read (any other is walked over and ignored).
_PAX_KEYS = frozenset({b"path", b"size", b"linkpath"})
_GZIP_MAGIC = b"\x1f\x8b"
_BZIP2_MAGIC = b"BZh"
_XZ_MAGIC = b"\xfd7zXZ\x00"

MemberKind = Literal["file", "directory", "symlink", "hardlink", "other"]


def shown_name(name: str, limit: int = 200) -> str:
    """``name`` as an error shows it: at most ``limit`` characters, then how long it is."""
    return name if len(name) <= limit else f"{name[:limit]}... ({len(name)} characters)"


class ArchiveLimitError(ValueError):
    """An archive past one of its limits.

    Attributes
    ----------
    reason : str
        Which limit (``"archive member name exceeds limit"``...).
    limit, actual : int
        The limit and what the archive has (or declares) at the point it was passed.
    member : str or None
        The member it was passed at (shortened, see :func:`shown_name`).
    """

    def __init__(self, reason: str, *, limit: int, actual: int, member: str | None = None) -> None:
        self.reason = reason
        self.limit = limit
        self.actual = actual
        self.member = None if member is None else shown_name(member)
        where = "" if member is None else f" at member {self.member!r}"
        super().__init__(f"{reason}: {actual} > {limit}{where}")


class ArchiveFormatError(ValueError):
    """An archive that is not a tar this reader takes: damaged, truncated, not a tar at all,
    or with a member kind it does not read (GNU sparse files)."""


@dataclass(frozen=True, slots=True)
class TarLimits:
    """The limits of one archive read (see the module notes); None: no limit.

    Parameters
    ----------
    max_members : int or None
        Members (the root directory entry ``./`` not counted).
    max_extracted_bytes : int or None
        The content bytes the members declare, together.
    max_name_bytes : int
        The longest member name, in bytes.
    max_header_bytes : int
        The extended header bytes before one member.
    max_metadata_bytes : int
        The extended header bytes of the archive (each pax record counted as at least
        :data:`PAX_RECORD_COST`).
    """

    max_members: int | None = None
    max_extracted_bytes: int | None = None
    max_name_bytes: int = MAX_NAME_BYTES
    max_header_bytes: int = MAX_HEADER_BYTES
    max_metadata_bytes: int = MAX_METADATA_BYTES


@dataclass(frozen=True, slots=True)
class TarMember:
    """One member of a tar, as its headers describe it.

    Attributes
    ----------
    name : str
        Its name as stored (a pax or GNU long name when it has one; a directory's without
        its trailing ``/``), not checked: the caller decides what it may name.
    kind : str
        ``file``, ``directory``, ``symlink``, ``hardlink`` or ``other`` (a device, a FIFO,
        a type this reader does not know).
    size : int
        The bytes of its content (0 for a member without).
    """

    name: str
    kind: MemberKind
    size: int


# -- the bytes of the tar ------------------------------------------------------------------------


class _Source:
    """The tar bytes of an archive, decompressed a bounded piece at a time when it is a gzip,
    bzip2 or xz stream (what :mod:`tarfile`'s ``"r:*"`` reads), as they are read.

    ``archive`` must be seekable (a spooled copy): its first bytes tell the compression.
    """

    def __init__(self, archive: IO[bytes]) -> None:
        self._raw = archive
        start = archive.tell()
        head = archive.read(len(_XZ_MAGIC))
        archive.seek(start)
        self._plain = False
        self._make: Callable[[], _Decompressor]
        if head.startswith(_GZIP_MAGIC):
            self._make = lambda: _Decompressor("gzip")
        elif head.startswith(_BZIP2_MAGIC):
            self._make = lambda: _Decompressor("bzip2")
        elif head.startswith(_XZ_MAGIC):
            self._make = lambda: _Decompressor("xz")
        else:
            self._plain = True
            archive.seek(0, os.SEEK_END)
            self._end = archive.tell()
            archive.seek(start)
        self._decompressor = None if self._plain else self._make()
        self._input = b""
        self._ended = False

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes (fewer only at the end of the stream)."""
        if self._plain:
            return _read_full(self._raw, size)
        parts: list[bytes] = []
        wanted = size
        while wanted > 0 and not self._ended:
            piece = self._inflate(min(wanted, _CHUNK))
            parts.append(piece)
            wanted -= len(piece)
        return b"".join(parts)

    def skip(self, size: int, check: Callable[[], None] | None) -> int:
        """Pass over ``size`` bytes; the number passed (fewer only at the end)."""
        if self._plain:
            position = self._raw.tell()
            step = min(size, max(self._end - position, 0))
            self._raw.seek(position + step)
            return step
        passed = 0
        while passed < size and not self._ended:
            if check is not None:
                check()
            passed += len(self._inflate(min(size - passed, _CHUNK)))
        return passed

    def _inflate(self, size: int) -> bytes:
        """The next piece of decompressed bytes, at most ``size`` (b"" only at the end)."""
        assert self._decompressor is not None
        while True:
            decompressor = self._decompressor
            if decompressor.eof:
                # A stream may be several concatenated ones (gzip members, bzip2 and xz
                # streams); anything else after the first is trailing padding.
                rest = decompressor.unused_data + self._input
                if not rest:
                    rest = self._raw.read(_CHUNK)
                if not rest or not _starts_compressed(rest):
                    self._ended = True
                    return b""
                self._decompressor = self._make()
                self._input = rest
                continue
            data = self._input
            if not data and decompressor.needs_input:
                data = self._raw.read(_CHUNK)
            self._input = b""
            try:
                out = decompressor.decompress(data, size)
            except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
                raise ArchiveFormatError(f"the compressed archive is damaged: {exc}") from None
            self._input = decompressor.unconsumed
            if out:
                return out
            if not data and not decompressor.eof:
                # Given nothing, it made nothing: the file ends inside the stream (zlib may
                # still hold output when all input is used, so this asks it once first).
                raise ArchiveFormatError(
                    "the compressed archive is truncated: its stream ends before its end marker"
                )


def _starts_compressed(data: bytes) -> bool:
    return data.startswith((_GZIP_MAGIC, _BZIP2_MAGIC, _XZ_MAGIC))


class _Decompressor:
    """One compressed stream's decompressor, behind one interface for zlib, bz2 and lzma:
    ``decompress(data, size)`` gives at most ``size`` bytes, keeping what it did not use."""

    def __init__(self, kind: Literal["gzip", "bzip2", "xz"]) -> None:
        self._kind = kind
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS) if kind == "gzip" else None
        self._other: bz2.BZ2Decompressor | lzma.LZMADecompressor | None = None
        if kind == "bzip2":
            self._other = bz2.BZ2Decompressor()
        elif kind == "xz":
            self._other = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=XZ_MEMORY_LIMIT)
        #: Input given and not used yet (zlib hands it back; bz2 and lzma keep it inside).
        self.unconsumed = b""

    @property
    def eof(self) -> bool:
        if self._zlib is not None:
            return self._zlib.eof
        assert self._other is not None
        return self._other.eof

    @property
    def needs_input(self) -> bool:
        if self._zlib is not None:
            return not self.unconsumed
        assert self._other is not None
        return self._other.needs_input

    @property
    def unused_data(self) -> bytes:
        if self._zlib is not None:
            return self._zlib.unused_data
        assert self._other is not None
        return self._other.unused_data

    def decompress(self, data: bytes, size: int) -> bytes:
        if self._zlib is not None:
            out = self._zlib.decompress(data, size)
            self.unconsumed = self._zlib.unconsumed_tail
            return out
        assert self._other is not None
        return self._other.decompress(data, max_length=size)


def _read_full(stream: IO[bytes], size: int) -> bytes:
    """``size`` bytes of ``stream``, fewer only at its end (a read may return less)."""
    data = stream.read(size)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = stream.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


# -- headers -------------------------------------------------------------------------------------


def _string(field: bytes) -> bytes:
    """A NUL-terminated header field's bytes."""
    end = field.find(0)
    return field if end < 0 else field[:end]


def _number(field: bytes) -> int | None:
    """A numeric header field (octal, or GNU's base-256), None when it is neither."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * (len(field) - 1))) if field[0] == 0xFF else value
    text = _string(field).strip(b" ")
    if not text:
        return 0
    if not all(0x30 <= c <= 0x37 for c in text):
        return None
    return int(text, 8)


def _decode(raw: bytes) -> str:
    # As tarfile does (UTF-8; bytes that are not are kept as surrogates): a name is a name.
    return raw.decode("utf-8", "surrogateescape")


class TarReader:
    """The members of a tar, read with the bounds of ``limits`` (see the module notes).

    Iterate it (or call :meth:`next`) for the members in order; between two, :meth:`read`
    gives the content of the one last returned (what is not read is passed over). Every
    header is checked before it is used: the checksum, each size against the limits, the
    records of a pax header; the content is checked to be there in full as it is passed.

    Parameters
    ----------
    archive : binary file
        A seekable stream at the archive's start: a tar, or a gzip, bzip2 or xz of one.
    limits : TarLimits
        What the archive may hold.
    check : callable, optional
        Called between pieces of work (a header, a mebibyte of content): a caller in a
        worker thread passes ``anyio.from_thread.check_cancelled`` so that a cancelled
        restore stops reading.

    Raises
    ------
    ArchiveLimitError
        From :meth:`next` or :meth:`read`: the archive passes a limit.
    ArchiveFormatError
        From :meth:`next` or :meth:`read`: not a tar, damaged, truncated, or a GNU sparse
        member.
    """

    def __init__(
        self, archive: IO[bytes], limits: TarLimits, *, check: Callable[[], None] | None = None
    ) -> None:
        self._source = _Source(archive)
        self._limits = limits
        self._check = check
        self._offset = 0  # in the tar stream (decompressed), for messages
        self._members = 0
        self._extracted = 0
        self._metadata = 0
        self._left = 0  # content of the current member not read yet
        self._padding = 0  # then the zeros to its next block
        self._name = ""  # the current member, for messages
        self._global: dict[bytes, bytes] = {}  # a global pax header's path and size
        self._ended = False

    def __iter__(self) -> Iterator[TarMember]:
        while (member := self.next()) is not None:
            yield member

    # -- reading ---------------------------------------------------------------------------------

    def next(self) -> TarMember | None:
        """The next member, or None after the last one (the end-of-archive block, or the end
        of the stream at a header's place)."""
        if self._ended:
            return None
        self._pass(self._left + self._padding)
        self._left = self._padding = 0
        extended: dict[bytes, bytes] = {}
        long_name: bytes | None = None
        chain = header_bytes = 0
        while True:
            if self._check is not None:
                self._check()
            start = self._offset
            block = self._source.read(BLOCK)
            if not block:
                if start == 0:
                    raise ArchiveFormatError("the archive is empty: not a tar archive")
                if chain:
                    raise ArchiveFormatError(f"the archive ends after an extended header at offset {start - BLOCK}, before its member")
                self._ended = True
                return None
            if len(block) < BLOCK:
                raise ArchiveFormatError(f"the archive is truncated: the header at offset {start} has {len(block)} of {BLOCK} bytes")
            self._offset += BLOCK
            if block == _ZERO_BLOCK:
                if chain:
                    raise ArchiveFormatError(f"the archive ends after an extended header at offset {start - BLOCK}, before its member")
                self._ended = True
                return None
            typeflag, size, name = self._header(block, start)
            if typeflag in _EXTENDED_TYPES:
                chain += 1
                if chain > MAX_EXTENDED_CHAIN:
                    raise ArchiveLimitError(CHAIN_REASON, limit=MAX_EXTENDED_CHAIN, actual=chain)
                header_bytes += size
                self._check_header_size(typeflag, size, header_bytes)
                data = self._content(size, "an extended header")
                if typeflag in b"LK":
                    self._charge(max(size, PAX_RECORD_COST))
                    if typeflag == ord("L"):
                        long_name = _string(data)
                    continue
                records, count = _pax_records(data, start)
                self._charge(max(size, count * PAX_RECORD_COST))
                if any(key.startswith(b"GNU.sparse.") for key in records):
                    raise ArchiveFormatError(f"the member after offset {start} is a GNU sparse file, which is not read here; make the archive without --sparse")
                (self._global if typeflag == ord("g") else extended).update(
                    (key, value) for key, value in records.items() if key in _PAX_KEYS
                )
                continue
            if typeflag == ord("S"):
                raise ArchiveFormatError(f"member {shown_name(_decode(name))!r} is a GNU sparse file, which is not read here; make the archive without --sparse")
            return self._member(typeflag, size, name, long_name, extended)

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the current member's content (b"" once it is all read).

        Raises
        ------
        ArchiveFormatError
            The archive ends inside the content.
        """
        count = min(size, self._left)
        if count <= 0:
            return b""
        if self._check is not None:
            self._check()
        data = self._source.read(count)
        if len(data) < count:
            raise self._truncated(self._name)
        self._left -= count
        self._offset += count
        return data

    # -- parts -----------------------------------------------------------------------------------

    def _header(self, block: bytes, start: int) -> tuple[int, int, bytes]:
        """A header block's type flag, size and ustar name (with its prefix), checked."""
        stored = _number(block[148:156])
        if stored is None or all(stored != 256 + sum(form.unpack(block)) for form in _CHECKSUMS):
            if start == 0:
                raise ArchiveFormatError("not a tar archive: the first header's checksum is wrong")
            raise ArchiveFormatError(f"the archive is damaged: the header at offset {start} has a wrong checksum")
        size = _number(block[124:136])
        if size is None or size < 0:
            raise ArchiveFormatError(f"the archive is damaged: the header at offset {start} has an invalid size")
        name = _string(block[0:100])
        # POSIX ustar only: in GNU's old format these bytes hold times, not a prefix.
        if block[257:263] == b"ustar\x00":
            prefix = _string(block[345:500])
            if prefix:
                name = prefix + b"/" + name
        return block[156], size, name

    def _check_header_size(self, typeflag: int, size: int, header_bytes: int) -> None:
        """Refuse an extended header by the size it declares, before it is read."""
        limits = self._limits
        if typeflag in b"LK" and size > limits.max_name_bytes + 1:  # the name and its NUL
            raise ArchiveLimitError(NAME_REASON, limit=limits.max_name_bytes, actual=size - 1)
        if header_bytes > limits.max_header_bytes:
            raise ArchiveLimitError(HEADER_REASON, limit=limits.max_header_bytes, actual=header_bytes)
        if self._metadata + size > limits.max_metadata_bytes:
            raise ArchiveLimitError(METADATA_REASON, limit=limits.max_metadata_bytes, actual=self._metadata + size)

    def _charge(self, cost: int, member: str | None = None) -> None:
        self._metadata += cost
        limit = self._limits.max_metadata_bytes
        if self._metadata > limit:
            raise ArchiveLimitError(METADATA_REASON, limit=limit, actual=self._metadata, member=member)

    def _member(
        self,
        typeflag: int,
        size: int,
        name: bytes,
        long_name: bytes | None,
        extended: dict[bytes, bytes],
    ) -> TarMember:
        """The member a header block describes, with its extended headers applied, checked
        against the limits."""
        limits = self._limits
        raw = long_name
        if raw is None:
            raw = extended.get(b"path", self._global.get(b"path", name))
        decoded = _decode(raw)
        if len(raw) > limits.max_name_bytes:
            raise ArchiveLimitError(NAME_REASON, limit=limits.max_name_bytes, actual=len(raw), member=decoded)
        pax_size = extended.get(b"size", self._global.get(b"size"))
        if pax_size is not None:
            if not pax_size.isdigit():
                raise ArchiveFormatError(f"member {shown_name(decoded)!r} has an invalid pax size {pax_size[:40]!r}")
            size = int(pax_size)
        kind: MemberKind
        if typeflag in _FILE_TYPES:
            # The old format's directory: a file whose name ends with a slash.
            kind = "directory" if typeflag == 0 and decoded.endswith("/") else "file"
        elif typeflag == ord("5"):
            kind = "directory"
        elif typeflag == ord("1"):
            kind = "hardlink"
        elif typeflag == ord("2"):
            kind = "symlink"
        else:
            kind = "other"
        # As tarfile: content follows a file and a member of a type it does not know.
        content = kind == "file" or (kind == "other" and typeflag not in _NO_DATA_TYPES)
        if kind == "directory":
            decoded = decoded.rstrip("/") or decoded
            size = 0
        elif not content:
            size = 0
        if kind == "directory" and posixpath.normpath(decoded) == ".":
            # The root entry is no member of the SDK's counts: its block is metadata instead,
            # so that a stream of them is bounded too.
            self._charge(BLOCK, decoded)
        else:
            self._members += 1
            if limits.max_members is not None and self._members > limits.max_members:
                raise ArchiveLimitError(MEMBERS_REASON, limit=limits.max_members, actual=self._members, member=decoded)
        self._extracted += size
        if limits.max_extracted_bytes is not None and self._extracted > limits.max_extracted_bytes:
            raise ArchiveLimitError(
                EXTRACTED_REASON, limit=limits.max_extracted_bytes, actual=self._extracted, member=decoded
            )
        self._left = size
        self._padding = -size % BLOCK
        self._name = decoded
        return TarMember(decoded, kind, size)

    def _content(self, size: int, what: str) -> bytes:
        """An extended header's ``size`` bytes and the padding after them."""
        data = self._source.read(size) if size else b""
        if len(data) < size:
            raise ArchiveFormatError(f"the archive is truncated inside {what} at offset {self._offset}")
        self._offset += size
        self._pass(-size % BLOCK)
        return data

    def _pass(self, size: int) -> None:
        """Pass over ``size`` bytes of content and padding, checking they are there."""
        if size <= 0:
            return
        passed = self._source.skip(size, self._check)
        self._offset += passed
        if passed < size:
            raise self._truncated(self._name)

    def _truncated(self, name: str) -> ArchiveFormatError:
        return ArchiveFormatError(
            f"the archive is truncated: it ends inside the content of member {shown_name(name)!r} "
            f"(offset {self._offset})"
        )


def _pax_records(data: bytes, start: int) -> tuple[dict[bytes, bytes], int]:
    """The records of a pax header (``"%d %s=%s\\n"``, the number counting the whole record)
    that this reader uses, and how many records there are: one pass, each record found by
    its length, never by searching past it.

    Raises
    ------
    ArchiveFormatError
        A record that does not parse (the message names the header's offset).
    """
    found: dict[bytes, bytes] = {}
    count = position = 0
    end = len(data)
    while position < end:
        if data[position] == 0 and not data[position:].strip(b"\0"):
            break  # NUL padding inside the declared size, as some writers leave
        space = data.find(b" ", position, min(position + 21, end))
        digits = data[position:space] if space > position else b""
        length = int(digits) if digits.isdigit() else 0
        record_end = position + length
        equals = data.find(b"=", space + 1, record_end) if length else -1
        if (
            not digits.isdigit()
            or record_end > end
            or equals <= space + 1
            or data[record_end - 1] != 0x0A
        ):
            raise ArchiveFormatError(f"the archive is damaged: the pax header at offset {start} has a malformed record at byte {position}")
        key = data[space + 1 : equals]
        if key in _PAX_KEYS or key.startswith(b"GNU.sparse."):
            found[key] = data[equals + 1 : record_end - 1]
        count += 1
        position = record_end
    return found, count


# -- zip ------------------------------------------------------------------------------------------

_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_CENTRAL_SIGNATURE = b"PK\x01\x02"
_END64_SIGNATURE = b"PK\x06\x06"
#: The zip64 end record and its locator, between the central directory and the end record.
_END64_BYTES = 56 + 20


def check_zip(archive: IO[bytes], limits: TarLimits) -> None:
    """Refuse a zip whose central directory passes the limits, before :mod:`zipfile` reads it.

    :class:`zipfile.ZipFile` reads the whole central directory into memory and makes an
    object of each entry as it opens an archive, before a caller can count anything, and
    CPython 3.11 decodes an entry's extra data with a copy of what is left per field
    (quadratic in its length). So the directory is first found as zipfile finds it (its own
    end-record search) and walked here: at most ``max_metadata_bytes`` of it, ``max_members``
    entries (every entry counts), names of ``max_name_bytes`` and :data:`MAX_ZIP_EXTRA_FIELDS`
    extra fields each. What passes costs zipfile time and memory in proportion to those limits.

    Parameters
    ----------
    archive : binary file
        A seekable stream of the zip (read from its start, left anywhere).
    limits : TarLimits
        The limits (``max_extracted_bytes`` is the extraction's to check, on the sizes
        zipfile decodes).

    Raises
    ------
    ArchiveLimitError
        The central directory passes a limit.
    ArchiveFormatError
        Not a zip, or its central directory is damaged.
    """
    end_record: Callable[[IO[bytes]], list[Any] | None] | None = getattr(zipfile, "_EndRecData", None)
    if end_record is None:
        # Every CPython since 2.x has it; without it the directory could not be found alike.
        raise ArchiveFormatError("this Python's zipfile cannot be checked before it reads an archive; use a tar")
    try:
        end = end_record(archive)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ArchiveFormatError(f"not a zip archive: {exc}") from None
    if not end:
        raise ArchiveFormatError("not a zip archive: no end of central directory record")
    # As zipfile._RealGetContents places the directory (an archive may follow other bytes).
    signature, size, offset, location = end[0], end[5], end[6], end[9]
    start = offset + (location - size - offset) - (_END64_BYTES if signature == _END64_SIGNATURE else 0)
    if start < 0 or size < 0:
        raise ArchiveFormatError("the zip archive is damaged: its central directory lies before its start")
    if size > limits.max_metadata_bytes:
        raise ArchiveLimitError(METADATA_REASON, limit=limits.max_metadata_bytes, actual=size)
    archive.seek(start)
    directory = _read_full(archive, size)
    entries = position = 0
    while position < size:
        if position + _CENTRAL.size > len(directory):
            raise ArchiveFormatError("the zip archive is damaged: its central directory is truncated")
        fields = _CENTRAL.unpack_from(directory, position)
        if fields[0] != _CENTRAL_SIGNATURE:
            raise ArchiveFormatError(f"the zip archive is damaged: a central directory entry at byte {position} has no signature")
        name_length, extra_length, comment_length = fields[12], fields[13], fields[14]
        name_at = position + _CENTRAL.size
        name = directory[name_at : name_at + name_length].decode("utf-8", "surrogateescape")
        entries += 1
        if limits.max_members is not None and entries > limits.max_members:
            raise ArchiveLimitError(MEMBERS_REASON, limit=limits.max_members, actual=entries, member=name)
        if name_length > limits.max_name_bytes:
            raise ArchiveLimitError(NAME_REASON, limit=limits.max_name_bytes, actual=name_length, member=name)
        extra_at = name_at + name_length
        count = _extra_fields(directory, extra_at, extra_at + extra_length)
        if count > MAX_ZIP_EXTRA_FIELDS:
            raise ArchiveLimitError(EXTRA_REASON, limit=MAX_ZIP_EXTRA_FIELDS, actual=count, member=name)
        position = extra_at + extra_length + comment_length


def _extra_fields(data: bytes, start: int, end: int) -> int:
    """How many fields an entry's extra data holds (each a type, a length and its bytes),
    counted without copying; stops counting one past the limit."""
    count = 0
    while end - start >= 4 and count <= MAX_ZIP_EXTRA_FIELDS:
        start += 4 + int.from_bytes(data[start + 2 : start + 4], "little")
        count += 1
    return count
