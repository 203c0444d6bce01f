"""The ``agentvfs`` command."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence

import anyio

__all__ = ["main"]


async def _demo(storage: str, out: list[str]) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    from . import FsspecFilesystem, LocalFilesystem, Workspace, WorkspaceReadOnlyError

    def say(line: str = "") -> None:
        out.append(line)
        print(line, flush=True)

    if storage == "memory":
        raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
        fs = FsspecFilesystem(raw, root="/demo", display_name="demo (memory)")
        tmp = None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="agentvfs-demo-")
        fs = LocalFilesystem(tmp.name)
    try:
        say(f"== agentvfs demo on {storage} storage")
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
                say(f"write_file README.md overwrite=False -> {type(exc).__name__}: {exc}")
            try:
                await files.read_file("../etc/passwd")
            except PermissionError as exc:
                say(f"read_file ../etc/passwd -> {type(exc).__name__}: {exc}")
            seen = await files.stat("README.md")
            await files.write_file("README.md", "# Demo project\nchanged by someone else\n")
            try:
                await files.write_file("README.md", "my stale edit", expected_mtime=seen)
            except OSError as exc:
                say(f"stale write -> {type(exc).__name__}: {exc}")
            hits = await files.grep("TODO", ".")  # type: ignore[attr-defined]
            for hit in hits:
                for match in hit.matches:
                    say(f"grep TODO: {hit.path}:{match.line}:{match.column + 1}: {match.text.strip()}")
            await files.delete_file("backup/app.py")
            await files.rmdir("backup")
            say("delete_file backup/app.py; rmdir backup")
            say("agent tool calls:")
            tools = await ws.create_tools()
            say(f"  tools: {', '.join(tools)}")
            for name, args in (
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
            say(f"read-only write -> {type(exc).__name__}: {exc}")
        await readonly.destroy()
    finally:
        if tmp is not None:
            tmp.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentvfs`` command."""
    parser = argparse.ArgumentParser(prog="agentvfs", description="A workspace for AI agents over any fsspec storage.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run file operations on a sample workspace and print what happened")
    demo.add_argument("--storage", choices=["memory", "local"], default="memory", help="embedded storage to use (default: memory)")
    args = parser.parse_args(argv)
    commands = {"demo": lambda: anyio.run(_demo, args.storage, [])}
    commands[args.command]()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
