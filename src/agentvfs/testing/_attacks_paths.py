"""Attacks on containment: hostile paths, symlinks and races against the filesystem tools.

The races run the way an agent would run them: it writes a small program with ``write_file``
and starts it in the background with ``execute_command``; the program swaps a directory of the
workspace with a symlink to a host directory (``renameat2(RENAME_EXCHANGE)``) as fast as it
can, while the agent calls a tool on a path through that directory again and again. A tool
that checks a path and then opens it again by name follows the link some of the time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from ._adversary import Arena, attack

__all__: list[str] = []

# A name only the host side has: if it shows in a tool's output, a listing went outside.
_HOST_ONLY = "host-only-name.txt"




class _Race:
    """A racer swapping ``<root>/<name>/d`` (a directory) with ``<root>/<name>/l`` (a link to
    the host's tree) from inside the sandbox."""

    def __init__(self, arena: Arena, name: str) -> None:
        self.arena = arena
        self.base = arena.root / name
        self.stop = self.base / "stop"

    def plant(self, files: dict[str, str], *, elsewhere: Path | None = None) -> None:
        """Make the directory ``d`` with ``files`` and the link ``l`` to ``elsewhere`` (the
        host's tree by default), which gets the same names with its own content, so a swapped
        read shows which side it came from."""
        inside = self.base / "d"
        target = elsewhere if elsewhere is not None else self.arena.host / "tree"
        for rel, text in files.items():
            (inside / rel).parent.mkdir(parents=True, exist_ok=True)
            (inside / rel).write_text(text)
            other = target / rel
            other.parent.mkdir(parents=True, exist_ok=True)
            if not other.exists():
                other.write_text(f"host file {rel}\n")
        (target / _HOST_ONLY).write_text("host only\n")
        (self.base / "l").symlink_to(target)
        self.arena.snapshot()

    @contextlib.asynccontextmanager
    async def running(self, seconds: float) -> AsyncIterator[None]:
        async with self.arena.exchanging(self.base / "d", self.base / "l", seconds=seconds):
            yield
        # Leave the directory where it was planted, so later checks see the real layout.
        if (self.base / "d").is_symlink():
            os.rename(self.base / "d", self.base / "x")
            os.rename(self.base / "l", self.base / "d")
            os.rename(self.base / "x", self.base / "l")


def _leaked(out: str) -> bool:
    return "host file" in out or _HOST_ONLY in out or "host only" in out


@attack(
    "static_path_escapes",
    finding="tool paths that name host files: '..', absolute paths, links pointing out",
    severity="high",
)
async def static_path_escapes(arena: Arena) -> None:
    await arena.open()
    (arena.root / "out").symlink_to(arena.host)
    (arena.root / "secret-link").symlink_to(arena.host / "secret.txt")
    arena.snapshot()
    secret = str(arena.host / "secret.txt")
    for path in ("../host/secret.txt", secret, "out/secret.txt", "secret-link", "./out/../out/secret.txt",
                 f"/..{secret}", "out/tree/a.txt"):  # fmt: skip
        for tool in ("read_file", "file_stat"):
            out = await arena.tool(tool, path=path)
            arena.check_secret(out, f"{tool} {path}")
            arena.record("host file" not in out, f"{tool} {path} read a host file: {out[:200]}")
        await arena.tool("write_file", path=path, content="pwned")
        arena.check_outside(f"write_file {path}")
        await arena.tool("delete", path=path, recursive=True)
        arena.check_outside(f"delete {path}")
    out = await arena.tool("grep", pattern="arena-secret|host file", path=".")
    arena.check_secret(out, "grep .")
    arena.record("host file" not in out, f"grep followed a link out: {out[:200]}")


@attack(
    "symlink_swap_read",
    finding="read_file while the sandbox swaps a directory with a link to the host",
    severity="high",
)
async def symlink_swap_read(arena: Arena) -> None:
    await arena.open()
    race = _Race(arena, "race-read")
    race.plant({"a.txt": "inside a\n"})
    async with race.running(30):
        for _ in arena.iterations(600, seconds=12):
            out = await arena.tool("read_file", path="race-read/d/a.txt")
            arena.record(not _leaked(out), f"read_file returned a host file: {out[:120]!r}")


@attack(
    "symlink_swap_write",
    finding="write_file and mkdir while the sandbox swaps a directory with a link to the host",
    severity="high",
)
async def symlink_swap_write(arena: Arena) -> None:
    await arena.open()
    race = _Race(arena, "race-write")
    race.plant({"a.txt": "inside a\n"})
    async with race.running(30):
        for index in arena.iterations(400, seconds=12):
            await arena.tool("write_file", path=f"race-write/d/new-{index}.txt", content="agent")
            await arena.tool("write_file", path="race-write/d/a.txt", content="overwritten")
            await arena.tool("mkdir", path=f"race-write/d/dir-{index}/sub")
            arena.check_outside(f"write_file/mkdir under race-write/d (try {index})")


@attack(
    "symlink_swap_delete",
    finding="a recursive delete while the sandbox swaps a directory with a link to the host",
    severity="high",
)
async def symlink_swap_delete(arena: Arena) -> None:
    await arena.open()
    race = _Race(arena, "race-del")
    race.plant({"sub/b.txt": "inside b\n", "a.txt": "inside a\n"})
    async with race.running(30):
        for index in arena.iterations(300, seconds=12):
            await arena.tool("write_file", path="race-del/d/sub/b.txt", content="again")
            await arena.tool("delete", path="race-del/d/sub", recursive=True)
            await arena.tool("delete", path="race-del/d/a.txt")
            arena.check_outside(f"delete under race-del/d (try {index})")


@attack(
    "symlink_swap_listing",
    finding="list_files, grep and edit_file while the sandbox swaps a directory with a link to the host",
    severity="high",
)
async def symlink_swap_listing(arena: Arena) -> None:
    await arena.open()
    race = _Race(arena, "race-ls")
    race.plant({"a.txt": "shared line\ninside a\n"})
    (arena.host / "tree" / "a.txt").write_text("shared line\nhost file a\n")
    arena.snapshot()
    async with race.running(30):
        for index in arena.iterations(200, seconds=12):
            out = await arena.tool("list_files", path="race-ls/d", maxDepth=3)
            arena.record(not _leaked(out), f"list_files listed the host tree: {out[:200]!r}")
            out = await arena.tool("grep", pattern="host|inside", path="race-ls/d")
            arena.record(not _leaked(out), f"grep read the host tree: {out[:200]!r}")
            await arena.tool("read_file", path="race-ls/d/a.txt")
            await arena.tool(
                "edit_file", path="race-ls/d/a.txt", old_string="shared line", new_string="shared line"
            )
            arena.check_outside(f"edit_file under race-ls/d (try {index})")


@attack(
    "symlink_swap_skill_read",
    finding="skill_read while the sandbox swaps a skill's references with a link out of the skill",
    severity="high",
)
async def symlink_swap_skill_read(arena: Arena) -> None:
    # Twice: the link leads to the host, then to a directory of the workspace outside the
    # skill (inside the root, but no file of the skill).
    for round_, elsewhere in enumerate((None, arena.root / "private")):
        name = f"docs{round_}"
        skill = arena.root / "skills" / name
        skill.mkdir(parents=True)
        (skill / "SKILL.md").write_text(f"---\nname: {name}\ndescription: Project docs\n---\nRead the references.\n")
        race = _Race(arena, f"skills/{name}")
        # The racer swaps the skill's own references directory: "references" links to d.
        race.plant({"a.txt": "inside reference\n"}, elsewhere=elsewhere)
        (skill / "references").symlink_to("d")
        arena.snapshot()
        await arena.open(skills=["skills"])
        async with race.running(30):
            for _ in arena.iterations(400, seconds=10):
                out = await arena.tool("skill_read", skillName=name, path="references/a.txt")
                arena.record(not _leaked(out), f"skill_read left the skill: {out[:120]!r}")


@attack(
    "allowed_paths_symlink",
    finding="a link inside an allowed directory that points at host files",
    severity="high",
)
async def allowed_paths_symlink(arena: Arena) -> None:
    allowed = arena.base / "allowed"
    allowed.mkdir()
    (allowed / "ok.txt").write_text("allowed file\n")
    (allowed / "secret-link").symlink_to(arena.host / "secret.txt")
    (allowed / "tree-link").symlink_to(arena.host / "tree")
    (arena.root / "to-allowed").symlink_to(allowed)
    arena.snapshot()
    await arena.open(allowed_paths=[str(allowed)])
    out = await arena.tool("read_file", path=str(allowed / "ok.txt"))
    if "allowed file" not in out:
        raise RuntimeError(f"the allowed path itself is not readable: {out}")
    for path in (str(allowed / "secret-link"), str(allowed / "tree-link" / "a.txt"),
                 "to-allowed/secret-link", "to-allowed/tree-link/a.txt"):  # fmt: skip
        out = await arena.tool("read_file", path=path)
        arena.check_secret(out, f"read_file {path}")
        arena.record(not _leaked(out), f"read_file {path} read a host file: {out[:120]!r}")
    for path in (str(allowed / "tree-link" / "new.txt"), "to-allowed/tree-link/new.txt"):
        await arena.tool("write_file", path=path, content="pwned")
        arena.check_outside(f"write_file {path}")
        await arena.tool("mkdir", path=path + ".d/x")
        arena.check_outside(f"mkdir {path}.d/x")
    out = await arena.tool("grep", pattern="arena-secret|host file", path=str(allowed))
    arena.check_secret(out, "grep allowed")
    arena.record(not _leaked(out), f"grep followed a link out of the allowed path: {out[:200]!r}")


async def _bounded(
    arena: Arena, what: str, seconds: float, tool: str, args: dict[str, object], *, fifos: tuple[Path, ...] = ()
) -> str:
    """Call a tool that must answer within ``seconds``; a hang counts as a failed try.

    A tool blocked opening one of ``fifos`` is released by opening it for writing (the open
    cannot be cancelled from here): the try is recorded failed, and the suite goes on.
    """
    result: list[str] = []
    done = anyio.Event()

    async def call() -> None:
        result.append(await arena.tool(tool, **args))
        done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        with anyio.move_on_after(seconds):
            await done.wait()
        if not done.is_set():
            arena.record(False, f"{what}: {tool} {args} hung for more than {seconds:.0f} s")
            while not done.is_set():
                for fifo in fifos:
                    with contextlib.suppress(OSError):
                        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                with anyio.move_on_after(0.1):
                    await done.wait()
            return result[0] if result else ""
    arena.record(True)
    return result[0]


@attack(
    "fifo_hangs_tools",
    finding="a FIFO named like a text file (or .gitignore) hangs read_file, grep, list_files",
    severity="medium",
)
async def fifo_hangs_tools(arena: Arena) -> None:
    await arena.open()
    await arena.sh("mkfifo fifo.txt && mkdir -p sub && mkfifo sub/.gitignore && echo hello > sub/note.txt")
    if not (arena.root / "fifo.txt").exists():
        os.mkfifo(arena.root / "fifo.txt")
        (arena.root / "sub").mkdir(exist_ok=True)
        os.mkfifo(arena.root / "sub" / ".gitignore")
        (arena.root / "sub" / "note.txt").write_text("hello\n")
    fifos = (arena.root / "fifo.txt", arena.root / "sub" / ".gitignore")
    calls: list[tuple[str, dict[str, object]]] = [
        ("read_file", {}), ("read_file", {"encoding": "base64"}),
        ("edit_file", {"old_string": "a", "new_string": "b"}), ("write_file", {"content": "x"}),
    ]  # fmt: skip
    for tool, extra in calls:
        await _bounded(arena, "FIFO", 10, tool, {"path": "fifo.txt", **extra}, fifos=fifos)
    out = await _bounded(arena, "FIFO", 10, "grep", {"pattern": "hello", "path": "."}, fifos=fifos)
    arena.record("note.txt" in out, f"grep did not find the regular file beside the FIFO: {out[:200]!r}")
    out = await _bounded(arena, "FIFO .gitignore", 10, "list_files", {"path": "sub"}, fifos=fifos)
    arena.record("note.txt" in out, f"list_files failed beside a FIFO .gitignore: {out[:200]!r}")
    await _bounded(arena, "FIFO .gitignore", 10, "grep", {"pattern": "hello", "path": "sub"}, fifos=fifos)


@attack(
    "device_node_read",
    finding="a device node in the workspace (/dev/zero's numbers) read by the host's read_file",
    severity="medium",
    requires=("root",),
)
async def device_node_read(arena: Arena) -> None:
    await arena.open()
    # As root the agent's command could make one where the sandbox allows mknod; here the
    # host makes it directly: what matters is the host-side tools' answer.
    os.mknod(arena.root / "zero.txt", 0o666 | 0o020000, os.makedev(1, 5))
    os.mknod(arena.root / "null.txt", 0o666 | 0o020000, os.makedev(1, 3))
    calls: list[tuple[str, dict[str, object]]] = [
        ("read_file", {}), ("read_file", {"encoding": "base64"}),
        ("edit_file", {"old_string": "a", "new_string": "b"}),
    ]  # fmt: skip
    for tool, extra in calls:
        out = await _bounded(arena, "device", 10, tool, {"path": "zero.txt", **extra})
        arena.record(len(out) < 10_000, f"{tool} read {len(out)} characters from /dev/zero's numbers")
    await _bounded(arena, "device", 10, "grep", {"pattern": "x", "path": "."})
    await _bounded(arena, "device", 10, "write_file", {"path": "null.txt", "content": "x"})


@attack(
    "skill_bad_reference",
    finding="a link out of one skill's references/ breaks skill_search, or leaks into it",
    severity="low",
)
async def skill_bad_reference(arena: Arena) -> None:
    skills = arena.root / "skills"
    for name in ("good", "bad"):
        (skills / name / "references").mkdir(parents=True)
        (skills / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: The {name} skill\n---\nBody.\n")
    (skills / "good" / "references" / "guide.md").write_text("needle-of-the-good-skill\n")
    (skills / "bad" / "references" / "evil.md").symlink_to(arena.host / "secret.txt")
    (skills / "bad" / "references" / "borrowed.md").symlink_to("../../good/references/guide.md")
    arena.snapshot()
    for options in ({}, {"bm25": True}):
        await arena.open(skills=["skills"], bm25=options.get("bm25"))
        out = await arena.tool("skill_search", query="needle-of-the-good-skill")
        arena.record(
            "good" in out and "Error" not in out[:40],
            f"skill_search ({options or 'simple'}) failed over one bad reference: {out[:200]!r}",
        )
        arena.record(
            "[bad]" not in out,
            f"skill_search ({options or 'simple'}) found a reference outside its skill: {out[:200]!r}",
        )
        out = await arena.tool("skill_search", query=arena.secret)
        arena.check_secret(out, f"skill_search for the secret ({options or 'simple'})")
        out = await arena.tool("skill_read", skillName="bad", path="references/evil.md")
        arena.check_secret(out, "skill_read of a link to a host file")


@attack(
    "planted_index_dir",
    finding="a symlinked .agentvfs in the working directory makes the host write its index there",
    severity="medium",
    requires=("fuse",),
)
async def planted_index_dir(arena: Arena) -> None:
    from ..vfs import FsspecFilesystem

    planted = arena.host / "planted"
    planted.mkdir()
    (arena.root / ".agentvfs").symlink_to(planted)
    arena.snapshot()
    await arena.open(mounts={"/data": FsspecFilesystem("memory://planted-index")}, bm25=True)
    await arena.workspace.index("/data/notes.md", "the index must not land on the host")
    found = await arena.workspace.search("index")
    arena.record(bool(found), f"the index did not work at all: {found!r}")
    await arena.close()
    arena.check_outside("the index opened through a planted .agentvfs link")
    # A file planted there is moved aside, not written through or deleted.
    await arena.open(mounts={"/data": FsspecFilesystem("memory://planted-index")}, bm25=True)
    await arena.workspace.index("/data/notes.md", "again")
    await arena.close()
    arena.check_outside("the index opened a second time")


@attack(
    "index_dir_from_the_sandbox",
    finding="a command replaces .agentvfs, or plants links in it, before the host opens its index",
    severity="medium",
    requires=("fuse", "bwrap"),
)
async def index_dir_from_the_sandbox(arena: Arena) -> None:
    from ..vfs import FsspecFilesystem

    planted = arena.host / "planted"
    planted.mkdir()
    arena.snapshot()
    await arena.open(
        isolation="bwrap", mounts={"/data": FsspecFilesystem("memory://index-from-sandbox")}, bm25=True
    )
    index = arena.root / ".agentvfs"
    for command in (
        f"ln -sf {planted}/db {index}/search.duckdb",
        f"ln -sf {planted}/wal {index}/search.duckdb.wal",
        f"ln -sfn {planted} {index}/vectors",
        f"rm -rf {index} && ln -s {planted} {index}",
        f"mv {index} {arena.root}/moved && ln -s {planted} {index}",
    ):
        await arena.sh(command)
        arena.check_outside(f"the command {command!r}")
    await arena.workspace.index("/data/notes.md", "the index must not land on the host")
    found = await arena.workspace.search("index")
    arena.record(bool(found), f"the index did not work at all: {found!r}")
    # With the index open: links planted now would be followed by the next file it creates.
    for command in (
        f"rm -f {index}/search.duckdb.wal; ln -s {planted}/wal {index}/search.duckdb.wal",
        f"ln -s {planted}/tmp {index}/search.duckdb.tmp",
    ):
        await arena.sh(command)
    for round_ in range(20):
        await arena.workspace.index(f"/data/more-{round_}.md", "more words " * 200)
    await arena.close()
    arena.check_outside("the index written after links were planted in it")


@attack(
    "local_skill_source_swap",
    finding="a LocalSkillSource skill directory swapped for a link to the host, or a FIFO SKILL.md",
    severity="high",
)
async def local_skill_source_swap(arena: Arena) -> None:
    from ..skills import LocalSkillSource

    skill = arena.root / "skills" / "s"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: s\ndescription: A skill\n---\nBody.\n")
    (skill / "references" / "r.md").write_text("reference\n")
    (arena.host / "references").mkdir()
    (arena.host / "references" / "r.md").write_text("host file r\n")
    arena.snapshot()
    await arena.open(skills=["skills"], skill_source=LocalSkillSource(str(arena.root)))
    out = await arena.tool("skill_read", skillName="s", path="references/r.md")
    if "reference" not in out:
        raise RuntimeError(f"the skill is not readable to begin with: {out}")
    await arena.sh(f"rm -rf skills/s && ln -s {arena.host} skills/s")
    for path in ("secret.txt", "references/r.md", "tree/a.txt"):
        out = await arena.tool("skill_read", skillName="s", path=path)
        arena.check_secret(out, f"skill_read {path} through the swapped skill directory")
        arena.record(not _leaked(out), f"skill_read {path} read the host: {out[:120]!r}")
    out = await arena.tool("skill", name="s")
    arena.check_secret(out, "skill through the swapped directory")
    # A FIFO where a SKILL.md is expected must not hang discovery.
    fifo_skill = arena.root / "skills" / "f"
    fifo_skill.mkdir()
    os.mkfifo(fifo_skill / "SKILL.md")
    await arena.open(skills=["skills"], skill_source=LocalSkillSource(str(arena.root)), tools={"timeout_ms": 20_000})
    await _bounded(arena, "FIFO SKILL.md", 10, "skill_search", {"query": "anything"}, fifos=(fifo_skill / "SKILL.md",))
    await _bounded(arena, "FIFO SKILL.md", 10, "skill", {"name": "f"}, fifos=(fifo_skill / "SKILL.md",))
