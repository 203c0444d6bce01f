"""Attacks on the tools' bounds: regex bombs, huge and sparse files, huge skill references,
and small files exchanged for huge ones between the size check and the read.

The agent controls every tool input and every file it can write, so a tool must answer in
bounded time and memory whatever it is given. Time is checked against the tool's own limit
(grep's ``match_timeout_ms``, a deadline for the whole call) plus :data:`TIME_SLACK`, with an
event loop ticking meanwhile; memory as the growth of the process's peak RSS during one call
(the high-water mark is reset through ``/proc/self/clear_refs``), which must stay under
:data:`RSS_BOUND`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.to_thread

from ._adversary import Arena, attack

__all__ = ["RSS_BOUND", "TIME_SLACK", "peak_rss_growth"]

#: Peak RSS a single tool call may add, whatever the size of the file it is given.
RSS_BOUND = 200 * 1024 * 1024
#: Seconds a bounded call may take beyond its own limit: the answer built from what was
#: found, and a loaded machine's delays in handing it back (a 2-core machine at load 10).
#: The limit itself covers everything else, however many files and however busy the CPU.
TIME_SLACK = 1.0
#: The longest the event loop may go without running another task during a call.
MAX_LOOP_GAP = 0.5

GIB = 1 << 30
_GREP = "mastra_workspace_grep"
# A grep answer (a summary line), not an error or a hang.
_ANSWER = re.compile(r"\d+ match(es)? across \d+ files?")


def _status_bytes(key: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> int:
    """Reset the peak RSS to the current RSS (Linux 4.0+) and return the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


@contextlib.contextmanager
def peak_rss_growth() -> Iterator[list[int]]:
    """How many bytes the process's peak RSS grew by inside the block, in ``box[0]`` (the
    high-water mark is reset first through ``/proc/self/clear_refs``; Linux 4.0+). Unlike
    ``tracemalloc`` it sees every allocation and every page touched, in all threads."""
    box = [0]
    before = _reset_peak()
    try:
        yield box
    finally:
        box[0] = _status_bytes("VmHWM") - before


async def _bounded(arena: Arena, tool: str, **args: Any) -> str:
    """Run one tool call; record it held when the peak RSS grew by less than RSS_BOUND."""
    what = f"{tool} {args}"[:200]
    before = _reset_peak()
    out = await arena.tool(tool, **args)
    growth = _status_bytes("VmHWM") - before
    arena.record(growth < RSS_BOUND, f"{what}: peak RSS grew by {growth / (1 << 20):.0f} MiB (bound {RSS_BOUND >> 20} MiB)")
    return out


async def _ticking(arena: Arena, tool: str, **args: Any) -> tuple[str, float, float]:
    """Run one tool call beside a task sleeping 10 ms at a time: the result, the seconds it
    took and the longest gap between two ticks of that task."""
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await anyio.sleep(0.01)

    started = time.monotonic()
    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        out = await arena.tool(tool, **args)
        group.cancel_scope.cancel()
    elapsed = time.monotonic() - started
    ticks.append(time.monotonic())
    gap = max((b - a for a, b in itertools.pairwise(ticks)), default=elapsed)
    return out, elapsed, gap


#: (pattern, the line that makes it backtrack): nested and overlapping quantifiers, each
#: reaching the search through a different path (block, lookaround prefilter, line by line).
_BOMBS: list[tuple[str, str]] = [
    (r"(a+)+$", "a" * 40 + "!"),
    (r"(a|a)+$", "a" * 40 + "!"),
    (r"(a|aa)+$", "a" * 60 + "!"),
    (r"^(a|a?)+$", "a" * 40 + "!"),
    (r"(x+x+)+y", "x" * 60),
    (r"(?<=b|^)(a|aa)+$", "a" * 60 + "!"),
    (r"(?!q)(a|aa)+$", "a" * 60 + "!"),
    (r"(A|AA)+$", "a" * 60 + "!"),
    (r".*.*.*=.*;", "x" * 50_000),
    (r"^(\w+\s?)*$", "word " * 30 + "!"),
]


@attack(
    "grep_regex_bombs",
    finding="catastrophic regex patterns in grep hold the process (re keeps the GIL): 47 s of CPU and counting",
    severity="medium",
)
async def grep_regex_bombs(arena: Arena) -> None:
    limit_ms = 1000
    await arena.open(tools={_GREP: {"match_timeout_ms": limit_ms}})
    for index, (_, line) in enumerate(_BOMBS):
        await arena.tool("write_file", path=f"bombs/{index}.txt", content=(line + "\n") * 20)
    for index, (pattern, _) in enumerate(_BOMBS):
        case_sensitive = not pattern.startswith("(A|")
        out, elapsed, gap = await _ticking(
            arena, "grep", pattern=pattern, path=f"bombs/{index}.txt", caseSensitive=case_sensitive
        )
        arena.record(
            elapsed <= limit_ms / 1000 + TIME_SLACK, f"grep {pattern!r} took {elapsed:.1f} s (limit {limit_ms} ms)"
        )
        arena.record(gap <= MAX_LOOP_GAP, f"grep {pattern!r}: the event loop stalled for {gap:.2f} s")
        arena.record(bool(_ANSWER.match(out)), f"grep {pattern!r} answered {out[:200]!r}")
    # The default limit holds too, on a whole directory of bombs: for all of the call's
    # matching, in wall-clock time, on a busy machine as on an idle one (without the limit
    # this takes minutes).
    await arena.open()
    out, elapsed, gap = await _ticking(arena, "grep", pattern=r"(a|aa)+$", path="bombs")
    arena.record(elapsed <= 5 + TIME_SLACK, f"grep with the default limit took {elapsed:.1f} s")
    arena.record(gap <= MAX_LOOP_GAP, f"grep with the default limit: the event loop stalled for {gap:.2f} s")
    arena.record("search stopped after 5 s of matching" in out, f"grep with the default limit said {out[:300]!r}")


@attack(
    "grep_pattern_compile_bombs",
    finding="patterns whose counted repeats or nesting cost gigabytes or a crash to compile (regex unrolls counted repeats)",
    severity="medium",
)
async def grep_pattern_compile_bombs(arena: Arena) -> None:
    await arena.open()
    await arena.tool("write_file", path="a.txt", content="a" * 100 + "\n")
    await arena.tool("grep", pattern="a", path="a.txt")  # tiktoken's tables, once
    for pattern in (
        "(?:(?:a{999}){999}){999}",
        "(?:a{1000}){1000}",
        "(?:[ab]{900}){900}",
        "(" * 450 + "a" + ")" * 450,
        "(?:(?:(?:(?:a{30}){30}){30}){30})",
    ):
        started = time.monotonic()
        out = await _bounded(arena, "grep", pattern=pattern, path="a.txt")
        elapsed = time.monotonic() - started
        arena.record(elapsed < TIME_SLACK, f"grep {pattern[:40]!r} took {elapsed:.1f} s to answer")
        answered = out.startswith("Error: Invalid regex pattern:") or bool(_ANSWER.match(out))
        arena.record(answered, f"grep {pattern[:40]!r} answered {out[:200]!r}")


def _sparse(path: str, size: int, head: bytes = b"") -> None:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


@attack(
    "huge_sparse_files",
    finding="read_file with an encoding, edit_file and grep read whole files: a sparse 1 GiB file took 3.9 GiB of RSS, then SIGABRT",
    severity="medium",
)
async def huge_sparse_files(arena: Arena) -> None:
    await arena.open(tools={_GREP: {"max_file_bytes": 2 * GIB}})
    # The agent makes them with the shell: 1 GiB each, no disk space.
    out = await arena.sh(
        "truncate -s 1G zeros.bin && printf 'TODO head\\n' > big.txt && truncate -s 1G big.txt "
        "&& truncate -s 1G image.png && mkdir -p sub && truncate -s 1G sub/.gitignore && echo made"
    )
    if "made" not in out:
        # No shell here: the agent could do the same with any program; make them directly.
        _sparse(str(arena.root / "zeros.bin"), GIB)
        _sparse(str(arena.root / "big.txt"), GIB, b"TODO head\n")
        _sparse(str(arena.root / "image.png"), GIB)
        os.makedirs(arena.root / "sub", exist_ok=True)
        _sparse(str(arena.root / "sub" / ".gitignore"), GIB)
    _sparse(str(arena.root / ".gitignore"), GIB, b"ignored/\n")
    await arena.tool("read_file", path="big.txt", limit=1)  # tiktoken's tables, once
    limit = 2000 * 128 + 4096  # characters 2,000 tokens can show at most, and a margin
    for path in ("zeros.bin", "big.txt", "image.png"):
        for encoding in (None, "base64", "hex", "binary", "utf-8"):
            args: dict[str, Any] = {"path": path} if encoding is None else {"path": path, "encoding": encoding}
            text = await _bounded(arena, "read_file", **args)
            arena.record(len(text) < 2 * limit, f"read_file {path} {encoding} returned {len(text)} characters")
    await _bounded(arena, "read_file", path="big.txt", offset=2, limit=5)
    edit = await _bounded(arena, "edit_file", path="big.txt", old_string="TODO", new_string="DONE")
    arena.record(edit.startswith("ValueError:") and "larger than edit_file edits" in edit, f"edit_file answered {edit[:200]!r}")
    arena.record((arena.root / "big.txt").stat().st_size == GIB, "edit_file changed big.txt")
    found = await _bounded(arena, "grep", pattern="TODO", path="big.txt")
    arena.record(found.startswith("1 match across 1 file"), f"grep big.txt answered {found[:200]!r}")
    everything = await _bounded(arena, "grep", pattern="TODO|\\x00{10}", path=".")
    arena.record(len(everything) < 2 * limit, f"grep . returned {len(everything)} characters")
    listing = await _bounded(arena, "list_files", path=".", showHidden=True)
    arena.record("big.txt" in listing, f"list_files answered {listing[:200]!r}")


@attack(
    "skill_read_huge_reference",
    finding="skill_read has no token limit and reads the whole file (24 MB returned)",
    severity="medium",
)
async def skill_read_huge_reference(arena: Arena) -> None:
    references = arena.root / "skills" / "big" / "references"
    references.mkdir(parents=True)
    (references.parent / "SKILL.md").write_text("---\nname: big\ndescription: A skill with big references\n---\nRead the references.\n")
    line = "Reference text that an agent was told to read in full, again and again.\n"
    (references / "24mb.md").write_text(line * (24_000_000 // len(line)))
    (references / "6mb.md").write_text(line * (6_000_000 // len(line)))
    _sparse(str(references / "sparse.md"), GIB, b"# sparse\n")
    tools = await arena.open(skills=["skills"])
    await tools["skill_read"].execute({"skillName": "big", "path": "references/6mb.md", "startLine": 1, "endLine": 1})
    limit = 20_000 * 128 + 4096  # characters the default 20,000 tokens can show at most
    for name in ("24mb.md", "6mb.md", "sparse.md"):
        for extra in ({}, {"startLine": 2}, {"startLine": 10, "endLine": 70_000}):
            args = {"skillName": "big", "path": f"references/{name}", **extra}
            text = await _bounded(arena, "skill_read", **args)
            arena.record(len(text) < limit, f"skill_read {name} {extra} returned {len(text)} characters")
            arena.record(arena.secret not in text, f"skill_read {name} showed the secret")


class _Exchange:
    """A racer run through ``execute_command`` (inside the sandbox, as the agent can) that
    exchanges a small file with a sparse 1 GiB one, ``renameat2(RENAME_EXCHANGE)`` in a loop:
    a listing or ``stat`` shows one size, the read that follows may meet the other file."""

    def __init__(self, arena: Arena, small: str, content: str) -> None:
        self.arena = arena
        self.small = arena.root / small
        self.big = self.small.with_name("swap.dat")
        self.stop = self.small.with_name("stop")
        self.content = content

    async def plant(self) -> None:
        """The small file with a tool, the big one with the shell (directly where there is none)."""
        arena = self.arena
        where = self.small.parent.relative_to(arena.root)
        await arena.tool("write_file", path=f"{where}/{self.small.name}", content=self.content)
        out = await arena.sh(f"truncate -s 1G {where}/swap.dat && echo made")
        if "made" not in out:
            _sparse(str(self.big), GIB)

    @contextlib.asynccontextmanager
    async def running(self, seconds: float) -> AsyncIterator[None]:
        async with self.arena.exchanging(self.small, self.big, seconds=seconds):
            yield


@attack(
    "grep_file_swapped_after_listing",
    finding="grep read a file whole by the size its listing showed: a 6-byte file exchanged for a sparse 1 GiB one grew RSS by 2 GiB",
    severity="medium",
)
async def grep_file_swapped_after_listing(arena: Arena) -> None:
    await arena.open()
    race = _Exchange(arena, "race-grep/f.txt", "small\n")
    await race.plant()
    await arena.tool("grep", pattern="zzzz", path="race-grep")  # tiktoken's tables, once
    async with race.running(30):
        for _ in arena.iterations(150, seconds=15):
            out = await _bounded(arena, "grep", pattern="zzzz", path="race-grep")
            arena.record(bool(_ANSWER.match(out)), f"grep answered {out[:200]!r}")


@attack(
    "skill_read_file_swapped_after_stat",
    finding="skill_read checked a file's size with stat, then read it whole: exchanged for a sparse 1 GiB one in between, RSS grew by 2 GiB",
    severity="medium",
)
async def skill_read_file_swapped_after_stat(arena: Arena) -> None:
    skill = arena.root / "skills" / "swap"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: swap\ndescription: A skill whose reference is swapped\n---\nRead r.md.\n")
    await arena.open(skills=["skills"])
    race = _Exchange(arena, "skills/swap/references/r.md", "small reference\n")
    await race.plant()
    await arena.tool("skill_read", skillName="swap", path="references/r.md")  # tiktoken's tables, once
    async with race.running(30):
        for _ in arena.iterations(150, seconds=15):
            out = await _bounded(arena, "skill_read", skillName="swap", path="references/r.md")
            answered = out.startswith(("small reference", 'File "references/r.md" in skill "swap" is'))
            arena.record(answered, f"skill_read answered {out[:200]!r}")
