"""The ``agentvfs`` command."""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import anyio
import anyio.to_thread

from ._procs import pid_alive

__all__ = ["main"]


async def _demo(storage: str, out: list[str]) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    from . import FsspecFilesystem, LocalFilesystem, Workspace, WorkspaceReadOnlyError

    def say(line: str = "") -> None:
        out.append(line)
        print(line, flush=True)

    def section(title: str) -> None:
        say()
        say(f"-- {title}")

    if storage == "memory":
        raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
        fs = FsspecFilesystem(raw, root="/demo", display_name="demo (memory)")
        tmp = None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="agentvfs-demo-")
        fs = LocalFilesystem(tmp.name)
    try:
        say(f"== agentvfs demo on {storage} storage")
        say("Lines marked (expected) show an error the workspace is meant to raise there.")
        section("files through the API")
        async with Workspace(filesystem=fs, name="demo") as ws:
            assert ws.filesystem is not None
            files = ws.filesystem
            say(f"workspace {ws.name} ({ws.id}) status={ws.status}")
            say(f"instructions: {ws.get_instructions()}")
            seed = {
                "README.md": "# Demo project\nSome TODO text\n",
                "src/app.py": "def main():\n    return 'hello'  # TODO: greet by name\n",
                "src/util/helpers.py": "def helper():\n    return 42\n",
                "notes/todo.txt": "buy milk\n",
            }
            for path, text in seed.items():
                await files.write_file(path, text)
                say(f"write_file {path}: {len(text.encode())} bytes")
            say("readdir . (recursive):")
            for entry in await files.readdir(".", recursive=True):
                size = f" {entry.size} bytes" if entry.size is not None else ""
                say(f"  {entry.type:9} {entry.name}{size}")
            text = str(await files.read_file("src/app.py", encoding="utf-8"))
            say(f"read_file src/app.py -> {text.splitlines()[0]!r} ...")
            stat = await files.stat("src/app.py")
            say(f"stat src/app.py: {stat.type}, {stat.size} bytes, {stat.mime_type}, modified {stat.modified_at.isoformat()}")
            await files.append_file("notes/todo.txt", "write docs\n")
            say(f"append_file notes/todo.txt -> {(await files.read_file('notes/todo.txt', encoding='utf-8'))!r}")
            await files.copy_file("src/app.py", "backup/app.py")
            await files.move_file("notes/todo.txt", "notes/done.txt")
            say("copy_file src/app.py -> backup/app.py; move_file notes/todo.txt -> notes/done.txt")
            try:
                await files.write_file("README.md", "clobber", overwrite=False)
            except FileExistsError as exc:
                say(f"write_file README.md overwrite=False -> {type(exc).__name__}: {exc} (expected)")
            try:
                await files.read_file("../etc/passwd")
            except PermissionError as exc:
                say(f"read_file ../etc/passwd -> {type(exc).__name__}: {exc} (expected: outside the workspace)")
            seen = await files.stat("README.md")
            await files.write_file("README.md", "# Demo project\nchanged by someone else\n")
            try:
                await files.write_file("README.md", "my stale edit", expected_mtime=seen)
            except OSError as exc:
                say(f"stale write -> {type(exc).__name__}: {exc} (expected: changed since it was read)")
            hits = await files.grep("TODO", ".")  # type: ignore[attr-defined]
            for hit in hits:
                for match in hit.matches:
                    say(f"grep TODO: {hit.path}:{match.line}:{match.column + 1}: {match.text.strip()}")
            await files.delete_file("backup/app.py")
            await files.rmdir("backup")
            say("delete_file backup/app.py; rmdir backup")
            section("agent tool calls")
            tools = await ws.create_tools()
            say(f"  tools: {', '.join(tools)}")
            for name, args in (
                ("mastra_workspace_list_files", {"path": "."}),
                ("mastra_workspace_grep", {"pattern": "TODO", "path": "src"}),
                ("mastra_workspace_read_file", {"path": "src/app.py"}),
                ("mastra_workspace_edit_file", {"path": "src/app.py", "old_string": "'hello'", "new_string": "'hello, agent'"}),
                ("mastra_workspace_read_file", {"path": "src/app.py", "offset": 2, "limit": 1}),
                ("mastra_workspace_file_stat", {"path": "src/app.py"}),
                ("mastra_workspace_write_file", {"path": "notes/plan.md", "content": "1. read\n2. edit\n"}),
            ):
                result = await tools[name].execute(args)
                say(f"  {name} {args}")
                for line in str(result).splitlines():
                    say(f"    {line}")
            section("the workspace as a FUSE mount")
            await _optional(_demo_mount(files, say), say)
            section("search (BM25 and vectors)")
            await _optional(_demo_search(files, say), say)
            section("commands in a sandbox, on a mounted bucket")
            await _optional(_demo_sandbox(say), say)
            section("snapshots, forks and a cache that outlives the process")
            await _demo_remember(ws, say)
            section("the storage contract")
            await _demo_backend(say)
            from ._demo_skills import demo_skills

            section("skills")
            await _optional(demo_skills(say), say)
            section("the end")
            info = await ws.get_info(include_file_count=True)
            say(f"get_info: status={info['status']} provider={info['filesystem']['provider']} total_files={info['filesystem']['total_files']}")
        say(f"workspace destroyed: status={ws.status}")
        readonly = Workspace(filesystem=fs.__class__(tmp.name, read_only=True) if tmp else FsspecFilesystem(raw, root="/demo", read_only=True))
        ro = readonly.filesystem
        assert ro is not None
        say(f"read-only workspace lists {len(await ro.readdir('.', recursive=True))} entries")
        try:
            await ro.write_file("x.txt", "nope")
        except WorkspaceReadOnlyError as exc:
            say(f"read-only write -> {type(exc).__name__}: {exc} (expected)")
        await readonly.destroy()
        say("demo finished: every step ran as described")
    finally:
        if tmp is not None:
            tmp.cleanup()


async def _optional(step: Any, say: Any) -> None:
    """Run a demo step that needs an extra; where it is missing, say so and go on."""
    from .errors import MissingExtraError

    try:
        await step
    except MissingExtraError as exc:
        say(f"(skipped: {exc})")


async def _demo_mount(files: Any, say: Any) -> None:
    """Mount the workspace and look at it with ordinary commands."""
    from .mounts import fuse_available, mount

    reason = fuse_available()
    if reason is not None:
        say(f"FUSE mount skipped: {reason}")
        return
    with tempfile.TemporaryDirectory(prefix="agentvfs-mnt-") as where:
        async with mount(files, where) as handle:
            say(f"mounted the workspace at {handle.mountpoint}:")
            for command in (["ls", "-la", where], ["ls", "-l", f"{where}/src"], ["cat", f"{where}/src/app.py"]):
                done = await anyio.to_thread.run_sync(
                    functools.partial(subprocess.run, command, capture_output=True, text=True, check=False)
                )
                say(f"  $ {' '.join(command).replace(where, '<mnt>')}")
                for line in (done.stdout + done.stderr).splitlines():
                    say(f"    {line.replace(where, '<mnt>')}")
            shell = f"echo 'written by a shell' > {where}/notes/shell.txt && echo more >> {where}/notes/shell.txt"
            await anyio.to_thread.run_sync(lambda: subprocess.run(["sh", "-c", shell], check=True))
            text = await files.read_file("notes/shell.txt", encoding="utf-8")
            say(f"  $ echo ... > <mnt>/notes/shell.txt; echo more >> ... -> the API reads {text!r}")
        say("unmounted")


async def _demo_search(files: Any, say: Any) -> None:
    """Index the demo files (BM25 plus vectors from the bundled hashing embedder) and search
    them, through the API and the search tool."""
    from . import Workspace
    from .search import HashingEmbedder, HnswVectorStore

    with tempfile.TemporaryDirectory(prefix="agentvfs-index-") as index_dir:
        ws = Workspace(
            filesystem=files,
            bm25=True,
            vector_store=HnswVectorStore(),
            embedder=HashingEmbedder(),
            auto_index_paths=["."],
            index_dir=index_dir,
        )
        async with ws:
            say(f"search index in <tmp>/{os.path.basename(os.path.join(index_dir, 'search.duckdb'))}: bm25 + vectors")
            for query, mode in (("greet by name", "bm25"), ("main hello todo", "hybrid")):
                # Hits that share nothing with the query (score 0) are not shown.
                results = [r for r in await ws.search(query, mode=mode, top_k=3) if r.score > 0]
                shown = ", ".join(f"{r.id} {r.score:.3f}" + (f" lines {r.line_range[0]}-{r.line_range[1]}" if r.line_range else "") for r in results)
                say(f"  search {query!r} ({mode}): {shown}")
            tools = await ws.create_tools()
            output = await tools["mastra_workspace_search"].execute({"query": "TODO", "topK": 2})
            say("  mastra_workspace_search {'query': 'TODO', 'topK': 2}")
            for line in str(output).splitlines():
                say(f"    {line}")
    await _demo_shared_index(files, say)


async def _demo_shared_index(files: Any, say: Any) -> None:
    """Publish an index of the demo files (``build_index``: segments and a manifest, here in a
    local directory; on a bucket, from a Dask cluster) and search it from an agent's workspace
    that attaches it read-only, together with what the agent changed."""
    from . import LocalFilesystem, Workspace
    from .search import HashingEmbedder, HnswVectorStore, build_index

    with tempfile.TemporaryDirectory(prefix="agentvfs-shared-") as shared:
        bucket, published = os.path.join(shared, "bucket"), os.path.join(shared, "index")
        # (A copy of the files on local disk stands for the bucket the index is built from.)
        for entry in await files.readdir(".", recursive=True):
            if entry.type == "file":
                target = anyio.Path(bucket, entry.name)
                await target.parent.mkdir(parents=True, exist_ok=True)
                await target.write_bytes(bytes(await files.read_file(entry.name)))
        build = functools.partial(build_index, bucket, published, embedder=HashingEmbedder())
        report = await anyio.to_thread.run_sync(build)
        say(
            f"build_index <tmp>/bucket -> <tmp>/index: manifest {report.manifest}, {report.docs} "
            f"documents in {report.built} segment(s), with vectors by {report.embedder}"
        )
        agent = Workspace(
            filesystem=LocalFilesystem(bucket),
            bm25=True,
            vector_store=HnswVectorStore(),
            embedder=HashingEmbedder(),
            auto_index_paths=["."],
            index_dir=os.path.join(shared, "agent"),
            search_index_url=published,
            search_index_options={"cache_dir": os.path.join(shared, "segments")},
        )
        async with agent:

            async def show(note: str) -> None:
                results = await agent.search("TODO", mode="bm25", top_k=3)
                say(f"  search 'TODO' ({note}): " + ", ".join(f"{r.id} {r.score:.3f}" for r in results))

            await show("an agent with the published index attached; nothing indexed of its own")
            nearest = await agent.search("main hello", mode="vector", top_k=1)
            say("  search 'main hello' (vector, from the published shards): " + ", ".join(f"{r.id} {r.score:.3f}" for r in nearest))
            done = "def main():\n    return 'hello, agent'  # greets by name now\n"
            note = "a TODO only this agent wrote\n"
            for path, text in (("src/app.py", done), ("notes/mine.md", note)):
                await agent.filesystem.write_file(path, text)  # type: ignore[union-attr]
                await agent.index(path, text)
            await show("after it rewrote src/app.py and wrote notes/mine.md; the published src/app.py is hidden")


@contextlib.contextmanager
def _demo_bucket(say: Any) -> Iterator[Any]:
    """A bucket for the sandbox demo: a moto S3 server on 127.0.0.1 when moto is installed (the
    test extra), else in-memory storage. Yields an fsspec filesystem and the root to use."""
    try:
        from .testing import MotoServer

        server = MotoServer()
        server.start()
    except Exception as exc:  # moto missing or not starting: still show the sandbox
        from fsspec.implementations.memory import MemoryFileSystem

        why = "the bench extra (moto) is not installed" if isinstance(exc, ModuleNotFoundError) else str(exc)
        say(f"(no local S3 server: {why}; using in-memory storage as the bucket)")
        yield MemoryFileSystem(global_store=False, skip_instance_cache=True), "/demo-bucket"
        return
    try:
        server.create_bucket("demo-bucket")
        say(f"S3 server (moto) on {server.endpoint_url}, bucket demo-bucket")
        yield server.s3fs(use_listings_cache=False), "demo-bucket/project"
    finally:
        server.stop()


async def _demo_remember(ws: Any, say: Any) -> None:
    """Snapshot the workspace, change it, diff and restore; try a change in a fork and commit
    it; delete a snapshot and collect what nothing holds; read a bucket through a content cache that a second filesystem finds warm."""
    from . import FsspecFilesystem
    from .vfs import SETTLE_SECONDS, ContentCache

    files = ws.filesystem
    snap = await ws.snapshot("before-cleanup")
    say(f"  snapshot {snap.name} ({snap.id[:12]}...)")
    await files.write_file("src/app.py", "def main():\n    return 'rewritten'\n")
    await files.delete_file("notes/plan.md")
    diff = await ws.diff(snap.id, None)
    for change in diff.changes:
        say(f"  diff: {change.change} {change.path}")
    restored = await ws.restore(snap.id, paths=["notes/plan.md"])
    say(f"  restore notes/plan.md -> restored {list(restored.restored)}, conflicts {list(restored.conflicts)}")
    async with ws.fork(name="experiment") as fork:
        await fork.filesystem.write_file("src/feature.py", "FLAG = True\n")
        say(f"  fork {fork.name}: wrote src/feature.py; in the original? {await files.exists('src/feature.py')}")
        report = await fork.commit()
        say(f"  fork.commit() -> applied {list(report.applied)}, conflicts {list(report.conflicts)}")
    say(f"  in the original now? {await files.exists('src/feature.py')}")
    # Snapshots hold their contents as shared blobs: deleting one frees only what no other
    # snapshot holds, once a collection runs (grace 0 here; an hour by default).
    latest = await ws.snapshot("after-fork")
    await ws.delete_snapshot(snap.id)
    names = [info.name for info in await ws.list_snapshots()]
    report = await ws.snapshot_store().collect_garbage(grace=timedelta(0))
    say(
        f"  delete_snapshot({snap.name}) -> snapshots left {names}; collect_garbage: "
        f"{report.blobs_deleted} blob(s) deleted ({report.bytes_freed} bytes), {report.blobs_kept} kept for {latest.name}"
    )
    with _demo_bucket(say) as (raw, root), tempfile.TemporaryDirectory(prefix="agentvfs-cache-") as cache_dir:
        first = FsspecFilesystem(raw, root=root, cache=cache_dir)
        if first.cache is None:
            say("  (the cache keeps object-store files only: this bucket is in memory)")
            return
        for i in range(3):
            await first.write_file(f"data/part-{i}.txt", f"part {i}\n" * 100)
        # An S3 ETag is an MD5, which a writer can collide: a version is cached once its
        # modification time is settled, some seconds after it was written.
        say(f"  (waiting {SETTLE_SECONDS + 1:g} s: S3 objects are cached once their time is settled)")
        await anyio.sleep(SETTLE_SECONDS + 1)
        await first.read_many([f"data/part-{i}.txt" for i in range(3)])
        info = ContentCache(cache_dir).info()
        say(f"  cache after a first read of 3 files: {info.entries} entries, {info.bytes} bytes on disk")
        # Another filesystem over the same cache directory: another process, or a later session.
        second = FsspecFilesystem(raw, root=root, cache=cache_dir)
        texts = await second.read_many([f"data/part-{i}.txt" for i in range(3)])
        hits = second.cache.hits if second.cache is not None else 0
        say(f"  a new filesystem reads them again: {len(texts)} files, {hits} from the cache")


async def _demo_backend(say: Any) -> None:
    """The storage contract: a filesystem over a backend, and two writers of one version."""
    from .errors import StaleFileError
    from .vfs import BackendFilesystem, MemoryBackend

    backend = MemoryBackend()
    fs = BackendFilesystem(backend)
    await fs.write_file("shared/counter.txt", "0")
    seen = await fs.stat("shared/counter.txt")
    for writer in ("first", "second"):
        try:
            await fs.write_file("shared/counter.txt", f"1 by the {writer} writer", expected_mtime=seen)
            say(f"  guarded write by the {writer} writer of version {seen.etag}: written")
        except StaleFileError as exc:
            say(f"  guarded write by the {writer} writer of version {seen.etag}: {type(exc).__name__} (expected)")
    final = await backend.read("shared/counter.txt")
    say(f"  the file holds {final.decode()!r}: one writer won, the other was told")


async def _demo_sandbox(say: Any) -> None:
    """Run shell commands in a LocalSandbox against a FUSE-mounted bucket, through the
    agent tools."""
    from . import FsspecFilesystem, Workspace
    from .mounts import fuse_available
    from .sandbox import LocalSandbox

    reason = fuse_available()
    if reason is not None:
        say(f"sandbox mount demo skipped: {reason}")
        return
    with _demo_bucket(say) as (raw, root), tempfile.TemporaryDirectory(prefix="agentvfs-sandbox-") as wd:
        bucket = FsspecFilesystem(raw, root=root, display_name="demo bucket")
        for path, text in {
            "README.md": "# Bucket project\nSome TODO text\n",
            "src/main.py": "print('hello from the bucket')  # TODO: greet by name\n",
        }.items():
            await bucket.write_file(path, text)
        isolation = "bwrap" if LocalSandbox.detect_isolation()["available"] else "none"
        sandbox = LocalSandbox(working_directory=wd, isolation=isolation)
        async with Workspace(sandbox=sandbox, mounts={"/bucket": bucket}, name="sandbox-demo") as ws:
            entry = sandbox.mounts.entries["/bucket"]
            say(f"sandbox {sandbox.id} (isolation {isolation}): /bucket {entry.state}")
            for line in ws.get_instructions().replace(wd, "<wd>").splitlines():
                say(f"  {line}")
            tools = await ws.create_tools()
            run = tools["mastra_workspace_execute_command"]
            for command in (
                "ls -l bucket bucket/src | sed 's/ [A-Z][a-z][a-z] .* / <date> /'",
                "cat bucket/README.md && grep -rn TODO bucket",
                "python3 bucket/src/main.py && echo 'written by a shell command' > bucket/notes.txt",
                "touch /etc/forbidden 2>&1 | sed 's/^.*: //'" if isolation == "bwrap" else "true",
            ):
                say(f"  $ {command}")
                for line in str(await run.execute({"command": command})).splitlines():
                    say(f"    {line}")
            notes = await bucket.read_file("notes.txt", encoding="utf-8")
            say(f"  the API reads bucket notes.txt -> {notes!r}")
            await bucket.write_file("from-api.txt", "written through the API\n")
            shown = await run.execute({"command": "cat bucket/from-api.txt"})
            say(f"  $ cat bucket/from-api.txt (just written through the API) -> {str(shown).strip()!r}")
            started = await run.execute({"command": "for i in 1 2 3; do echo tick $i; sleep 0.2; done", "background": True})
            say(f"  background: {started}")
            pid = str(started).rsplit(" ", 1)[-1].rstrip(")")
            output = await tools["mastra_workspace_get_process_output"].execute({"pid": pid, "wait": True})
            for line in str(output).splitlines():
                say(f"    {line}")
        still = await anyio.to_thread.run_sync(os.path.ismount, os.path.join(wd, "bucket"))
        say(f"sandbox destroyed: /bucket {entry.state}, still mounted: {still}")


# Option names whose values are credentials: given literally on the command line, they are
# visible to every local user (ps, /proc/PID/cmdline) for as long as the command runs.
_SECRET_WORDS = ("secret", "password", "passwd", "token", "credential", "private_key", "session")
_SECRET_KEYS = frozenset({"key", "access_key", "access_key_id", "aws_access_key_id", "account_key", "sas_token"})
_FROM_FILE_HINT = (
    "give it as KEY=@FILE (the value is read from FILE), or through the environment "
    "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, ...) or a --config file"
)


def _is_secret(key: str) -> bool:
    name = key.lower().replace("-", "_")
    return name in _SECRET_KEYS or any(word in name for word in _SECRET_WORDS)


def _storage_option(text: str) -> tuple[str, Any]:
    """Parse ``-o KEY=VALUE``; ``KEY=@FILE`` reads the value from FILE (its trailing newline
    dropped), which keeps credentials off the command line."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    if value.startswith("@") and len(value) > 1:
        try:
            with open(os.path.expanduser(value[1:]), encoding="utf-8") as source:
                return key, source.read().rstrip("\r\n")
        except OSError as exc:
            raise argparse.ArgumentTypeError(
                f"-o {key}=@{value[1:]}: cannot read the value from {value[1:]}: {exc.strerror}"
            ) from None
    if _is_secret(key) and value:
        print(
            f"agentvfs: warning: -o {key}=... puts a credential on the command line, where every "
            f"local user can read it (ps); {_FROM_FILE_HINT}",
            file=sys.stderr,
        )
    try:
        return key, json.loads(value)  # true, 3, {"a": 1}, "quoted string"
    except ValueError:
        return key, value


def _mcp(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    from ._config import apply_environment, load_config, workspace_from_config
    from .tools import serve_stdio

    try:
        config: dict[str, Any] = load_config(args.config) if args.config else {}
        if args.root is not None or args.url is not None:
            config.pop("root", None)
            config.pop("url", None)
            if args.root is not None:
                config.pop("storage_options", None)  # they were for the configured url
            config["root" if args.root is not None else "url"] = args.root if args.root is not None else args.url
        remote_options: list[tuple[str, Any]] = []
        if isinstance(config.get("url"), str):
            config["url"], remote_options = _resolve_remote(config["url"], args.remotes)
        if args.read_only:
            config["read_only"] = True
        if args.options or remote_options:
            config["storage_options"] = {
                **dict(remote_options), **(config.get("storage_options") or {}), **dict(args.options)
            }
        root, url = config.get("root"), config.get("url")
        local = os.path.expanduser(root) if isinstance(root, str) else _local_path(url) if isinstance(url, str) else None
        if local is not None and not args.create:
            _check_exists(local)
        apply_environment(config)
        workspace = workspace_from_config(config)
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        if not _stdin_is_a_pipe():  # a person at a terminal, or a script: say it and stop
            print(f"agentvfs mcp: {reason}", file=sys.stderr)
            raise SystemExit(2) from None
        # An MCP client started this server over pipes: it would see only a closed connection.
        # Serve it the reason instead (instructions and every tool call), and say it on stderr.
        from .tools import serve_stdio_failure

        print(f"agentvfs mcp: the configuration cannot be used: {reason}", file=sys.stderr, flush=True)
        anyio.run(serve_stdio_failure, f"the configuration cannot be used: {reason}")
        raise SystemExit(2) from None
    anyio.run(serve_stdio, workspace)


def _stdin_is_a_pipe() -> bool:
    """Whether standard input is a pipe or socket (an MCP client's), not a terminal or file."""
    import stat

    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False  # closed, or replaced by an object without a descriptor
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _mount_option_table() -> str:
    """Every mount option with its default and the first sentence of its documentation
    (from :class:`~agentvfs.mounts.MountOptions`)."""
    import dataclasses
    import re

    from .errors import MissingExtraError

    try:
        from .mounts import MountOptions
    except MissingExtraError as exc:
        return f"mount options: listed once mounts can run here ({exc})"

    about: dict[str, str] = {}
    doc = (MountOptions.__doc__ or "").split("Parameters\n    ----------\n", 1)[-1]
    for block in re.split(r"\n    (?=\w)", "\n" + doc):
        head, _, body = block.strip().partition("\n")
        if " : " not in head:
            continue
        text = " ".join(body.split())
        first = re.split(r"(?<=[a-z)])\. ", text, maxsplit=1)[0].rstrip(".")
        for name in head.split(" : ")[0].split(", "):
            about[name.strip()] = first
    lines = ["mount options (-o KEY=VALUE; booleans also as -o KEY, -o KEY=off):"]
    for f in dataclasses.fields(MountOptions):
        if f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = "the mounting user's" if f.name in ("uid", "gid") else "-"
        default = _shown_default(f.name, default)
        text = about.get(f.name, "").replace("``", "")
        wrapped = textwrap.wrap(text, 74, initial_indent="    ", subsequent_indent="    ")
        lines += [f"  {f.name} (default {default})", *wrapped]
    return "\n".join(lines)


def _shown_default(name: str, value: object) -> object:
    """A mount option's default as ``-o`` takes it: on/off, 0o755, 8GiB (or unset)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, int) and name.endswith("_mode"):
        return oct(value)
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 30}GiB" if value % (1 << 30) == 0 else f"{value >> 20}MiB"
    return value


_REMOTES_HELP = (
    "the remotes file that defines NAME in a URL NAME:PATH (default $AGENTVFS_REMOTES, else "
    "~/.config/agentvfs/remotes.toml)"
)


_CREDENTIALS_HELP = """\
credentials and endpoints:
  S3: the usual AWS sources (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE,
  ~/.aws/credentials, an instance role), or -o key=@FILE -o secret=@FILE; another S3
  server with -o endpoint_url=http://host:port; a public bucket with -o anon=true.
  GCS: GOOGLE_APPLICATION_CREDENTIALS or -o token=@FILE (a service-account JSON file).
  Any other key is an fsspec storage option of the URL's filesystem; a mistyped one is
  refused and the closest known option named.

named remotes (URL NAME:PATH), from ~/.config/agentvfs/remotes.toml or --remotes FILE:
  [docs]
  url = "s3://my-bucket/docs"
  endpoint_url = "http://127.0.0.1:9000"
  key_file = "s3-key"          # KEY_file: the value of KEY, read from that file
  secret_file = "s3-secret"
  metadata_ttl = 5             # mount options too
  then: agentvfs mount docs: /mnt/docs   (or docs:reports for a folder below)"""


_REMOTE = re.compile(r"^([A-Za-z][\w.-]*):(?!//)(.*)$")


def _remotes_file(given: str | None) -> str:
    """The remotes file: ``--remotes``, ``$AGENTVFS_REMOTES``, else
    ``$XDG_CONFIG_HOME/agentvfs/remotes.toml`` (``~/.config/...``)."""
    if given:
        return os.path.expanduser(given)
    if os.environ.get("AGENTVFS_REMOTES"):
        return os.path.expanduser(os.environ["AGENTVFS_REMOTES"])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "agentvfs", "remotes.toml")


def _resolve_remote(url: str, remotes_file: str | None) -> tuple[str, list[tuple[str, Any]]]:
    """``NAME:PATH`` (rclone style) as the URL and options of the remote ``NAME`` in the remotes
    file, with ``PATH`` below its URL; any other URL as it is, with no options.

    A remote is a TOML table: ``url``, then any storage or mount option; ``KEY_file`` reads the
    option ``KEY`` from a file (credentials stay out of the file and out of every command line).

    Raises
    ------
    ValueError
        The name is not defined, or the file or a ``*_file`` cannot be read.
    """
    import tomllib

    match = _REMOTE.match(url)
    if match is None or os.path.exists(url):
        return url, []
    name, below = match.groups()
    path = _remotes_file(remotes_file)
    try:
        with open(path, "rb") as handle:
            remotes = tomllib.load(handle)
    except FileNotFoundError:
        raise ValueError(f"{url}: no remote {name!r}: the remotes file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{url}: cannot read the remotes file {path}: {exc}") from None
    remote = remotes.get(name)
    if not isinstance(remote, dict) or not isinstance(remote.get("url"), str):
        defined = ", ".join(sorted(k for k, v in remotes.items() if isinstance(v, dict))) or "none"
        raise ValueError(f"{url}: no remote {name!r} with a url in {path} (defined: {defined})")
    if os.stat(path).st_mode & 0o077 and any(_is_secret(k) for k in remote):
        print(f"agentvfs: warning: {path} holds credentials and others may read it; chmod 600 {path}", file=sys.stderr)
    options: list[tuple[str, Any]] = []
    for key, value in remote.items():
        if key == "url":
            continue
        if key.endswith("_file") and isinstance(value, str):
            source = os.path.join(os.path.dirname(path), os.path.expanduser(value))
            try:
                with open(source, encoding="utf-8") as handle:
                    options.append((key[: -len("_file")], handle.read().rstrip("\r\n")))
            except OSError as exc:
                raise ValueError(f"remote {name!r}: {key} = {value!r}: {exc.strerror}") from None
        else:
            options.append((key, value))
    base = remote["url"].rstrip("/")
    return (f"{base}/{below.lstrip('/')}" if below.strip("/") else base), options


def _check_exists(path: str) -> None:
    """Refuse a local root that does not exist: a typo would otherwise be created and served
    as a new, empty workspace."""
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.lexists(path) else "does not exist"
        raise ValueError(f"{path} {what}; give an existing directory, or --create to make it")


def _local_path(url: str) -> str | None:
    """The local directory ``url`` names (a plain path or ``file://``), else None."""
    if "::" in url:
        return None
    if "://" not in url:
        return os.path.abspath(url)
    return url[len("file://") :] if url.startswith("file://") else None


def _filesystem_for(url: str, read_only: bool, storage_options: dict[str, Any]) -> Any:
    from . import FsspecFilesystem

    if "://" not in url and "::" not in url:
        url = "file://" + os.path.abspath(url)
    return FsspecFilesystem(url, read_only=read_only, storage_options=storage_options or None)


class _SignalStop:
    """A stop request made by a signal handler and awaited by the main thread.

    A Python signal handler runs in the main thread between two bytecodes, possibly while
    that thread holds a lock. ``threading.Event`` cannot serve: the main thread waiting in
    ``Event.wait`` holds the event's lock for a moment each round, and a handler calling
    ``Event.set`` then blocks on it for good (a mount that never exits on SIGTERM). Here the
    handler only sets a flag and writes a byte to a non-blocking pipe, which wakes the
    waiter's ``select`` at once.
    """

    def __init__(self) -> None:
        self.requested = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def request(self) -> None:
        """Ask the waiter to stop; safe to call from a signal handler."""
        self.requested = True
        # A full pipe (EAGAIN) already wakes the waiter; a closed one means nobody waits.
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a request; return whether one was made."""
        if not self.requested:
            with contextlib.suppress(OSError, ValueError):
                select.select([self._read], [], [], timeout)
        return self.requested

    def clear(self) -> None:
        """Forget the requests made so far."""
        self.requested = False
        with contextlib.suppress(OSError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


def _mount(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .errors import MountError, WorkspaceError
    from .mounts import Mount, MountOptions
    from .vfs import check_storage_options

    known = {name for name in MountOptions.__dataclass_fields__}
    try:
        # A named remote gives the URL and options; -o given here win.
        args.url, from_remote = _resolve_remote(args.url, args.remotes)
    except ValueError as exc:
        print(f"agentvfs mount: {exc}", file=sys.stderr)
        return 2
    given = [*from_remote, *args.options]
    mount_options = {k: v for k, v in given if k.replace("-", "_") in known}
    storage_options = {k: v for k, v in given if k.replace("-", "_") not in known}
    local = _local_path(args.url)
    try:
        if "::" not in args.url:
            protocol = args.url.split("://", 1)[0] if "://" in args.url else "file"
            check_storage_options(protocol, storage_options, also=known, also_called="a mount option")
        if local is not None and not args.create:
            _check_exists(local)
    except ValueError as exc:
        print(f"agentvfs mount: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"agentvfs mount: {exc}", file=sys.stderr)
        return 1
    if args.daemon:
        return _daemonize(args, mount_options)
    stop = _SignalStop()
    closing = False

    def on_signal(signum: int, frame: object) -> None:
        if closing:
            # A second signal while the mount waits for writers or uploads: stop now, as a
            # killed mount would. What is staged and unpublished stays in the state directory,
            # and the next mount of this storage moves it to the recovery area. Written with
            # os.write: the main thread may be inside a print to stderr right now.
            with contextlib.suppress(OSError):
                os.write(2, (
                    b"agentvfs: stopping at once (a second signal): unpublished files are kept for the next "
                    b"mount of this storage to recover (agentvfs recover --list)\n"
                ))  # fmt: skip
            subprocess.run(["fusermount3", "-uz", os.path.abspath(args.mountpoint)], capture_output=True, check=False)
            os._exit(1)
        stop.request()

    # Before the mount appears: a signal the moment it does must still unmount cleanly.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            fs = _filesystem_for(args.url, args.read_only, storage_options)
            handle = Mount(fs, args.mountpoint, read_only=args.read_only or None, options=mount_options)
            handle.start()
        except (MountError, WorkspaceError, OSError, ValueError, ImportError) as exc:
            print(f"agentvfs mount: {exc}", file=sys.stderr)
            return 1
        mode = "read-only" if handle.read_only else "read-write"
        print(f"agentvfs: {args.url} mounted at {handle.mountpoint} ({mode}); SIGINT or SIGTERM unmounts", file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            if not handle.mounted:
                print("agentvfs: the mount went away (unmounted from outside)", file=sys.stderr)
                break
        closing = True
        try:
            handle.close()
        except MountError as exc:
            print(f"agentvfs mount: {exc}", file=sys.stderr)
            return 1
        print(f"agentvfs: unmounted {handle.mountpoint}", file=sys.stderr)
        return 0
    finally:
        # The handlers go first: one running after the pipe closed could write into
        # whatever file took its descriptor number.
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop.close()


def _daemonize(args: argparse.Namespace, mount_options: dict[str, Any]) -> int:
    """Start ``agentvfs mount`` (the same arguments, without ``--daemon``) in a process of its
    own session, its output to the log file, and return once it has mounted (0) or exited
    (its exit code, with the end of its log)."""
    from .mounts import default_state_dir, is_mounted

    point = os.path.abspath(args.mountpoint)
    log = args.log_file
    if not log:
        state = str(mount_options.get("state_dir") or default_state_dir())
        os.makedirs(state, mode=0o700, exist_ok=True)
        name = "".join(c if c.isalnum() else "-" for c in point.strip("/")) or "root"
        log = os.path.join(state, f"mount-{name}.log")
    # The same arguments as given (a KEY=@FILE is read again by the child: a credential read
    # here must not reach the child's command line, which every local user can see).
    argv = [sys.executable, "-m", "agentvfs", *(a for a in args.raw_argv if not _is_daemon_flag(a))]
    with open(log, "ab") as out:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True
        )
    while child.poll() is None and not is_mounted(point):
        time.sleep(0.05)
    if child.poll() is not None:
        with open(log, "rb") as f:
            tail = f.read()[-2000:].decode("utf-8", "replace").strip().splitlines()
        print("\n".join(tail[-5:]) or f"agentvfs mount: exited with {child.returncode}", file=sys.stderr)
        return child.returncode or 1
    print(
        f"agentvfs: {args.url} mounted at {point} by process {child.pid} (log: {log}); "
        f"'agentvfs unmount {point}' stops it",
        file=sys.stderr,
    )
    return 0


def _completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """A bash function completing ``agentvfs`` from ``parser``: commands, each command's
    options, mount options (``KEY=``) after ``-o``, files elsewhere. zsh runs it through
    ``bashcompinit``."""
    commands: dict[str, list[str]] = {}
    top: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                commands[name] = sorted(o for a in sub._actions for o in a.option_strings)
        else:
            top += action.option_strings
    try:
        from .mounts import MountOptions

        keys = [f"{name}=" for name in MountOptions.__dataclass_fields__]
    except ImportError:  # mounts not installed: no mount options to offer
        keys = []
    cases = "\n".join(f'        {name}) opts="{" ".join(opts)}" ;;' for name, opts in sorted(commands.items()))
    script = f"""# agentvfs completion ({shell}); load with: source <(agentvfs completion {shell})
_agentvfs() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" cmd="" i opts=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            --log-level|--log-file) ((i++)) ;;
            -*) ;;
            *) cmd="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    if [[ $prev == --log-level ]]; then
        COMPREPLY=($(compgen -W "DEBUG INFO WARNING ERROR" -- "$cur"))
        return
    fi
    if [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "{" ".join(sorted(commands))} {" ".join(top)}" -- "$cur"))
        return
    fi
    if [[ $prev == -o && $cmd == mount ]]; then
        COMPREPLY=($(compgen -W "{" ".join(keys)}" -- "$cur"))
        compopt -o nospace 2>/dev/null
        return
    fi
    case $cmd in
{cases}
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o default -F _agentvfs agentvfs
"""
    if shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    return script


def _setup_passthrough() -> int:
    """``agentvfs setup-passthrough``: run the packaged build script for this environment,
    then say whether a new process gets passthrough (this one imported pyfuse3 already)."""
    import importlib.util

    spec = importlib.util.find_spec("agentvfs.mounts")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a broken install
        raise RuntimeError("agentvfs.mounts is not installed as a package")
    script = os.path.join(next(iter(spec.submodule_search_locations)), "build_passthrough.sh")
    done = subprocess.run(["bash", script, sys.executable], check=False)
    check = "from agentvfs.mounts import passthrough_unavailable_reason as r; print(r() or '')"
    probe = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=False)
    errors = probe.stderr.strip().splitlines()
    reason = probe.stdout.strip() or (errors[-1] if errors else "")
    if done.returncode == 0 and probe.returncode == 0 and not reason:
        print("agentvfs: FUSE passthrough is set up: new mounts of local directories use it", file=sys.stderr)
        return 0
    print(f"agentvfs setup-passthrough: mounts run without passthrough: {reason or 'the build failed'}", file=sys.stderr)
    return 1


def _is_daemon_flag(arg: str) -> bool:
    """``--daemon`` or an abbreviation argparse takes for it."""
    return arg.startswith("--dae") and "--daemon".startswith(arg)


def _unmount(args: argparse.Namespace) -> int:
    """``agentvfs unmount``: stop the agentvfs process serving the mount point (it publishes
    first), else ``fusermount3 -u``; wait until the mount is gone."""
    from .mounts import is_mounted, serving_process

    point = os.path.abspath(args.mountpoint)
    if not is_mounted(point):
        print(f"agentvfs unmount: {point} is not a mount point", file=sys.stderr)
        return 1
    pid = None if args.lazy else serving_process(point, args.state_dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while is_mounted(point) and time.monotonic() < deadline:
            time.sleep(0.1)
        # The process unmounts, then removes its session: wait for it to be done.
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if is_mounted(point) or pid_alive(pid):
            print(
                f"agentvfs unmount: the mount process {pid} has not finished within {args.timeout:g} s (uploads "
                "may still be running); wait longer with --timeout, or detach at once with --lazy",
                file=sys.stderr,
            )
            return 1
        print(f"agentvfs: unmounted {point} (process {pid} stopped; 'agentvfs recover --list' shows anything it kept)", file=sys.stderr)
        return 0
    command = ["fusermount3", "-uz" if args.lazy else "-u", point]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        command = ["umount", *(["-l"] if args.lazy else []), point]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or is_mounted(point):
        why = " ".join(done.stderr.split()) or f"{command[0]} exited with {done.returncode}"
        busy = " (in use: close what uses it, or --lazy)" if "busy" in why.lower() else ""
        print(f"agentvfs unmount: {why}{busy}", file=sys.stderr)
        return 1
    print(f"agentvfs: unmounted {point}", file=sys.stderr)
    return 0




def _storage_of(entry_storage: str, url: str | None) -> str:
    """The URL to open for a recovered file: the one given, else the one it was kept for
    (``local:///dir`` is the directory)."""
    if url:
        return url
    return entry_storage[len("local://") :] if entry_storage.startswith("local://") else entry_storage


async def _restore_one(entry: Any, url: str, to: str | None, force: bool, storage_options: dict[str, Any]) -> str:
    from .errors import StaleFileError

    fs = _filesystem_for(url, False, storage_options)
    path = to or entry.path
    data = await anyio.Path(entry.data).read_bytes()
    try:
        current = await fs.stat(path)
    except FileNotFoundError:
        current = None
    if force:
        await fs.write_file(path, data)
    elif current is None:
        if entry.base is not None and to is None:
            raise StaleFileError(path, None, None)  # deleted since: not restored over nothing
        await fs.write_file(path, data, overwrite=False)
    elif to is None and (entry.base is None or current.etag != entry.base):
        raise StaleFileError(path, None, current.modified_at)
    else:
        await fs.write_file(path, data, expected_mtime=current)
    return path


def _cache(args: argparse.Namespace) -> int:
    """``agentvfs cache``: what the content cache holds, or clear it."""
    from .vfs import ContentCache, default_cache_dir

    directory = args.cache_dir or default_cache_dir()
    if not os.path.isdir(directory):
        if args.json:
            print(json.dumps({"directory": directory, "entries": 0, "bytes": 0}))
        else:
            print(f"No cache at {directory} (nothing has been cached there yet).")
        return 0
    cache = ContentCache(directory)
    if args.clear:
        removed = cache.clear()
        print(json.dumps({"directory": directory, "removed": removed}) if args.json else f"Removed {removed} entries from {directory}.")
        return 0
    info = cache.info()
    if args.json:
        print(json.dumps({"directory": info.directory, "entries": info.entries, "bytes": info.bytes, "pending": info.pending}))
    else:
        print(f"{info.directory}: {info.entries} entries, {info.bytes / 1048576:.1f} MiB held"
              + (f", {info.pending / 1048576:.1f} MiB being written" if info.pending else ""))
    return 0


def _recover(args: argparse.Namespace) -> int:
    from .mounts import default_state_dir, discard_recovered, list_recovered

    root = args.state_dir or default_state_dir()
    url = args.url
    if url and "://" not in url and "::" not in url:
        url = "file://" + os.path.abspath(url)
    entries = list_recovered(root)
    if args.url:
        # The storage as the mount filed it: local directories as local://, the rest by URL.
        wanted = {url, "local://" + os.path.abspath(args.url)}
        entries = [e for e in entries if e.storage in wanted or e.storage.split("://", 1)[-1] == url.split("://", 1)[-1]]
    chosen = args.restore or args.discard
    if chosen is None:
        if args.json:
            print(json.dumps([e.to_dict() for e in entries], indent=1))
        elif not entries:
            print(f"no recovered files in {root}")
        for e in entries if not args.json else []:
            base = e.base or "new file"
            print(f"{e.id}  {e.size:>10}  {e.storage.rstrip('/')}/{e.path}  (base {base}; kept {e.kept_at}: {e.reason})")
        return 0
    by_id = {e.id: e for e in entries}
    missing = [i for i in chosen if i not in by_id]
    if missing:
        print(f"agentvfs recover: no recovered file {', '.join(missing)} (see agentvfs recover --list)", file=sys.stderr)
        return 2
    if args.to and len(chosen) != 1:
        print("agentvfs recover: --to takes one --restore ID", file=sys.stderr)
        return 2
    status = 0
    storage_options = dict(args.options)
    for ident in chosen:
        entry = by_id[ident]
        if args.discard:
            discard_recovered(entry)
            print(f"discarded {ident} ({entry.path})")
            continue
        try:
            target = _storage_of(entry.storage, args.url and url)
            written = anyio.run(_restore_one, entry, target, args.to, args.force, storage_options)
        except OSError as exc:
            status = 1
            why = "storage changed since it was kept (--force writes over that)" if exc.errno == errno.ESTALE else exc
            print(f"agentvfs recover: {ident} ({entry.path}) not restored: {why}", file=sys.stderr)
            continue
        discard_recovered(entry)
        print(f"restored {ident} to {written}")
    return status


# -- snapshots ------------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    """A number of seconds from 0 to a year, for argparse."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 366 * 86400:
        raise argparse.ArgumentTypeError(f"seconds must be from 0 to 31622400 (a year), got {text}")
    return value


def _snapshot_target(args: argparse.Namespace) -> tuple[Any, Any]:
    """The workspace filesystem ``args.url`` names (a named remote, -o storage options; a
    local directory must exist) and the snapshot store (``--store``, else None: the
    workspace's own).

    Raises
    ------
    ValueError
        The remote, a storage option or the directory is wrong; the message says which.
    """
    from .snapshots import SnapshotStore
    from .vfs import check_storage_options

    url, from_remote = _resolve_remote(args.url, args.remotes)
    options = {**dict(from_remote), **dict(args.options)}

    def protocol(of: str) -> str:
        return of.split("://", 1)[0] if "://" in of else "file"

    if "::" not in url:
        check_storage_options(protocol(url), options)
    local = _local_path(url)
    if local is not None and not os.path.isdir(local):
        what = "is not a directory" if os.path.lexists(local) else "does not exist"
        raise ValueError(f"{local} {what}; give the workspace's directory")
    fs = _filesystem_for(url, False, options)
    store = None
    if args.store:
        store_url, store_remote = _resolve_remote(args.store, args.remotes)
        # The -o options are the workspace's; a store of the same kind of storage shares them.
        shared = options if protocol(store_url) == protocol(url) else {}
        store = SnapshotStore(_filesystem_for(store_url, False, {**dict(store_remote), **shared}))
    return fs, store


async def _snapshot_command(args: argparse.Namespace) -> int:
    from .snapshots import (
        DEFAULT_PREFIX,
        SnapshotStore,
        diff_snapshots,
        restore_snapshot,
        take_snapshot,
    )

    fs, given = _snapshot_target(args)
    store: SnapshotStore = given if given is not None else SnapshotStore(fs, prefix=DEFAULT_PREFIX)
    try:
        if args.command == "snapshot":
            snapshot = await take_snapshot(fs, store, name=args.name)
            if args.json:
                print(json.dumps({**snapshot.info().to_dict(), "content": snapshot.content}, indent=1))
            else:
                print(snapshot.id)
                label = f" ({snapshot.name})" if snapshot.name else ""
                print(
                    f"agentvfs: snapshot {snapshot.id[:12]}{label} of {args.url}: {len(snapshot.files)} files, "
                    f"{len(snapshot.directories)} directories, {snapshot.total_bytes} bytes; contents kept as "
                    f"{snapshot.content}",
                    file=sys.stderr,
                )
            return 0
        if args.command == "snapshots" and args.grace is not None and not args.gc:
            raise ValueError("--grace applies to --gc only; add --gc to collect unused blobs")
        if args.command == "snapshots" and (args.delete or args.gc):
            deleted = []
            for ref in args.delete:
                deleted.append(await store.delete(ref))
                if not args.json:
                    print(deleted[-1], flush=True)  # said at once: a later --delete may fail
            grace = timedelta(seconds=3600.0 if args.grace is None else args.grace)
            report = await store.collect_garbage(grace=grace) if args.gc else None
            if args.json:
                print(json.dumps({"deleted": deleted, "garbage": None if report is None else asdict(report)}, indent=1))
                return 0
            if report is not None:
                print(
                    f"agentvfs snapshots: {report.blobs_deleted} unused blobs deleted ({report.bytes_freed} bytes), "
                    f"{report.blobs_kept} kept",
                    file=sys.stderr,
                )
            return 0
        if args.command == "snapshots":
            infos = await store.list()
            if args.json:
                print(json.dumps([i.to_dict() for i in infos], indent=1))
            elif not infos:
                print(f"no snapshots in {store.describe()}", file=sys.stderr)
            for i in infos if not args.json else []:
                when = i.created_at.strftime("%Y-%m-%d %H:%M:%S")
                print(f"{i.id[:12]}  {when}  {i.files:>7} files  {i.bytes:>12} bytes  {i.name or ''}".rstrip())
            return 0
        if args.command == "diff":
            later = None if args.b in (None, "@live") else args.b
            diff = await diff_snapshots(fs, args.a, later, store=store, patches=not args.name_only and not args.json)
            if args.json:
                print(json.dumps([{"path": c.path, "change": c.change, "type": c.type} for c in diff.changes], indent=1))
            elif args.name_only:
                for c in diff.changes:
                    print(f"{c.change[0].upper()} {c.path}{'/' if c.type == 'directory' else ''}")
            else:
                sys.stdout.write(diff.patch())
            return 0
        result = await restore_snapshot(fs, args.snapshot, store=store, paths=args.paths, force=args.force)
        if args.json:
            print(json.dumps({
                "snapshot": result.snapshot, "restored": list(result.restored), "skipped": list(result.skipped),
                "conflicts": [{"path": c.path, "reason": c.reason} for c in result.conflicts],
            }, indent=1))  # fmt: skip
        else:
            for path in result.restored:
                print(f"restored {path}")
            for conflict in result.conflicts:
                print(f"agentvfs restore: kept {conflict.path} ({conflict.reason})", file=sys.stderr)
        if result.conflicts:
            hint = "" if args.force else "; --force restores them too"
            print(
                f"agentvfs restore: {len(result.conflicts)} paths differ from snapshot {result.snapshot[:12]} and "
                f"were left as they are{hint}",
                file=sys.stderr,
            )
            return 1
        return 0
    finally:
        await fs.destroy()


def _snapshots(args: argparse.Namespace) -> int:
    """``agentvfs snapshot``, ``snapshots``, ``diff`` and ``restore``."""
    from .errors import BlobIntegrityError, SnapshotNotFoundError, WorkspaceReadOnlyError

    try:
        return anyio.run(_snapshot_command, args)
    except SnapshotNotFoundError as exc:
        print(f"agentvfs {args.command}: {exc}; list them with: agentvfs snapshots {args.url}", file=sys.stderr)
        return 2
    except (BlobIntegrityError, WorkspaceReadOnlyError) as exc:
        print(f"agentvfs {args.command}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:
        print(f"agentvfs {args.command}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"agentvfs {args.command}: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentvfs`` command."""
    parser = argparse.ArgumentParser(prog="agentvfs", description="A workspace for AI agents over any fsspec storage.")
    parser.add_argument("--version", action="version", version=f"agentvfs {_version()}")
    _add_common_arguments(parser)
    # The same options after the command (``agentvfs mount -v ...``); given there, they win.
    common = argparse.ArgumentParser(add_help=False)
    _add_common_arguments(common, given_only=True)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser = functools.partial(sub.add_parser, parents=[common])
    demo = add_parser("demo", help="run file operations on a sample workspace and print what happened")
    demo.add_argument("--storage", choices=["memory", "local"], default="memory", help="embedded storage to use (default: memory)")
    mcp = add_parser(
        "mcp",
        help="serve the workspace tools to an MCP client over stdio",
        description="Serve the workspace tools (read_file, write_file, edit_file, ...) over stdio with the "
        "Model Context Protocol. Options given here override the configuration file.",
    )
    mcp.add_argument("--config", metavar="FILE", help="JSON or TOML file: root or url, read_only, storage_options, tools")
    where = mcp.add_mutually_exclusive_group()
    where.add_argument("--root", metavar="DIR", help="a local directory as the workspace")
    where.add_argument("--url", metavar="URL", help="an fsspec URL as the workspace (s3://bucket/prefix, memory://, ...)")
    mcp.add_argument("--read-only", action="store_true", help="offer no write tools and refuse writes")
    mcp.add_argument("--create", action="store_true", help="create the --root directory if it does not exist")
    mcp.add_argument("--remotes", metavar="FILE", help=_REMOTES_HELP)
    mcp.add_argument(
        "-o", dest="options", action="append", type=_storage_option, default=[], metavar="KEY=VALUE",
        help="an fsspec storage option for --url; VALUE is read as JSON when it parses (true, 3, {...}), else as a "
        "string; KEY=@FILE reads it from FILE. Never put credentials on the command line (every local user sees "
        "them in ps): use KEY=@FILE, the environment or --config",
    )  # fmt: skip
    mnt = add_parser(
        "mount",
        help="FUSE-mount an fsspec URL or a local directory",
        description=textwrap.fill(
            "Mount URL (s3://bucket/prefix, gcs://bucket, memory://, file:///dir or a local path) at MOUNTPOINT "
            "until SIGINT or SIGTERM (or 'agentvfs unmount MOUNTPOINT'); pending uploads finish before the "
            "unmount. With --daemon it returns once mounted. Semantics: docs/mount-semantics.md.",
            88,
        ),
        epilog=_mount_option_table() + "\n\n" + _CREDENTIALS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mnt.add_argument("url", metavar="URL")
    mnt.add_argument("mountpoint", metavar="MOUNTPOINT")
    mnt.add_argument("--read-only", action="store_true", help="mount ro: every write fails with EROFS")
    mnt.add_argument("--remotes", metavar="FILE", help=_REMOTES_HELP)
    mnt.add_argument(
        "--daemon", action="store_true",
        help="serve from a background process and return once mounted; its log goes to --log-file (default: "
        "mount-<name>.log in the state directory)",
    )  # fmt: skip
    mnt.add_argument(
        "--create", action="store_true",
        help="create a local directory URL that does not exist (without it a missing one is refused: a typo "
        "would mount a new, empty directory)",
    )  # fmt: skip
    mnt.add_argument(
        "-o", dest="options", action="append", type=_storage_option, default=[], metavar="KEY=VALUE",
        help="a mount option (metadata_ttl, cache, cache_dir, cache_bytes, part_size, prefetch_parts, staging_dir, "
        "staging_limit, uid, gid, allow_other, ...) or else an fsspec storage option (endpoint_url, key, secret, anon, ...); KEY=@FILE reads "
        "the value from FILE. Never put credentials on the command line (every local user sees them in ps): use "
        "key=@FILE, secret=@FILE or the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)",
    )  # fmt: skip
    completion = add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for SHELL: commands, their options, and mount options after -o. "
        "Load it with: source <(agentvfs completion bash), or in ~/.zshrc: source <(agentvfs completion zsh).",
    )
    completion.add_argument("shell", choices=["bash", "zsh"])
    add_parser(
        "setup-passthrough",
        help="build FUSE passthrough for this installation (libfuse 3.17, as root)",
        description="Build libfuse 3.17 into this environment (opt/libfuse), the passthrough library beside it, "
        "and pyfuse3 against it, so that mounts of local directories read and write at the disk's speed. "
        "Needs root, a C compiler, pkg-config and the Debian mirror of this machine's apt sources; "
        "scripts/setup.sh does the same for a checkout. Without it, mounts work without passthrough.",
    )
    umnt = add_parser(
        "unmount",
        help="unmount a mount point, letting an agentvfs mount finish its uploads first",
        description="Ask the agentvfs mount process serving MOUNTPOINT to stop (SIGTERM: it waits up to its "
        "stop_timeout for writers, publishes what is complete and keeps the rest for 'agentvfs recover'), and "
        "wait until the mount is gone. Any other FUSE mount is unmounted with fusermount3 -u.",
    )
    umnt.add_argument("mountpoint", metavar="MOUNTPOINT")
    umnt.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the mount to go (120)")
    umnt.add_argument("--lazy", action="store_true", help="detach now even if busy (fusermount3 -uz)")
    umnt.add_argument("--state-dir", metavar="DIR", help="the mount's state directory, if not the default")
    rec = add_parser(
        "recover",
        help="list, restore or discard files a mount kept instead of publishing them",
        description="A mount never publishes a file that was still open for writing when it stopped, whose "
        "upload failed, or that storage changed under it, and the next mount of a storage moves what a killed "
        "mount left staged into the recovery area. This lists those files (the default), writes one back to "
        "its storage (--restore: only over the version it was based on, unless --force) or deletes it "
        "(--discard).",
    )
    rec.add_argument("url", metavar="URL", nargs="?", help="only files of this storage; the storage to restore to")
    action = rec.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true", help="list the recovered files (the default)")
    action.add_argument("--restore", metavar="ID", nargs="+", help="write these files back to their storage")
    action.add_argument("--discard", metavar="ID", nargs="+", help="delete these recovered files for good")
    rec.add_argument("--to", metavar="PATH", help="with one --restore ID: write it to PATH instead of its own path")
    rec.add_argument("--force", action="store_true", help="restore even over a version written since")
    rec.add_argument("--json", action="store_true", help="print the list as JSON")
    rec.add_argument("--state-dir", metavar="DIR", help="the mounts' state directory (default: the mount default)")
    rec.add_argument(
        "-o", dest="options", action="append", type=_storage_option, default=[], metavar="KEY=VALUE",
        help="an fsspec storage option for restoring (endpoint_url, ...); KEY=@FILE reads it from FILE",
    )  # fmt: skip
    cache = add_parser(
        "cache",
        help="show or clear the persistent cache of remote files",
        description="Mounts with -o cache (or -o cache_dir=DIR) and filesystems made with cache= keep the files "
        "they read from remote storage in a cache on local disk, by version, shared by processes. This shows "
        "what it holds (the default) or removes every entry (--clear).",
    )
    cache_action = cache.add_mutually_exclusive_group()
    cache_action.add_argument("--info", action="store_true", help="entries and bytes held, and the budget (default)")
    cache_action.add_argument("--clear", action="store_true", help="remove every entry")
    cache.add_argument("--cache-dir", metavar="DIR", help="the cache directory (default: the mounts' default)")
    cache.add_argument("--json", action="store_true", help="print the figures as JSON")
    _add_snapshot_parsers(add_parser)
    _add_index_parser(add_parser)
    from .bench import add_arguments as add_bench_arguments

    bench = add_parser(
        "bench",
        help="measure backends and mount layers side by side; write a report and plots",
        description="Run the io, metadata, agent, search and sandbox suites on each backend through each layer "
        "(direct fsspec, the agentvfs mount and, with --peers, local disk, fsspec.fuse, rclone mount and s3fs), "
        "then write results.json, report.md and PNG plots to --out. Needs root for cold figures and mounts.",
    )
    add_bench_arguments(bench)
    args = parser.parse_args(argv)
    args.raw_argv = list(argv if argv is not None else sys.argv[1:])
    try:
        _configure_logging(args)
    except OSError as exc:
        print(f"agentvfs: --log-file {args.log_file}: {exc.strerror}", file=sys.stderr)
        return 2
    terminated = False

    def on_term(signum: int, frame: Any) -> None:
        # SIGTERM stops a command as Ctrl-C does: under an event loop that cancels the
        # command's tasks, so what it holds (a snapshot store's lock, a half-written file)
        # is released or removed on the way out. Killed by the default action instead, a
        # collection's lock on S3 would hold every snapshot off until it goes stale.
        nonlocal terminated
        terminated = True
        interrupt = signal.getsignal(signal.SIGINT)
        if not callable(interrupt):  # SIGINT ignored (a background job of a script)
            raise KeyboardInterrupt
        interrupt(signal.SIGINT, frame)

    try:
        previous: Any = signal.signal(signal.SIGTERM, on_term)
        installed = True
    except ValueError:  # not the main thread: signals are not ours to handle
        installed = False
    try:
        return _run(args, argv, {"root": parser, "mcp": mcp, "mount": mnt, "bench": bench})
    except KeyboardInterrupt:
        return 128 + signal.SIGTERM if terminated else 130
    except BrokenPipeError:
        # The reader went away (agentvfs ... | head): nothing more to say, and Python must not
        # complain when it flushes stdout at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:
        if args.debug:
            raise
        print(f"agentvfs {args.command}: {_explain(exc)}", file=sys.stderr)
        return 1
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _add_snapshot_parsers(add_parser: Any) -> None:
    """``snapshot``, ``snapshots``, ``diff`` and ``restore``: each takes the workspace URL,
    ``--store``, ``--remotes``, ``-o`` and ``--json``."""
    store_help = (
        "keep or find snapshots in this URL instead of URL/.agentvfs/snapshots (where the agent's own tools "
        "cannot reach them)"
    )

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "url", metavar="URL", help="the workspace: s3://bucket/prefix, gcs://bucket, file:///dir, a local path or NAME:PATH"
        )
        parser.add_argument("--store", metavar="URL", help=store_help)
        parser.add_argument("--remotes", metavar="FILE", help=_REMOTES_HELP)
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.add_argument(
            "-o", dest="options", action="append", type=_storage_option, default=[], metavar="KEY=VALUE",
            help="an fsspec storage option for URL (endpoint_url, anon, ...); KEY=@FILE reads the value from FILE",
        )  # fmt: skip

    snap = add_parser(
        "snapshot",
        help="record the workspace's files as an immutable snapshot; print its id",
        description="Record every file (version, size, time, SHA-256), directory and symbolic link of URL as a "
        "snapshot kept in URL/.agentvfs/snapshots (or --store). On a bucket that keeps versions (S3 versioning, "
        "GCS object versioning) no data is copied; elsewhere each content is stored once, by hash.",
    )
    common(snap)
    snap.add_argument("--name", metavar="NAME", help="a name to find the snapshot by")
    listing = add_parser(
        "snapshots",
        help="list the snapshots of a workspace, oldest first (or delete some)",
        description="List the snapshots of URL, oldest first: id, time, files, bytes and name. With --delete, "
        "delete those snapshots instead (their manifests; contents stored as blobs stay, other snapshots may "
        "hold them). With --gc, delete the blobs no snapshot holds (after any --delete).",
    )
    common(listing)
    listing.add_argument(
        "--delete", dest="delete", action="append", default=[], metavar="SNAPSHOT",
        help="delete this snapshot (id, id prefix or name; repeatable) and print its id",
    )  # fmt: skip
    listing.add_argument(
        "--gc", action="store_true",
        help="delete the stored contents no snapshot holds, once older than --grace",
    )  # fmt: skip
    listing.add_argument(
        "--grace", type=_seconds, default=None, metavar="SECONDS",
        help="with --gc: leave blobs written less than this long ago (default 3600)",
    )  # fmt: skip
    diff = add_parser(
        "diff",
        help="show what changed between two snapshots, or since one",
        description="Print the changes from snapshot A to snapshot B (default: the live workspace) as unified "
        "diffs of text files and one line for everything else. A and B are ids, id prefixes or names.",
    )
    common(diff)
    diff.add_argument("a", metavar="A", help="the earlier snapshot")
    diff.add_argument("b", metavar="B", nargs="?", help="the later snapshot (default: the workspace as it is now)")
    diff.add_argument("--name-only", action="store_true", help="only the paths: A added, R removed, C changed")
    restore = add_parser(
        "restore",
        help="bring a workspace back to a snapshot (changes made since are kept unless --force)",
        description="Restore URL to SNAPSHOT: what was deleted since comes back. A path that differs from the "
        "snapshot (modified or added since, or of another kind) is left as it is and reported, unless --force; "
        "even with --force a change made while the restore runs is never overwritten. Exit status 1 when paths "
        "were left as they are.",
    )
    common(restore)
    restore.add_argument("snapshot", metavar="SNAPSHOT", help="the snapshot's id, id prefix or name")
    restore.add_argument(
        "--path", dest="paths", action="append", metavar="P", help="restore only P and what is below it (repeatable)"
    )
    restore.add_argument("--force", action="store_true", help="also replace and delete what changed after the snapshot")


def _add_index_parser(add_parser: Any) -> None:
    """``index``: a whole bucket into segments and a manifest, on Dask if asked."""
    idx = add_parser(
        "index",
        help="index every file of a URL for search, into segments and a manifest (on Dask if asked)",
        description="Index every file below URL (BM25, as a workspace's own index would) into immutable "
        "segments under INDEX_URL/segments/ and write the index's next manifest (INDEX_URL/manifests/) "
        "last, create-only: two builds racing never overwrite each other. A re-run indexes only the "
        "prefixes whose listing changed, and deletes segments no recent manifest uses. Runs in this "
        "process, or on Dask (pip install 'agentvfs[dask]') with --workers or --scheduler.",
    )
    idx.add_argument("url", metavar="URL", help="what to index: s3://bucket/prefix, gcs://bucket, file:///dir or a local path")
    idx.add_argument("--out", metavar="INDEX_URL", required=True, help="where the index lives (created on first use)")
    where = idx.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS", help="run the tasks on this Dask scheduler (tcp://HOST:8786)")
    where.add_argument("--workers", metavar="N", type=int, help="run the tasks on a local Dask cluster of N processes")
    idx.add_argument(
        "--objects-per-task", metavar="N", type=int, default=5000,
        help="the most objects one task (one segment) covers, by the planner's estimate (5000)",
    )  # fmt: skip
    idx.add_argument(
        "--gc-grace", metavar="SECONDS", type=float, default=3600.0,
        help="keep unreferenced segments younger than this: they may be a running build's (3600)",
    )  # fmt: skip
    idx.add_argument(
        "--embedder", metavar="SPEC",
        help="also embed every document into a vector shard per segment: 'hashing' or 'hashing:DIM' "
        "(the bundled HashingEmbedder), or MODULE:NAME of an embedder (a function, an object, or a "
        "class made with no arguments); workspaces attaching the index with the same embedder search "
        "it by vector",
    )  # fmt: skip
    idx.add_argument("--json", action="store_true", help="print the report as JSON")
    idx.add_argument(
        "-o", dest="options", action="append", type=_storage_option, default=[], metavar="KEY=VALUE",
        help="an fsspec storage option for URL, and for INDEX_URL when it is the same kind of storage "
        "(endpoint_url, anon, ...); KEY=@FILE reads the value from FILE",
    )  # fmt: skip


def _index(args: argparse.Namespace) -> int:
    """``agentvfs index``: build or update a segment index of a URL."""
    from .errors import IndexConflictError, MissingExtraError, SearchIndexError

    def fail(message: str, code: int) -> int:
        print(f"agentvfs index: {' '.join(message.split())}", file=sys.stderr)
        return code

    if args.objects_per_task < 1:
        return fail(f"--objects-per-task must be at least 1, got {args.objects_per_task}", 2)
    if args.workers is not None and args.workers < 1:
        return fail(f"--workers must be at least 1, got {args.workers}", 2)
    if args.gc_grace < 0:
        return fail(f"--gc-grace must be 0 or more seconds, got {args.gc_grace}", 2)
    embedder = None
    if args.embedder is not None:
        try:
            embedder = _load_embedder(args.embedder)
        except (ImportError, ValueError, TypeError, AttributeError) as exc:
            return fail(f"--embedder {args.embedder}: {exc}", 2)

    def protocol(of: str) -> str:
        return of.split("://", 1)[0] if "://" in of else "file"

    source, out = args.url, args.out
    local = _local_path(source)
    if local is not None and not os.path.isdir(local):
        what = "is not a directory" if os.path.lexists(local) else "does not exist"
        return fail(f"{local} {what}; give the directory (or bucket URL) to index", 2)
    if "://" not in source:
        source = os.path.abspath(os.path.expanduser(source))
    if "://" not in out and "::" not in out:
        out = os.path.abspath(os.path.expanduser(out))
    if args.workers is not None or args.scheduler is not None:
        with contextlib.suppress(ImportError):
            import logging

            import distributed  # noqa: F401  (importing it sets its loggers to INFO)

            # Dask's own progress lines (workers starting, keys released) only with -v.
            logging.getLogger("distributed").setLevel(logging.getLogger().level)
    options = dict(args.options)
    # The -o options are the source's; an index on the same kind of storage shares them.
    index_options = options if protocol(out) == protocol(source) else {}
    try:
        from .search import build_index

        report = build_index(
            source, out, scheduler=args.scheduler, workers=args.workers, storage_options=options,
            index_storage_options=index_options, objects_per_task=args.objects_per_task,
            gc_grace=args.gc_grace, embedder=embedder,
        )  # fmt: skip
    except IndexConflictError as exc:
        return fail(str(exc), 1)
    except MissingExtraError as exc:
        return fail(str(exc), 1)
    except ConnectionError as exc:
        return fail(str(exc), 1)
    except (ValueError, TypeError) as exc:
        return fail(str(exc), 2)
    except (SearchIndexError, OSError) as exc:
        return fail(str(exc) or type(exc).__name__, 1)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
        return 0
    print("| task | estimate | objects | docs | bytes | segment |")
    print("|---|---:|---:|---:|---:|---|")
    for t in report.tasks:
        segment = "-" if t.segment is None else f"{t.segment[:12]} ({'kept' if t.reused else 'built'})"
        print(f"| {t.label} | {t.estimate} | {t.objects} | {t.docs} | {t.bytes} | {segment} |")
    print(
        f"agentvfs index: manifest {report.manifest} of {out}: {report.docs} documents from {report.objects} "
        f"objects in {len(report.tasks)} tasks; segments built {report.built}, kept {report.reused}, deleted "
        f"{report.deleted}; old manifests deleted {report.manifests_deleted}; {report.seconds:.1f} s "
        f"(planning {report.planning_seconds:.1f} s)",
        file=sys.stderr,
    )
    if report.embedder is not None:
        failed = f"; {report.embed_failed} without a vector (retried by the next build)" if report.embed_failed else ""
        print(f"agentvfs index: vectors by {report.embedder}{failed}", file=sys.stderr)
    return 0


def _load_embedder(spec: str) -> Any:
    """The embedder ``--embedder SPEC`` names: ``hashing[:DIM]``, or ``MODULE:NAME`` of a
    callable (a class is made with no arguments)."""
    import importlib

    from .search import HashingEmbedder

    if spec == "hashing" or spec.startswith("hashing:"):
        _, _, size = spec.partition(":")
        if size and not size.isdigit():
            raise ValueError(f"the dimension {size!r} is not a number (hashing:384)")
        return HashingEmbedder(int(size)) if size else HashingEmbedder()
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError("expected 'hashing', 'hashing:DIM' or MODULE:NAME (mypkg.embed:model)")
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    if isinstance(found, type):
        found = found()
    if not callable(found):
        raise TypeError(f"{spec} is a {type(found).__name__}, not an embedder (a callable)")
    return found


def _add_common_arguments(parser: argparse.ArgumentParser, *, given_only: bool = False) -> None:
    """The options of every command: logging, and tracebacks (``given_only``: no defaults,
    so that a command's parser keeps what was given before the command)."""
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if given_only else {}
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of an unexpected error (else one line)",
        **unset,
    )  # fmt: skip
    parser.add_argument(
        "-v", "--verbose", action="count", help="log more: -v what happens (INFO), -vv everything (DEBUG)",
        **(unset or {"default": 0}),
    )  # fmt: skip
    parser.add_argument(
        "--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
        help="the least severe log records shown (default WARNING; overrides -v)", **unset,
    )  # fmt: skip
    parser.add_argument(
        "--log-file", metavar="FILE", help="append log records to FILE instead of standard error", **unset
    )


def _version() -> str:
    from . import __version__

    return __version__


def _configure_logging(args: argparse.Namespace) -> None:
    """Send log records at the level asked for to standard error or ``--log-file``."""
    import logging

    level = args.log_level or ("DEBUG" if args.verbose > 1 else "INFO" if args.verbose else "WARNING")
    if args.log_file:
        handler: logging.Handler = logging.FileHandler(os.path.expanduser(args.log_file), encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("agentvfs: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    global _log_handler
    if _log_handler is not None:  # main() called again in one process: replace, not add
        root.removeHandler(_log_handler)
        _log_handler.close()
    _log_handler = handler
    root.addHandler(handler)
    root.setLevel(level)


_log_handler: Any = None


#: The extra of agentvfs that brings a module a command may miss.
_EXTRA_OF_MODULE = {
    "pyfuse3": "fuse",
    "trio": "fuse",
    "duckdb": "search",
    "hnswlib": "search",
    "numpy": "search",
    "mcp": "mcp",
    "adlfs": "azure",
    "s3fs": "s3",
    "aiobotocore": "s3",
    "gcsfs": "gcs",
    "dask": "dask",
    "distributed": "dask",
    "onnxruntime": "embed",
    "tokenizers": "embed",
    "pytest": "bench",
    "rich": "bench",
    "matplotlib": "bench",
    "moto": "bench",
    "boto3": "bench",
    "fusepy": "bench",
    "fuse": "bench",
}


def _explain(exc: BaseException) -> str:
    """One line for an error no command handled itself: the fix for a missing module, else
    the error and where its traceback is."""
    from .errors import MissingExtraError

    if isinstance(exc, MissingExtraError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        extra = _EXTRA_OF_MODULE.get(top)
        fix = f"pip install 'agentvfs[{extra}]'" if extra else f"install the package that provides {top!r}"
        return f"the module {top!r} is not installed; {fix}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{text} ({type(exc).__name__}; run 'agentvfs --debug ...' for the traceback)"


def _run(args: argparse.Namespace, argv: Sequence[str] | None, parsers: dict[str, argparse.ArgumentParser]) -> int:
    """Run the command ``args`` names; its exit code."""
    if args.command == "bench":
        from .bench import main as bench_main

        args.argv = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--debug"]
        return int(bench_main(args, parsers["bench"]))
    if args.command == "mount":
        return _mount(args, parsers["mount"])
    if args.command == "recover":
        return _recover(args)
    if args.command == "unmount":
        return _unmount(args)
    if args.command in ("snapshot", "snapshots", "diff", "restore"):
        return _snapshots(args)
    if args.command == "cache":
        return _cache(args)
    if args.command == "index":
        return _index(args)
    if args.command == "setup-passthrough":
        return _setup_passthrough()
    if args.command == "completion":
        print(_completion_script(args.shell, parsers["root"]))
        return 0
    if args.command == "mcp":
        _mcp(args, parsers["mcp"])
    else:
        anyio.run(_demo, args.storage, [])
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
