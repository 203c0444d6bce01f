"""Attacks through what a workspace reads from outside: archives an adapter restores, the MCP
server's standard input, and a published search index in storage the agent can write.

Each input is made the way an agent (or anyone who can write the storage) makes it: an
archive planted where the host's snapshot store keeps snapshots, a line written to the MCP
server, a manifest written with ``write_file`` next to the index. A workspace must answer in
bounded time and memory whatever it is given, and refuse with an error that names the limit;
memory is checked as the growth of the process's peak RSS (see ``_attacks_tools``), time with
an event loop ticking meanwhile.

The makers of hostile archives (:func:`long_name_tar`, :func:`pax_backtracking_tar`,
:func:`zip_extra_fields_bomb`) and :func:`timed` are also what the project's own tests use.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from ._adversary import Arena, attack
from ._attacks_tools import MAX_LOOP_GAP, RSS_BOUND, TIME_SLACK, peak_rss_growth

__all__ = [
    "long_name_tar",
    "pax_backtracking_tar",
    "tar_header",
    "timed",
    "zip_extra_fields_bomb",
]

MIB = 1 << 20


# -- hostile inputs --------------------------------------------------------------------------------


def tar_header(name: bytes, size: int, typeflag: bytes = b"0") -> bytes:
    """One ustar header block naming ``name`` (its first 100 bytes) with ``size`` bytes of
    content and the type ``typeflag``, its checksum right."""
    block = bytearray(512)
    block[0:100] = name[:100].ljust(100, b"\0")
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"%011o\0" % 0
    block[148:156] = b" " * 8
    block[156:157] = typeflag
    block[257:265] = b"ustar\x0000"
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def long_name_tar(name_bytes: int) -> bytes:
    """A gzip tar of one file whose GNU long name is ``name_bytes`` bytes: about a
    thousandth of that compressed (512 MiB of name in 509 KiB)."""
    out = io.BytesIO()
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out.write(packer.compress(tar_header(b"././@LongLink", name_bytes + 1, b"L")))
    piece = b"a" * MIB
    left = name_bytes
    while left:
        step = min(left, len(piece))
        out.write(packer.compress(piece[:step]))
        left -= step
    padding = -(name_bytes + 1) % 512
    out.write(packer.compress(b"\0" * (1 + padding)))
    out.write(packer.compress(tar_header(b"a" * 100, 0) + bytes(1024)))
    out.write(packer.flush())
    return out.getvalue()


def pax_backtracking_tar(digits: int) -> bytes:
    """A tar of one file whose pax header is ``digits`` digits and no record: CPython's
    tarfile before 3.11.10 searches it for ``hdrcharset`` with a pattern that backtracks
    quadratically (64 KiB: 8 s holding the GIL; 1 MiB: half an hour)."""
    data = b"1" * digits
    padding = -digits % 512
    return (
        tar_header(b"././@PaxHeader", digits, b"x") + data + bytes(padding)
        + tar_header(b"f.txt", 0) + bytes(1024)
    )  # fmt: skip


def zip_extra_fields_bomb(entries: int, fields: int = 16_000) -> bytes:
    """A zip of ``entries`` empty files, each with ``fields`` empty extra fields (4 bytes each)
    in its central directory entry: CPython 3.11's zipfile copies the rest of the extra data
    per field as it opens the archive (quadratic: about 0.1 s per entry)."""
    extra = b"\xff\xff\0\0" * fields
    local = bytearray()
    central = bytearray()
    for index in range(entries):
        name = b"f%06d.txt" % index
        offset = len(local)
        local += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name
        central += struct.pack(
            "<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 0, 0, 0, 0, len(name), len(extra), 0, 0, 0, 0, offset
        ) + name + extra  # fmt: skip
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, entries, entries, len(central), len(local), 0)
    return bytes(local + central + end)


@contextlib.asynccontextmanager
async def timed() -> AsyncIterator[list[float]]:
    """Time the body beside a task ticking every 10 ms: ``box[0]`` is then the seconds the
    body took and ``box[1]`` the longest the event loop went without running that task."""
    box = [0.0, 0.0]
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await anyio.sleep(0.01)

    started = time.monotonic()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(ticker)
            try:
                yield box
            finally:
                group.cancel_scope.cancel()
    finally:
        box[0] = time.monotonic() - started
        ticks.append(time.monotonic())
        box[1] = max((b - a for a, b in itertools.pairwise(ticks)), default=box[0])


# -- archives --------------------------------------------------------------------------------------


def _isolation() -> str:
    """The sandbox client's isolation: no command runs here, so none where bubblewrap cannot
    (an unprivileged run without user namespaces)."""
    from ..sandbox import detect_isolation

    return "bwrap" if detect_isolation()["available"] else "none"


async def _restored(arena: Arena, planted: bytes, *, what: str, reason: str) -> None:
    """Restore ``planted`` as the host restores a snapshot the agent could write (a tar in a
    snapshot store under the workspace): refused, naming ``reason``, in bounded time and
    memory, with the event loop running, and nothing written."""
    from agents.sandbox.errors import WorkspaceArchiveWriteError

    from ..integrations.openai_agents import AgentVFSSandboxClient, FsspecSnapshotStore
    from ..vfs import LocalFilesystem

    store_dir = arena.root / "snapshots"
    store_dir.mkdir(exist_ok=True)
    (store_dir / "planted.tar").write_bytes(planted)
    target = arena.root / "restored"
    target.mkdir(exist_ok=True)
    store = FsspecSnapshotStore(LocalFilesystem(str(store_dir)))
    client = AgentVFSSandboxClient(LocalFilesystem(str(target)), isolation=_isolation())
    live = await client.create()  # not started: hydration works on the storage directly
    refused: BaseException | None = None
    try:
        with peak_rss_growth() as growth:
            async with timed() as clock:
                stream = await store.download("planted")
                try:
                    await live._inner.hydrate_workspace(stream)
                except WorkspaceArchiveWriteError as exc:
                    refused = exc
                finally:
                    stream.close()
    finally:
        await client.delete(live)
    arena.record(growth[0] < RSS_BOUND, f"{what}: peak RSS grew by {growth[0] / MIB:.0f} MiB (bound {RSS_BOUND // MIB} MiB)")
    arena.record(clock[0] < TIME_SLACK, f"{what}: took {clock[0]:.1f} s")
    arena.record(clock[1] <= MAX_LOOP_GAP, f"{what}: the event loop stalled for {clock[1]:.2f} s")
    arena.record(reason in str(refused), f"{what}: answered {refused!r:.300}, not {reason!r}")
    arena.record(not any(target.iterdir()), f"{what}: wrote {sorted(p.name for p in target.iterdir())[:5]}")


@attack(
    "archive_long_member_names",
    finding="hydrate_workspace of a 509 KiB gzip tar whose GNU long name is 512 MiB took 3.2 GiB of memory",
    severity="medium",
)
async def archive_long_member_names(arena: Arena) -> None:
    await _restored(
        arena, long_name_tar(256 * MIB), what="a 256 MiB long name", reason="archive member name exceeds limit: 268435456 > 4096"
    )


@attack(
    "archive_pax_header_backtracking",
    finding="hydrate_workspace of a tar whose pax header is 1 MiB of digits held the event loop for over 120 s (tarfile's pax regex, before 3.11.10)",
    severity="medium",
)
async def archive_pax_header_backtracking(arena: Arena) -> None:
    # 64 KiB: 8 s of backtracking where tarfile parses it (20 on a busy machine).
    await _restored(arena, pax_backtracking_tar(64 * 1024), what="a pax header of 64 KiB of digits", reason="malformed record")


@attack(
    "archive_zip_extra_fields",
    finding="extract() of a zip whose entries carry thousands of extra fields: zipfile decodes each entry's in quadratic time before any limit is checked",
    severity="low",
)
async def archive_zip_extra_fields(arena: Arena) -> None:
    from agents.sandbox.errors import WorkspaceArchiveWriteError

    from ..integrations.openai_agents import AgentVFSSandboxClient
    from ..vfs import LocalFilesystem

    client = AgentVFSSandboxClient(LocalFilesystem(str(arena.root)), isolation=_isolation())
    live = await client.create()
    refused: BaseException | None = None
    try:
        async with timed() as clock:
            try:
                await live._inner.extract("bomb.zip", io.BytesIO(zip_extra_fields_bomb(100)))
            except WorkspaceArchiveWriteError as exc:
                refused = exc
    finally:
        await client.delete(live)
    what = "a zip of 100 entries with 16,000 extra fields each"
    arena.record(clock[0] < TIME_SLACK, f"{what}: took {clock[0]:.1f} s")
    arena.record(clock[1] <= MAX_LOOP_GAP, f"{what}: the event loop stalled for {clock[1]:.2f} s")
    # The count stops one past the limit: a bomb is not walked to its end either.
    reason = "archive member extra fields exceed limit: 17 > 16"
    arena.record(reason in str(refused), f"{what}: answered {refused!r:.300}")
    arena.record(not any(p.name.startswith("f0") for p in arena.root.iterdir()), f"{what}: extracted members")


# -- the MCP server's standard input -----------------------------------------------------------------


class _McpPipe:
    """An ``agentvfs mcp`` server as a subprocess, spoken to a line at a time (blocking: run
    it in a worker thread)."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentvfs", "mcp", "--root", str(root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.call({"method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "attacker", "version": "1"},
        }}, 1)  # fmt: skip
        self.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode())

    def write(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def call(self, request: Mapping[str, Any], id: int) -> dict[str, Any]:
        self.write(json.dumps({"jsonrpc": "2.0", "id": id, **request}).encode())
        return self.answer()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        return dict(json.loads(line)) if line else {}

    def peak(self) -> int:
        """The server's peak RSS so far (VmHWM), in bytes."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _long_lines(root: Path, record: Callable[[bool, str], bool]) -> None:
    """A 32 MiB line under the limit, read in linear time; an 80 MiB request past it,
    answered with an error in bounded time and memory; the server still serving after."""
    server = _McpPipe(root)
    try:
        started = time.monotonic()
        server.write(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"' + b"x" * (32 * MIB) + b'"}}')
        pong = server.call({"method": "ping"}, 2)
        elapsed = time.monotonic() - started
        record(pong.get("result") == {}, f"ping after a 32 MiB line answered {pong!r:.200}")
        record(elapsed < 2 * TIME_SLACK, f"a 32 MiB line took {elapsed:.1f} s to read (quadratic: 6.4 s)")
        before = server.peak()
        started = time.monotonic()
        content = "y" * (80 * MIB)
        refused = server.call({"method": "tools/call", "params": {"name": "write_file", "arguments": {"path": "big.txt", "content": content}}}, 3)
        elapsed = time.monotonic() - started
        message = str(refused.get("error", {}).get("message", ""))
        record("past this server's limit of 67108864 bytes" in message, f"an 80 MiB request was answered {refused!r:.300}")
        record(elapsed < 2 * TIME_SLACK, f"an 80 MiB request took {elapsed:.1f} s to answer")
        grown = server.peak() - before
        record(grown < RSS_BOUND, f"an 80 MiB request grew the server's peak RSS by {grown // MIB} MiB")
        pong = server.call({"method": "ping"}, 4)
        record(pong.get("result") == {}, f"ping after the refused request answered {pong!r:.200}")
        record(not (root / "big.txt").exists(), "the refused request wrote big.txt")
    finally:
        code = server.close()
    record(code == 0, f"the server exited with {code} when its stdin closed")


@attack(
    "mcp_stdin_long_lines",
    finding="the MCP server read stdin lines in quadratic time with no cap: 8/16/32 MiB lines took 0.4/1.6/6.4 s",
    severity="low",
)
async def mcp_stdin_long_lines(arena: Arena) -> None:
    await anyio.to_thread.run_sync(_long_lines, arena.root, arena.record)


# -- a published index in storage the agent can write ---------------------------------------------


@contextlib.asynccontextmanager
async def _attached(arena: Arena, index: Path) -> AsyncIterator[tuple[Any, BaseException | None]]:
    """A host workspace on ``root/src`` that attaches the published ``index`` (its segment
    cache and own index in a host directory of its own): ``(workspace, None)`` once started
    and attached (at its first search), or ``(None, error)`` when it did not."""
    from ..vfs import LocalFilesystem
    from ..workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="agentvfs-host-") as host:
        workspace = Workspace(
            filesystem=LocalFilesystem(str(arena.root / "src")),
            bm25=True,
            index_dir=os.path.join(host, "index"),
            search_index_url=str(index),
            search_index_options={"cache_dir": os.path.join(host, "segments"), "refresh_interval": 3600},
        )
        try:
            await workspace.init()
            await workspace.search("kernel", top_k=1)
        except Exception as exc:
            await workspace.destroy()
            yield None, exc
            return
        try:
            yield workspace, None
        finally:
            await workspace.destroy()


async def _publish(arena: Arena) -> Path:
    """The host publishes an index of ``root/src`` at ``root/index``, where the agent can write."""
    from ..search import build_index

    for name in ("a.md", "b.md", "c.md"):
        await arena.tool("write_file", path=f"src/{name}", content=f"kernel socket notes {name}\n")
    index = arena.root / "index"
    await anyio.to_thread.run_sync(lambda: build_index(str(arena.root / "src"), str(index)))
    return index


async def _forge_with_tools(arena: Arena, index: Path, changes: Callable[[dict[str, Any]], None]) -> None:
    """A newer manifest, written by the agent with ``write_file``."""
    newest = max((index / "manifests").glob("*.json"))
    body = json.loads(newest.read_text())
    body["number"] = int(newest.stem) + 1
    changes(body)
    out = await arena.tool("write_file", path=f"index/manifests/{body['number']:010d}.json", content=json.dumps(body))
    if not (index / "manifests" / f"{body['number']:010d}.json").exists():
        raise RuntimeError(f"the agent's write_file did not write the manifest: {out}")


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that takes no disk (where there is no shell to make one)."""
    with open(path, "wb") as made:
        made.truncate(size)


async def _searched(arena: Arena, workspace: Any, what: str) -> None:
    hits = await workspace.search("kernel socket", top_k=10)
    arena.record(len(hits) == 3, f"{what}: the search found {len(hits)} of the 3 published files")


@attack(
    "published_index_missing_segment",
    finding="a newer manifest naming a missing segment stopped every workspace from starting; no fallback to the last good manifest",
    severity="low",
)
async def published_index_missing_segment(arena: Arena) -> None:
    index = await _publish(arena)

    def missing(body: dict[str, Any]) -> None:
        body["segments"][0]["name"] = "f" * 64

    await _forge_with_tools(arena, index, missing)
    await _forge_with_tools(arena, index, lambda body: body.update(tokenize={"stem": True, "forged": 1}))
    async with _attached(arena, index) as (workspace, error):
        what = "two newer manifests, one naming a missing segment"
        arena.record(workspace is not None, f"{what}: the workspace did not start: {error}")
        if workspace is not None:
            await _searched(arena, workspace, what)
            shared = workspace._search.shared
            arena.record(shared.manifest.number == 1, f"{what}: manifest {shared.manifest.number} in use, not 1")


@attack(
    "published_index_huge_segment",
    finding="a 700 MiB fake segment was read whole into memory (793 MiB peak) and kept in the segment cache",
    severity="low",
)
async def published_index_huge_segment(arena: Arena) -> None:
    index = await _publish(arena)
    segments = index / "segments"
    # The agent makes 700 MiB that cost no disk, and manifests naming it: at its own size,
    # at the size of the segment it replaces, and at 2 GiB.
    huge = 700 * MIB
    names = {"claimed": "a" * 64, "smaller": "b" * 64, "larger": "c" * 64}
    for name in names.values():
        out = await arena.sh(f"truncate -s {huge} index/segments/{name}.seg && echo made")
        if "made" not in out:
            await anyio.to_thread.run_sync(_sparse, segments / f"{name}.seg", huge)
    for key, size in (("claimed", huge), ("smaller", 4096), ("larger", 2 << 30)):

        def point(body: dict[str, Any], name: str = names[key], size: int = size) -> None:
            body["segments"][0].update(name=name, bytes=size)

        await _forge_with_tools(arena, index, point)
    what = "manifests naming a 700 MiB fake segment"
    with peak_rss_growth() as growth:
        async with _attached(arena, index) as (workspace, error):
            arena.record(workspace is not None, f"{what}: the workspace did not start: {error}")
            if workspace is not None:
                await _searched(arena, workspace, what)
                shared = workspace._search.shared
                arena.record(shared.manifest.number == 1, f"{what}: manifest {shared.manifest.number} in use, not 1")
                cached = sorted(os.listdir(shared.cache_dir))
                arena.record(not any(name + ".seg" in cached for name in names.values()), f"{what}: the cache kept {cached}")
    arena.record(growth[0] < RSS_BOUND, f"{what}: peak RSS grew by {growth[0] // MIB} MiB (bound {RSS_BOUND // MIB} MiB)")
