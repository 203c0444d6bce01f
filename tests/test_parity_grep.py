"""``mastra_workspace_grep`` output against the reference's, byte for byte.

The expected outputs are what Mastra 1.71.0 (on Node.js, over its ``LocalFilesystem``) prints
for the same files and calls: columns and the 500-unit cut of match lines count UTF-16 code
units (a cut through a surrogate pair prints U+FFFD), context lines are whole, and files come
in the order of a depth-first walk that lists each directory in byte order. Names with glob
characters are read as they are, on every backend.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import regex

from agentvfs import WORKSPACE_TOOLS, Workspace, WorkspaceTool
from agentvfs.testing import Harness, local_harness
from agentvfs.tools import _search_files
from agentvfs.tools._jsregex import translate
from agentvfs.vfs import read_many
from conftest import file_harness, memory_harness

pytestmark = pytest.mark.anyio
GREP = WORKSPACE_TOOLS.FILESYSTEM.GREP

ORDER = [
    "a/x.txt",
    "a-b.txt",
    "a.txt",
    "B.txt",
    "b.txt",
    "é.txt",
    "sp ace.txt",
    "sp/x.txt",
    "a b/x.txt",
    "A/z.txt",
    "Z.txt",
    "_u.txt",
    "[br]ackets.md",
    "b.md",
    "[b].md",
    "q?.txt",
    "a*b.txt",
    "{x,y}.txt",
    "d[1]/in.txt",
    "a/B/c.txt",
    "a/b/c.txt",
    "a/b.txt",
    "日本.txt",
    "Ω/o.txt",
]

FILES = {
    "emoji.txt": (
        "ab😀cd X\n" + "😀" * 260 + "X\n" + "a" * 499 + "😀Xb\n" + "a" * 498 + "😀X\n"
        "ctx " + "y" * 600 + "\nZ" + "q" * 600 + "\n" + "😀" * 300 + "\n"
    ),
    "crlf.txt": "alpha\r\nbeta x\r\ngamma\r\n",
    "uni.md": "Straße \u017ftop STOP\nKelvin \u212a and k\n😀😀 end\n\ttab\xa0nbsp\n\ufeffbom\n",
    **{name: "hit\n" for name in ORDER},
}

CASES = [
    (
        {"pattern": "X", "path": "emoji.txt"},
        [
            "4 matches across 1 file",
            "---",
            "emoji.txt:1:8: ab😀cd X",
            "emoji.txt:2:521: " + "😀" * 250 + "...",
            "emoji.txt:3:502: " + "a" * 499 + "\ufffd...",
            "emoji.txt:4:501: " + "a" * 498 + "😀...",
        ],
    ),
    (
        {"pattern": "Z", "path": "emoji.txt", "contextLines": 1},
        [
            "1 match across 1 file",
            "---",
            "emoji.txt:5- ctx " + "y" * 600,
            "emoji.txt:6:1: Z" + "q" * 499 + "...",
            "emoji.txt:7- " + "😀" * 300,
        ],
    ),
    (
        {"pattern": "ctx", "path": "emoji.txt", "contextLines": 2},
        [
            "1 match across 1 file",
            "---",
            "emoji.txt:3- " + "a" * 499 + "😀Xb",
            "emoji.txt:4- " + "a" * 498 + "😀X",
            "emoji.txt:5:1: ctx " + "y" * 496 + "...",
            "emoji.txt:6- Z" + "q" * 600,
            "emoji.txt:7- " + "😀" * 300,
        ],
    ),
    (
        {"pattern": "hit"},
        [
            "24 matches across 24 files",
            "---",
            "./A/z.txt:1:1: hit",
            "./B.txt:1:1: hit",
            "./Z.txt:1:1: hit",
            "./[b].md:1:1: hit",
            "./[br]ackets.md:1:1: hit",
            "./_u.txt:1:1: hit",
            "./a/B/c.txt:1:1: hit",
            "./a/b/c.txt:1:1: hit",
            "./a/b.txt:1:1: hit",
            "./a/x.txt:1:1: hit",
            "./a b/x.txt:1:1: hit",
            "./a*b.txt:1:1: hit",
            "./a-b.txt:1:1: hit",
            "./a.txt:1:1: hit",
            "./b.md:1:1: hit",
            "./b.txt:1:1: hit",
            "./d[1]/in.txt:1:1: hit",
            "./q?.txt:1:1: hit",
            "./sp/x.txt:1:1: hit",
            "./sp ace.txt:1:1: hit",
            "./{x,y}.txt:1:1: hit",
            "./é.txt:1:1: hit",
            "./Ω/o.txt:1:1: hit",
            "./日本.txt:1:1: hit",
        ],
    ),
    (
        {"pattern": "hit", "path": "a"},
        [
            "4 matches across 4 files",
            "---",
            "a/B/c.txt:1:1: hit",
            "a/b/c.txt:1:1: hit",
            "a/b.txt:1:1: hit",
            "a/x.txt:1:1: hit",
        ],
    ),
    (
        {"pattern": "hit", "path": "**/*.md"},
        [
            "3 matches across 3 files",
            "---",
            "./[b].md:1:1: hit",
            "./[br]ackets.md:1:1: hit",
            "./b.md:1:1: hit",
        ],
    ),
    (
        {"pattern": "x$"},
        [
            "0 matches across 0 files",
            "---",
        ],
    ),
    (
        {"pattern": "a\\r$"},
        [
            "2 matches across 1 file",
            "---",
            "./crlf.txt:1:5: alpha\r",
            "./crlf.txt:3:5: gamma\r",
        ],
    ),
    (
        {"pattern": ".$", "path": "crlf.txt"},
        [
            "0 matches across 0 files",
            "---",
        ],
    ),
    (
        {"pattern": "s", "caseSensitive": False, "path": "uni.md"},
        [
            "2 matches across 1 file",
            "---",
            "uni.md:1:1: Straße \u017ftop STOP",
            "uni.md:4:8: \ttab\xa0nbsp",
        ],
    ),
    (
        {"pattern": "k", "caseSensitive": False, "path": "uni.md"},
        [
            "1 match across 1 file",
            "---",
            "uni.md:2:1: Kelvin \u212a and k",
        ],
    ),
    (
        {"pattern": "^\\s", "path": "uni.md"},
        [
            "2 matches across 1 file",
            "---",
            "uni.md:4:1: \ttab\xa0nbsp",
            "uni.md:5:1: \ufeffbom",
        ],
    ),
    (
        {"pattern": "^.{4} end", "path": "uni.md"},
        [
            "1 match across 1 file",
            "---",
            "uni.md:3:1: 😀😀 end",
        ],
    ),
    (
        {"pattern": "\\uD83D\\uDE00 e", "path": "uni.md"},
        [
            "1 match across 1 file",
            "---",
            "uni.md:3:3: 😀😀 end",
        ],
    ),
    (
        {"pattern": "(?<w>[a-z])\\k<w>", "path": "uni.md"},
        [
            "0 matches across 0 files",
            "---",
        ],
    ),
    (
        {"pattern": "\\bk\\b|\\Aand", "path": "uni.md"},
        [
            "1 match across 1 file",
            "---",
            "uni.md:2:14: Kelvin \u212a and k",
        ],
    ),
]


#: Names that fsspec's batch reads would take as glob patterns.
GLOB_NAMES = ["[br]ackets.md", "[b].md", "b.md", "q?.txt", "a*b.txt", "{x,y}.txt", "d[1]/in.txt", "d1/in.txt"]


def harness(kind: str, tmp_path: Path) -> Harness:
    if kind == "local":
        base = tmp_path / "base"
        base.mkdir()
        return local_harness(str(base))
    if kind == "file":
        return file_harness(tmp_path)
    return memory_harness()


@pytest.fixture(params=["local", "memory", "file"])
async def tools(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, WorkspaceTool]:
    h = harness(request.param, tmp_path)
    for name, text in FILES.items():
        h.put(name, text.encode())
    return await Workspace(filesystem=h.fs, tools={GREP: {"max_output_tokens": 10**6}}).create_tools()


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[str(i) for i in range(len(CASES))])
async def test_grep_prints_what_the_reference_prints(
    tools: dict[str, WorkspaceTool], args: dict[str, Any], expected: list[str]
) -> None:
    assert await tools[GREP].execute(args) == "\n".join(expected)


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[str(i) for i in range(len(CASES))])
async def test_grep_in_ranges_prints_the_same(
    tools: dict[str, WorkspaceTool], args: dict[str, Any], expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Files read in small ranges: columns, cuts and the context carried across ranges hold.
    monkeypatch.setattr(_search_files, "GREP_CHUNK", 64)
    assert await tools[GREP].execute(args) == "\n".join(expected)


async def test_the_length_limit_counts_code_units(tools: dict[str, WorkspaceTool]) -> None:
    assert await tools[GREP].execute({"pattern": "😀" * 500}) == "0 matches across 0 files\n---"
    assert await tools[GREP].execute({"pattern": "😀" * 501}) == (
        "Error: Pattern too long (1002 chars, max 1000). Use a shorter pattern."
    )


@pytest.mark.parametrize("kind", ["local", "memory", "file"])
async def test_read_many_takes_glob_characters_literally(kind: str, tmp_path: Path) -> None:
    h = harness(kind, tmp_path)
    for name in GLOB_NAMES:
        h.put(name, f"in {name}\n".encode())
    for bound in (None, 1000):
        got = await read_many(h.fs, GLOB_NAMES, max_bytes=bound)
        assert got == {name: f"in {name}\n".encode() for name in GLOB_NAMES}, bound
    tools = await Workspace(filesystem=h.fs).create_tools()
    assert await tools[GREP].execute({"pattern": "in "}) == "\n".join(
        [
            "8 matches across 8 files",
            "---",
            "./[b].md:1:1: in [b].md",
            "./[br]ackets.md:1:1: in [br]ackets.md",
            "./a*b.txt:1:1: in a*b.txt",
            "./b.md:1:1: in b.md",
            "./d1/in.txt:1:1: in d1/in.txt",
            "./d[1]/in.txt:1:1: in d[1]/in.txt",
            "./q?.txt:1:1: in q?.txt",
            "./{x,y}.txt:1:1: in {x,y}.txt",
        ]
    )


# --- ignoring case through the engine's own flag ------------------------------------------


@pytest.mark.parametrize(
    "pattern", ["todo", "TODO", "a.b", "foo|bar", "x\\.y", "^#", "error$", "(ab|cd)+", "a{2,3}", "y?z+", "e.r"]
)
def test_case_insensitive_fast_path_matches_as_javascript_does(pattern: str) -> None:
    exact = translate(pattern)
    assert _search_files._folds_alike(exact)
    fast = regex.compile(exact, regex.VERSION0 | regex.IGNORECASE)
    spelled = regex.compile(translate(pattern, ignore_case=True), regex.VERSION0)
    rng = random.Random(pattern)
    # The characters where folding differs between the engine and JavaScript, among others.
    alphabet = "abcdeortxyzABCDEORTXYZ .#\u017f\u212a\u0130\u0131\u00e9\u00c9\u00df\u1e9e\u03c3\u03c2"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert [m.span() for m in fast.finditer(text)] == [m.span() for m in spelled.finditer(text)], text


@pytest.mark.parametrize("pattern", ["test", "\\w+", "[a-z]", "kind", "I", "(a)\\1", "\\u0073", "é"])
def test_case_insensitive_fast_path_is_not_taken_where_folding_differs(pattern: str) -> None:
    assert not _search_files._folds_alike(translate(pattern))
