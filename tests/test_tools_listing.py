"""list_files against the reference's golden trees (fixture B), on every backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentvfs import WORKSPACE_TOOLS, Workspace, WorkspaceTool
from conftest import BACKENDS, harness_for

pytestmark = pytest.mark.anyio
LIST = WORKSPACE_TOOLS.FILESYSTEM.LIST_FILES

FIXTURE_B = {
    "src/index.ts": b'import { a } from "./a";\n// TODO: fix\nexport const x = 1;\n',
    "src/a.ts": b"export const a = 1;\n// todo lower\nfunction foo() {}\n",
    "src/util/helpers.ts": b'export function helper() { return "TODO"; }\n',
    "src/util/deep/deeper/z.ts": b"TODO deep\n",
    "src/App.tsx": b"const App = () => null; // TODO\n",
    "README.md": b"# Title\nSome TODO text\n",
    ".env": b"SECRET=1\n",
    ".hidden/h.txt": b"TODO in hidden\n",
    "dist/out.js": b"TODO dist\n",
    "node_modules/pkg/index.js": b"TODO module\n",
    ".gitignore": b"dist/\nnode_modules\n",
    ".git/config": b"[core]\n",
    "img.png": b"TODO png",
    "ctx.txt": "".join(
        f"MATCH {'abc'[[3, 8, 14].index(i)]}\n" if i in (3, 8, 14) else f"l{i}\n" for i in range(1, 16)
    ).encode(),
}


@pytest.fixture(params=BACKENDS)
async def tools(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, WorkspaceTool]:
    harness = harness_for(request.param, request, tmp_path)
    for name, data in FIXTURE_B.items():
        harness.put(name, data)
    return await Workspace(filesystem=harness.fs).create_tools()


async def ls(tools: dict[str, WorkspaceTool], **args: Any) -> str:
    return str(await tools[LIST].execute(args))


async def test_default_tree(tools: dict[str, WorkspaceTool]) -> None:
    assert await ls(tools) == (
        ".\nsrc\n\tutil\n\tApp.tsx\n\ta.ts\n\tindex.ts\nREADME.md\nctx.txt\nimg.png\n\n"
        "2 directories, 6 files (truncated at depth 2)"
    )


async def test_depth_dirs_only_and_patterns(tools: dict[str, WorkspaceTool]) -> None:
    assert await ls(tools, path="src", maxDepth=5) == (
        ".\nutil\n\tdeep\n\t\tdeeper\n\t\t\tz.ts\n\thelpers.ts\nApp.tsx\na.ts\nindex.ts\n\n3 directories, 5 files"
    )
    assert await ls(tools, path=".", dirsOnly=True, maxDepth=5) == (
        ".\nsrc\n\tutil\n\t\tdeep\n\t\t\tdeeper\n\n4 directories, 0 files"
    )
    flat = await ls(tools, path="src", pattern="*.ts", maxDepth=5)
    assert flat.endswith("\n\n3 directories, 2 files") and "\na.ts" in flat and "helpers.ts" not in flat
    assert (await ls(tools, path="src", pattern="**/*.ts", maxDepth=5)).endswith("3 directories, 4 files")
    assert (await ls(tools, path="src", pattern=["**/*.tsx", "a.ts"], maxDepth=5)).endswith("3 directories, 2 files")
    assert (await ls(tools, path="src", pattern="  ", maxDepth=5)).endswith("3 directories, 5 files")
    assert (await ls(tools, path="src", extension="tsx", maxDepth=5)).endswith("3 directories, 1 file")
    assert (await ls(tools, path="src", exclude="util|App", maxDepth=5)) == ".\na.ts\nindex.ts\n\n0 directories, 2 files"


async def test_hidden_and_gitignore(tools: dict[str, WorkspaceTool]) -> None:
    hidden = await ls(tools, path=".", showHidden=True)
    assert hidden.endswith("3 directories, 9 files (truncated at depth 2)")
    assert "\n.hidden\n" in hidden and "\n.env\n" in hidden and "\n.gitignore\n" in hidden
    assert ".git\n" not in hidden.replace(".gitignore", "")
    unfiltered = await ls(tools, path=".", respectGitignore=False, maxDepth=1)
    assert "\ndist\n" in unfiltered and "\nnode_modules\n" in unfiltered
    assert await ls(tools, path="dist") == ".\nout.js\n\n0 directories, 1 file"


async def test_errors(tools: dict[str, WorkspaceTool]) -> None:
    with pytest.raises(FileNotFoundError):
        await ls(tools, path="nope")
    with pytest.raises(NotADirectoryError):
        await ls(tools, path="README.md")
    with pytest.raises(ValueError, match="field 'maxDepth' must be at least 1"):
        await ls(tools, maxDepth=0)


async def test_token_limit(tmp_path: Path) -> None:
    for i in range(400):
        (tmp_path / f"file-with-a-long-descriptive-name-{i:04d}.txt").write_text("x")
    from agentvfs import LocalFilesystem

    tools = await Workspace(filesystem=LocalFilesystem(tmp_path)).create_tools()
    out = await ls(tools)
    assert "\n[output truncated: showing first ~1000 of ~" in out and out.startswith(".\nfile-with")


GREP = WORKSPACE_TOOLS.FILESYSTEM.GREP


async def grep(tools: dict[str, WorkspaceTool], **args: Any) -> str:
    return str(await tools[GREP].execute(args))


async def test_grep_goldens(tools: dict[str, WorkspaceTool]) -> None:
    assert await grep(tools, pattern="TODO") == (
        "5 matches across 5 files\n---\n"
        "./README.md:2:6: Some TODO text\n"
        "./src/App.tsx:1:28: const App = () => null; // TODO\n"
        "./src/index.ts:2:4: // TODO: fix\n"
        "./src/util/deep/deeper/z.ts:1:1: TODO deep\n"
        './src/util/helpers.ts:1:36: export function helper() { return "TODO"; }'
    )
    lower = await grep(tools, pattern="todo", caseSensitive=False, path="src")
    assert lower.startswith("5 matches across 5 files\n---\n") and "src/a.ts:2:4: // todo lower" in lower
    hidden = await grep(tools, pattern="TODO", includeHidden=True)
    assert hidden.startswith("6 matches across 6 files\n---\n./.hidden/h.txt:1:1: TODO in hidden\n")
    assert await grep(tools, pattern="TODO", path="src/**/*.tsx") == (
        "1 match across 1 file\n---\nsrc/App.tsx:1:28: const App = () => null; // TODO"
    )
    assert await grep(tools, pattern="MATCH", path="ctx.txt", maxCount=1) == "1 match across 1 file\n---\nctx.txt:3:1: MATCH a"


async def test_grep_context_hunks(tools: dict[str, WorkspaceTool]) -> None:
    out = await grep(tools, pattern="MATCH", path="ctx.txt", contextLines=2)
    lines = out.split("\n")
    assert lines[:3] == ["3 matches across 1 file", "---", "ctx.txt:1- l1"]
    assert "ctx.txt:3:1: MATCH a" in lines and "ctx.txt:8:1: MATCH b" in lines and "ctx.txt:14:1: MATCH c" in lines
    gap = lines.index("--")
    assert lines[gap - 1] == "ctx.txt:10- l10" and lines[gap + 1] == "ctx.txt:12- l12"
    assert lines[-1] == "ctx.txt:16- "


async def test_grep_errors_and_summaries(tools: dict[str, WorkspaceTool]) -> None:
    assert (await grep(tools, pattern="(")).startswith("Error: Invalid regex pattern:")
    assert await grep(tools, pattern="x" * 1001) == "Error: Pattern too long (1001 chars, max 1000). Use a shorter pattern."
    assert await grep(tools, pattern="TODO", path="nope") == "0 matches across 0 files (target path not found: nothing searched)\n---"
    assert await grep(tools, pattern="TODO", path="img.png") == "0 matches across 0 files (1 file skipped: unsupported extension)\n---"
    assert await grep(tools, pattern="no such text anywhere") == "0 matches across 0 files\n---"
    assert (await grep(tools, pattern="TODO", path="dist")).startswith("1 match across 1 file\n---\ndist/out.js:1:1:")
    assert await grep(tools, pattern=r"(?<word>TO)DO deep\k<word>?") != ""  # JavaScript named groups work


async def test_grep_total_cap(tmp_path: Path) -> None:
    from agentvfs import LocalFilesystem

    (tmp_path / "many.txt").write_text("hit\n" * 1200)
    tools = await Workspace(filesystem=LocalFilesystem(tmp_path), tools={GREP: {"max_output_tokens": 100000}}).create_tools()
    out = await grep(tools, pattern="hit")
    assert out.startswith("1000 matches across 1 file (truncated at 1000)\n---\n")


@pytest.mark.s3
async def test_grep_and_list_requests_on_s3(moto: Any) -> None:
    from collections import Counter

    from agentvfs import FsspecFilesystem
    from conftest import S3_BUCKET, unique
    from test_safety import count_url_gets

    root = f"{S3_BUCKET}/{unique('reqs')}"
    moto.s3fs().pipe({f"{root}/d{i}/sub/f{j}.ts": f"line\nTODO {i}.{j}\n".encode() for i in range(10) for j in range(10)})
    raw = moto.s3fs(use_listings_cache=False)
    raw.connect()
    sent: Counter[str] = Counter()
    raw.s3.meta.events.register("before-call.s3", lambda model, **kw: sent.update([model.name]))
    fs = FsspecFilesystem(raw, root=root)
    count_url_gets(fs, sent)  # files are read through their signed URLs, not s3fs
    tools = await Workspace(filesystem=fs).create_tools()
    out = await grep(tools, pattern="TODO")
    assert out.startswith("100 matches across 100 files")
    # the tree in one listing, one GET per candidate file (no HEAD per file), and a constant
    # few for the target's stat and the .gitignore lookup (a GET of its URL, s3fs's GET and a
    # HEAD when missing), whatever the number of files
    assert 100 < sent["GetObject"] <= 100 + 2 and sent["ListObjectsV2"] <= 4 and sent["HeadObject"] <= 4, sent
    sent.clear()
    listing = await ls(tools, maxDepth=3)
    assert listing.endswith("20 directories, 100 files")
    # (the .gitignore lookup: a GET of its URL, then s3fs's)
    assert sent["ListObjectsV2"] <= 3 and sent["HeadObject"] <= 3 and sent["GetObject"] <= 2, sent


async def test_local_root_slash_is_outside(tmp_path: Path) -> None:
    from agentvfs import LocalFilesystem

    tools = await Workspace(filesystem=LocalFilesystem(tmp_path)).create_tools()
    with pytest.raises(PermissionError, match="Permission denied: access on /"):
        await ls(tools, path="/")
    (tmp_path / "f.txt").write_text("one\ntwo\n")
    huge = await tools[WORKSPACE_TOOLS.FILESYSTEM.READ_FILE].execute({"path": "f.txt", "limit": 10**12})
    assert huge == "f.txt (lines 1-3 of 3, 8 bytes)\n     1→one\n     2→two\n     3→"
