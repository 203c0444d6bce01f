"""Exact outputs of chunking, the search tools and the sandbox tools, as the reference gives
them: chunk boundaries (with the trailing overlap chunk), search results over auto-indexed
files, search output that is never token-limited, and where ``Exit code`` goes after output
that ends in blank lines."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentvfs import LocalFilesystem, Workspace, WorkspaceTool
from agentvfs.sandbox import LocalSandbox
from agentvfs.search import Chunk, split_into_chunks
from agentvfs.search._chunking import _cut

pytestmark = pytest.mark.anyio

SEARCH = "mastra_workspace_search"
INDEX = "mastra_workspace_index"
EXECUTE = "mastra_workspace_execute_command"
OUTPUT = "mastra_workspace_get_process_output"


def _big_lines() -> list[str]:
    """300 lines of 41 characters, with a needle on line 150 and on the last line."""
    lines = [f"line {i:03d} of the big file, some words here" for i in range(300)]
    lines[149] = "the needle is here, in the middle".ljust(38, ".")
    lines[299] = "a last needle at the very end".ljust(38, ".")
    return lines


def _shape(chunks: Sequence[Chunk]) -> list[tuple[int, int, int]]:
    """Start line, length and number of lines of each chunk."""
    return [(c.start_line, len(c.content), len(c.content.split("\n"))) for c in chunks]


# -- chunking -------------------------------------------------------------------------------------


def test_a_300_line_file_has_a_trailing_chunk_of_its_last_lines() -> None:
    lines = _big_lines()
    text = "\n".join(lines) + "\n"
    chunks = split_into_chunks(text)
    assert _shape(chunks) == [
        (1, 3989, 95),
        (93, 3986, 95),
        (185, 3989, 95),
        (277, 1005, 25),
        (299, 81, 3),
    ]
    # The newline that ends the file leaves an empty last line, which the last chunks keep.
    assert chunks[-1] == Chunk(f"{lines[298]}\n{lines[299]}\n", 299)
    assert chunks[1].content == "\n".join(lines[92:187])


def test_without_a_final_newline_the_trailing_chunk_holds_three_real_lines() -> None:
    lines = _big_lines()
    chunks = split_into_chunks("\n".join(lines))
    assert _shape(chunks) == [
        (1, 3989, 95),
        (93, 3986, 95),
        (185, 3989, 95),
        (277, 1004, 24),
        (298, 122, 3),
    ]
    assert chunks[-1] == Chunk("\n".join(lines[297:]), 298)


def test_small_and_empty_texts_are_one_chunk() -> None:
    assert split_into_chunks("") == [Chunk("", 1)]
    assert split_into_chunks("x" * 4000) == [Chunk("x" * 4000, 1)]


def test_every_chunk_steps_back_three_lines_until_the_end() -> None:
    assert split_into_chunks("1\n2\n3\n4\n5\n6\n7\n8\n9", 7) == [
        Chunk("1\n2\n3\n4", 1),
        Chunk("2\n3\n4\n5", 2),
        Chunk("3\n4\n5\n6", 3),
        Chunk("4\n5\n6\n7", 4),
        Chunk("5\n6\n7\n8", 5),
        Chunk("6\n7\n8\n9", 6),
        Chunk("7\n8\n9", 7),
    ]
    assert split_into_chunks("1\n2\n3\n4\n5\n6\n7\n8\n9\n", 7, 0) == [
        Chunk("1\n2\n3\n4", 1),
        Chunk("5\n6\n7\n8", 5),
        Chunk("9\n", 9),
    ]


def test_an_over_long_line_is_cut_and_the_lines_before_it_repeat() -> None:
    text = "a\nb\nc\nd\n" + "x" * 25 + "\ne\nf\n"
    assert split_into_chunks(text, 10) == [
        Chunk("a\nb\nc\nd", 1),
        Chunk("b\nc\nd", 2),
        Chunk("x" * 10, 5),
        Chunk("x" * 10, 5),
        Chunk("x" * 5, 5),
        Chunk("e\nf\n", 6),
    ]


def test_lengths_are_utf16_code_units() -> None:
    assert len(split_into_chunks("\U0001f600" * 3, 6)) == 1
    assert split_into_chunks("\U0001f600" * 3 + "a", 6) == [
        Chunk("\U0001f600" * 3, 1),
        Chunk("a", 1),
    ]
    assert split_into_chunks("\U0001f600" * 5 + "\nab", 4) == [
        Chunk("\U0001f600" * 2, 1),
        Chunk("\U0001f600" * 2, 1),
        Chunk("\U0001f600", 1),
        Chunk("ab", 2),
    ]
    # A cut inside a surrogate pair leaves a replacement character on each side.
    assert split_into_chunks("\U0001f600" * 3, 3) == [
        Chunk("\U0001f600\ufffd", 1),
        Chunk("\ufffd\U0001f600", 1),
    ]


def _chunks_line_by_line(content: str, limit: int, overlap: int) -> list[Chunk]:
    """The chunking rule stated plainly, one line at a time (the oracle of the test below)."""
    def units(text: str) -> int:
        return len(text.encode("utf-16-le", "surrogatepass")) // 2

    if units(content) <= limit:
        return [Chunk(content, 1)]
    lines = content.split("\n")
    chunks: list[Chunk] = []
    start = 0
    while start < len(lines):
        end, size = start, 0
        while end < len(lines):
            extra = units(lines[end]) + (1 if end > start else 0)
            if end > start and size + extra > limit:
                break
            size += extra
            end += 1
        if size <= limit:
            chunks.append(Chunk("\n".join(lines[start:end]), start + 1))
        else:
            chunks.extend(Chunk(piece, start + 1) for piece in _cut(lines[start], limit))  # one line
        start = end - overlap if end - overlap > start else end
    return chunks


@pytest.mark.parametrize("seed", range(6))
def test_chunks_agree_with_the_rule_taken_line_by_line(seed: int) -> None:
    rng = random.Random(seed)
    pieces = ["", "a", "word", "x" * 30, "é", "\U0001f600", "ab\U0001f600cd", "y" * 95]
    for _ in range(150):
        lines = ["".join(rng.choice(pieces) for _ in range(rng.randrange(4))) for _ in range(rng.randrange(60))]
        text = "\n".join(lines) + rng.choice(["", "\n"])
        limit, overlap = rng.choice([1, 2, 5, 40, 100, 4000]), rng.choice([0, 1, 3, 7])
        assert split_into_chunks(text, limit, overlap) == _chunks_line_by_line(text, limit, overlap), (
            text, limit, overlap,
        )


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="max_chunk_chars"):
        split_into_chunks("abc", 0)
    with pytest.raises(ValueError, match="overlap_lines"):
        split_into_chunks("abc", 10, -1)


# -- search over auto-indexed files ----------------------------------------------------------------


@pytest.fixture
async def search_tools(tmp_path: Path) -> Any:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "big.txt").write_text("\n".join(_big_lines()) + "\n")
    (docs / "small.md").write_text("a small note\nwith a needle\n\n")
    (docs / "blob.bin").write_bytes(b"needle \xff\xfe\n")
    ws = Workspace(
        filesystem=LocalFilesystem(base_path=str(tmp_path)), bm25=True, auto_index_paths=["docs"]
    )
    await ws.init()
    try:
        yield ws, await ws.create_tools()
    finally:
        await ws.destroy()


async def _text(tool: WorkspaceTool, args: dict[str, Any]) -> str:
    answer = await tool.execute(args)
    assert isinstance(answer, str)
    return answer


async def test_search_finds_the_trailing_chunk_and_undecodable_files(search_tools: Any) -> None:
    ws, _ = search_tools
    results = await ws.search("needle", top_k=10)
    assert [(r.id, r.line_range) for r in results] == [
        ("docs/blob.bin", (1, 1)),
        ("docs/small.md", (2, 2)),
        ("docs/big.txt#chunk-4", (300, 300)),
        ("docs/big.txt#chunk-3", (300, 300)),
        ("docs/big.txt#chunk-1", (150, 150)),
    ]
    expected = [
        0.679468325039511,
        0.6759114904339864,
        0.6620488961807623,
        0.47465251414243353,
        0.2482935958541306,
    ]
    assert all(
        math.isclose(r.score, s, rel_tol=1e-12) for r, s in zip(results, expected, strict=True)
    )
    # Bytes that are not UTF-8 are read as U+FFFD, and the file is indexed all the same.
    assert results[0].content == "needle \ufffd\ufffd\n"


async def test_search_tool_output(search_tools: Any) -> None:
    _, tools = search_tools
    lines = _big_lines()
    last = await _text(tools[SEARCH], {"query": "last", "topK": 2})
    assert last == (
        f"docs/big.txt#chunk-4:300-300: {lines[298]}\n{lines[299]}\n\n"
        f"docs/big.txt#chunk-3:300-300: " + "\n".join(lines[276:]) + "\n\n"
        "---\n2 results (bm25 search)"
    )
    assert last.startswith(
        "docs/big.txt#chunk-4:300-300: line 298 of the big file, some words here\n"
        "a last needle at the very end.........\n\n"
        "docs/big.txt#chunk-3:300-300: line 276 of the big file, some words here\n"
    )
    assert await _text(tools[SEARCH], {"query": "zebra"}) == "---\n0 results (bm25 search)"
    assert (
        await _text(tools[SEARCH], {"query": "needle small", "topK": 1})
        == "docs/small.md:1-2: a small note\nwith a needle\n\n\n---\n1 result (bm25 search)"
    )


async def test_search_tool_output_is_never_token_limited(search_tools: Any) -> None:
    _, tools = search_tools
    answer = await _text(tools[SEARCH], {"query": "big file", "topK": 10})
    assert "output truncated" not in answer
    headers = re.findall(r"^(docs/\S+): line", answer, re.M)
    assert headers == [
        "docs/big.txt#chunk-0:1-95",
        "docs/big.txt#chunk-2:185-279",
        "docs/big.txt#chunk-1:93-187",
        "docs/big.txt#chunk-3:277-299",
        "docs/big.txt#chunk-4:299-299",
    ]
    assert answer.endswith("\n---\n5 results (bm25 search)")
    assert len(answer) == 13_228  # over 2,000 tokens, all of them shown


async def test_index_tool_then_search(search_tools: Any) -> None:
    _, tools = search_tools
    long = "\n".join(f"entry {i} omega{i % 7} text" for i in range(400))
    assert (
        await _text(tools[INDEX], {"path": "long.md", "content": long, "metadata": {"k": 1}})
        == "Indexed long.md"
    )
    answer = await _text(tools[SEARCH], {"query": "omega3 entry", "topK": 3})
    # Content given to the index tool is one document, however long.
    assert answer == f"long.md:1-400: {long}\n---\n1 result (bm25 search)"


# -- execute_command and get_process_output --------------------------------------------------------


@pytest.fixture
async def sandbox_tools(tmp_path: Path) -> Any:
    ws = Workspace(sandbox=LocalSandbox(working_directory=str(tmp_path)))
    try:
        yield await ws.create_tools()
    finally:
        await ws.destroy()


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("printf 'a\\n\\n'; exit 3", "a\n\nExit code: 3"),
        ("printf 'a\\n\\n\\n'; exit 3", "a\n\n\nExit code: 3"),
        ("printf 'a\\n'; exit 3", "a\n\nExit code: 3"),
        ("printf 'a'; exit 3", "a\n\nExit code: 3"),
        ("exit 2", "Exit code: 2"),
        ("true", "(no output)"),
        ("printf 'e\\n\\n' 1>&2; exit 1", "stderr:\ne\n\nExit code: 1"),
        ("printf 'e' 1>&2", "stderr:\ne"),
        (
            "printf 'o\\n\\n'; printf 'e\\n\\n' 1>&2; exit 5",
            "stdout:\no\n\n\n\nstderr:\ne\n\nExit code: 5",
        ),
        ("printf 'o'; printf 'e' 1>&2; exit 5", "stdout:\no\n\nstderr:\ne\n\nExit code: 5"),
        ("printf '\\n\\n'; exit 1", "\n\nExit code: 1"),
        ("printf '\\n'; exit 1", "\n\nExit code: 1"),
        ("printf '\\n' 1>&2; exit 1", "stderr:\n\nExit code: 1"),
        ("seq 1 5; exit 1", "1\n2\n3\n4\n5\n\nExit code: 1"),
        ("seq 1 10 | tail -n 2", "[showing last 2 of 10 lines]\n9\n10\n"),
    ],
)
async def test_execute_command_output(sandbox_tools: Any, command: str, expected: str) -> None:
    assert await _text(sandbox_tools[EXECUTE], {"command": command}) == expected


async def test_execute_command_tail_and_timeout(sandbox_tools: Any) -> None:
    tail = await _text(
        sandbox_tools[EXECUTE], {"command": "seq 1 10; printf '\\n'; exit 7", "tail": 3}
    )
    assert tail == "[showing last 3 of 11 lines]\n9\n10\n\nExit code: 7"
    timed_out = await _text(
        sandbox_tools[EXECUTE],
        {"command": "echo start; printf 'x\\n\\n' 1>&2; sleep 5", "timeout": 1},
    )
    assert (
        timed_out
        == "stdout:\nstart\n\n\nstderr:\nx\n\n\nProcess timed out after 1000ms\n\nExit code: 124"
    )


async def test_get_process_output_of_a_finished_process(sandbox_tools: Any) -> None:
    started = await _text(
        sandbox_tools[EXECUTE], {"command": "sleep 0.2; exit 4", "background": True}
    )
    pid = re.fullmatch(r"Started background process \(PID: (\d+)\)", started)
    assert pid is not None
    # Without output the exit code is shown alone (deliberately: the reference says
    # "(no output yet)", as if the process still ran).
    assert await _text(sandbox_tools[OUTPUT], {"pid": pid[1], "wait": True}) == "Exit code: 4"
    started = await _text(
        sandbox_tools[EXECUTE],
        {"command": "sleep 0.2; printf 'a\\n\\n'; exit 4", "background": True},
    )
    pid = re.fullmatch(r"Started background process \(PID: (\d+)\)", started)
    assert pid is not None
    # Here a blank line always separates the status, however the output ends.
    assert (
        await _text(sandbox_tools[OUTPUT], {"pid": pid[1], "wait": True}) == "a\n\n\n\nExit code: 4"
    )
