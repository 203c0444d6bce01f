"""Skills: the reference's checks 61-66, discovery, precedence, the WorkspaceSkills API, the
skill tools' outputs, refresh and staleness, search integration, request-scoped views, and
bad input (asyncio and trio)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import (
    FsspecFilesystem,
    LocalFilesystem,
    RequestContext,
    Workspace,
    WorkspaceError,
    WorkspaceNotReadyError,
)
from agentvfs.skills import (
    ContentSource,
    InvalidSkillError,
    InvalidSkillPathError,
    LocalSkillSource,
    Skill,
    SkillConflictError,
    SkillMetadata,
    WorkspaceSkills,
    parse_skill_md,
    validate_skill_metadata,
)
from agentvfs.skills._parse import MAX_SKILL_FILE_BYTES
from agentvfs.skills._skills import SkillIndex
from agentvfs.testing._attacks_tools import peak_rss_growth
from agentvfs.tools import WorkspaceTool
from agentvfs.vfs import FileEntry, FileStat

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


PDF_BODY = "# PDF Tools\n\nUse pdftotext to extract text.\nSecond line about tables."
LOGO = b"\x89PNG\x00\x01\x02"
SKILLS = ["skills", "node_modules/pkg/skills", ".mastra/skills"]


def put(root: Path, rel: str, data: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def skill_md(
    name: str, description: str = "Extract text from PDFs", extra: str = "", body: str = "body"
) -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}\n"


def build_fixture(root: Path) -> Path:
    """The reference's skills fixture (§21, checks 61-66)."""
    put(
        root,
        "skills/pdf-tools/SKILL.md",
        skill_md(
            "pdf-tools",
            extra="license: MIT\nmetadata:\n  author: docs-team\n  version: 2\n",
            body=PDF_BODY,
        ),
    )
    put(root, "skills/pdf-tools/references/api.md", "line1\nline2\nline3\nline4")
    put(root, "skills/pdf-tools/scripts/run.sh", '#!/bin/sh\npdftotext "$1"\n')
    put(root, "skills/pdf-tools/assets/logo.png", LOGO)
    put(root, "skills/bad-name/SKILL.md", skill_md("Bad_Name"))
    put(root, "skills/mismatch/SKILL.md", skill_md("other-name"))
    put(
        root,
        "node_modules/pkg/skills/pdf-tools/SKILL.md",
        skill_md("pdf-tools", body="External PDF tools."),
    )
    put(
        root,
        ".mastra/skills/brand/SKILL.md",
        skill_md("brand", "Brand voice", "user-invocable: false\n", "Write like us."),
    )
    return root


@pytest.fixture
def fixture_root(tmp_path: Path) -> Path:
    return build_fixture(tmp_path / "ws")


def workspace(root: Path, skills: Any = SKILLS, **options: Any) -> Workspace:
    return Workspace(filesystem=LocalFilesystem(root), skills=skills, **options)


async def tools_of(ws: Workspace, ctx: RequestContext | None = None) -> dict[str, WorkspaceTool]:
    return await ws.create_tools(request_context=ctx)


def skills_of(ws: Workspace) -> WorkspaceSkills:
    skills = ws.skills
    assert skills is not None
    return skills


# -- §21 checks 61-66 ----------------------------------------------------------------------------


async def test_check_61_list_skips_invalid_and_keeps_duplicates_across_sources(
    fixture_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "agentvfs.skills")
    listed = await skills_of(workspace(fixture_root)).list()
    assert [(s.name, s.path) for s in listed] == [
        ("pdf-tools", "skills/pdf-tools"),
        ("pdf-tools", "node_modules/pkg/skills/pdf-tools"),
        ("brand", ".mastra/skills/brand"),
    ]
    assert listed[0] == SkillMetadata(
        "pdf-tools",
        "skills/pdf-tools",
        "Extract text from PDFs",
        "MIT",
        None,
        None,
        {"author": "docs-team", "version": 2},
    )
    assert listed[2].user_invocable is False
    assert all(type(s) is SkillMetadata for s in listed)
    logged = caplog.text
    assert "[WorkspaceSkills] Failed to load skill from skills/bad-name/SKILL.md" in logged
    assert "name: Skill name must contain only lowercase letters, numbers, and hyphens" in logged
    assert 'Skill name "Bad_Name" must match directory name "bad-name"' in logged
    assert 'Skill name "other-name" must match directory name "mismatch"' in logged


async def test_check_62_get_prefers_local_and_finds_by_path(fixture_root: Path) -> None:
    skills = skills_of(workspace(fixture_root))
    skill = await skills.get("pdf-tools")
    assert skill is not None
    assert skill.path == "skills/pdf-tools"
    assert (
        skill.references == ("api.md",)
        and skill.scripts == ("run.sh",)
        and skill.assets == ("logo.png",)
    )
    assert skill.source == ContentSource("local", "skills")
    assert skill.source.project_path == "skills" and skill.source.package_path is None
    assert skill.instructions == PDF_BODY
    assert skill.license == "MIT"
    external = await skills.get("node_modules/pkg/skills/pdf-tools/SKILL.md")
    assert external is not None and external.source == ContentSource(
        "external", "node_modules/pkg/skills"
    )
    assert external.instructions == "External PDF tools."
    assert (await skills.get("node_modules/pkg/skills/pdf-tools")) == external
    brand = await skills.get("brand")
    assert (
        brand is not None
        and brand.source.type == "managed"
        and brand.source.mastra_path == ".mastra/skills"
    )
    assert await skills.has("brand") and not await skills.has("nope")


async def test_check_63_same_source_conflict(tmp_path: Path) -> None:
    put(tmp_path, "a/dup/SKILL.md", skill_md("dup"))
    put(tmp_path, "b/dup/SKILL.md", skill_md("dup"))
    skills = skills_of(workspace(tmp_path, ["a", "b"]))
    with pytest.raises(SkillConflictError) as caught:
        await skills.get("dup")
    assert str(caught.value) == (
        '[WorkspaceSkills] Cannot resolve skill "dup": multiple local skills found at "a/dup", "b/dup". '
        "Rename one or move it to a different source type."
    )
    assert len(await skills.list()) == 2
    assert (await skills.get("b/dup")) is not None  # a path still names one


async def test_check_64_skill_tool(fixture_root: Path) -> None:
    tools = await tools_of(workspace(fixture_root))
    assert list(tools)[-3:] == ["skill", "skill_search", "skill_read"]
    out = await tools["skill"].execute({"name": "pdf-tools"})
    assert out == (
        PDF_BODY
        + "\n\n## References\n- references/api.md\n\n## Scripts\n- scripts/run.sh\n\n## Assets\n- assets/logo.png"
    )
    assert await tools["skill"].execute({"name": "brand"}) == "Write like us."
    assert await tools["skill"].execute({"name": "nope"}) == (
        'Skill "nope" not found. Available skills: pdf-tools (skills/pdf-tools), '
        "pdf-tools (node_modules/pkg/skills/pdf-tools), brand (.mastra/skills/brand)"
    )


async def test_check_65_skill_read(fixture_root: Path) -> None:
    read = (await tools_of(workspace(fixture_root)))["skill_read"]
    assert await read.execute(
        {"skillName": "pdf-tools", "path": "references/api.md", "startLine": 2, "endLine": 3}
    ) == ("references/api.md (lines 2-3 of 4)\nline2\nline3")
    assert await read.execute(
        {"skillName": "pdf-tools", "path": "references/api.md", "startLine": 10}
    ) == (
        'File "references/api.md" has 4 lines (valid range 1-4). Requested startLine 10 is past the end of the '
        "file. The file has been fully read; stop paginating."
    )
    assert await read.execute({"skillName": "pdf-tools", "path": "assets/logo.png"}) == (
        "Binary file: skills/pdf-tools/assets/logo.png (7 bytes)"
    )
    assert await read.execute({"skillName": "pdf-tools", "path": "references/missing.md"}) == (
        'File "references/missing.md" not found in skill "pdf-tools".\n'
        "Available files: references/api.md, scripts/run.sh, assets/logo.png"
    )


async def test_check_66_path_escape_and_workspace_search(fixture_root: Path) -> None:
    ws = workspace(fixture_root, bm25=True)
    skills = skills_of(ws)
    with pytest.raises(InvalidSkillPathError) as caught:
        await skills.get_reference("pdf-tools", "../../etc/passwd")
    assert str(caught.value) == "Invalid reference path: ../../etc/passwd"
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, PermissionError)
    await skills.list()  # discovery indexes the skills
    results = await ws.search("tables")
    assert [r.id for r in results] == ["skill:skills/pdf-tools:SKILL.md"]
    assert results[0].metadata == {"skill_path": "skills/pdf-tools", "source": "SKILL.md"}
    assert results[0].line_range == (4, 4)


# -- the tools ---------------------------------------------------------------------------------------


async def test_skill_read_ranges_and_raw_content(fixture_root: Path) -> None:
    read = (await tools_of(workspace(fixture_root)))["skill_read"]
    assert (
        await read.execute({"skillName": "pdf-tools", "path": "references/api.md"})
        == "line1\nline2\nline3\nline4"
    )
    assert await read.execute(
        {"skillName": "pdf-tools", "path": "references/api.md", "startLine": "3"}
    ) == ("references/api.md (lines 3-4 of 4)\nline3\nline4")
    assert await read.execute(
        {"skillName": "pdf-tools", "path": "references/api.md", "endLine": 1}
    ) == ("references/api.md (lines 1-1 of 4)\nline1")
    assert await read.execute(
        {"skillName": "pdf-tools", "path": "references/api.md", "startLine": 3, "endLine": 2}
    ) == (
        'File "references/api.md" has 4 lines (valid range 1-4). Requested range 3-2 is empty because startLine '
        "is greater than endLine."
    )
    # a script is readable too, and the skill may be named by its path
    assert (
        await read.execute(
            {
                "skillName": "skills/pdf-tools",
                "path": "scripts/run.sh",
                "startLine": 1,
                "endLine": 1,
            }
        )
    ) == ("scripts/run.sh (lines 1-1 of 3)\n#!/bin/sh")
    assert await read.execute({"skillName": "ghost", "path": "x"}) == (
        'Skill "ghost" not found. Available skills: pdf-tools (skills/pdf-tools), '
        "pdf-tools (node_modules/pkg/skills/pdf-tools), brand (.mastra/skills/brand)"
    )
    with pytest.raises(InvalidSkillPathError, match=r"^Invalid asset path: /etc/passwd$"):
        await read.execute({"skillName": "pdf-tools", "path": "/etc/passwd"})
    brand = await read.execute({"skillName": "brand", "path": "nothing.md"})
    assert brand == 'File "nothing.md" not found in skill "brand".'


async def test_skill_read_binary_by_invalid_utf8(tmp_path: Path) -> None:
    put(tmp_path, "skills/s/SKILL.md", skill_md("s"))
    put(tmp_path, "skills/s/assets/latin1.txt", "café".encode("latin-1"))
    put(tmp_path, "skills/s/references/utf8.md", "café ☕")
    read = (await tools_of(workspace(tmp_path, ["skills"])))["skill_read"]
    assert (
        await read.execute({"skillName": "s", "path": "assets/latin1.txt"})
        == "Binary file: skills/s/assets/latin1.txt (4 bytes)"
    )
    assert await read.execute({"skillName": "s", "path": "references/utf8.md"}) == "café ☕"


async def test_skill_search_tool_without_search_engine(fixture_root: Path) -> None:
    search = (await tools_of(workspace(fixture_root)))["skill_search"]
    assert await search.execute({"query": "TABLES"}) == f"[pdf-tools] (score: 1.00)\n{PDF_BODY}"
    assert (
        await search.execute({"query": "line3"})
        == "[pdf-tools] (score: 0.80)\nline1\nline2\nline3\nline4"
    )
    assert await search.execute({"query": "zebra"}) == "No results found."
    assert await search.execute({"query": "body", "skillNames": ["brand"]}) == "No results found."
    assert (
        await search.execute({"query": "write", "skillNames": ["brand"]})
        == "[brand] (score: 1.00)\nWrite like us."
    )


async def test_skill_search_tool_with_bm25_and_previews(tmp_path: Path) -> None:
    long_body = "needle " + "word " * 100
    put(tmp_path, "skills/long/SKILL.md", skill_md("long", body=long_body))
    put(tmp_path, "skills/long/references/notes.md", "intro\nthe needle is here\n")
    put(tmp_path, "skills/other/SKILL.md", skill_md("other", body="nothing to see"))
    search = (await tools_of(workspace(tmp_path, ["skills"], bm25=True)))["skill_search"]
    out = str(await search.execute({"query": "needle", "topK": 5}))
    blocks = re.split(r"\n\n(?=\[)", out)
    assert len(blocks) == 2
    first, second = sorted(blocks, key=lambda b: "here" in b)
    assert re.fullmatch(
        r"\[long\] \(lines 1-1\) \(score: \d\.\d\d\)\n", first[: first.index("\n") + 1]
    )
    assert first.endswith("\n" + long_body.strip()[:200] + "...")
    assert re.fullmatch(
        r"\[long\] \(lines 2-2\) \(score: \d\.\d\d\)\nintro\nthe needle is here\n", second
    )
    assert await search.execute({"query": "needle", "skillNames": ["other"]}) == "No results found."
    only = str(await search.execute({"query": "needle", "topK": 1}))
    assert only.count("[long]") == 1


async def test_tools_config_applies_to_skill_tools(fixture_root: Path) -> None:
    ws = workspace(
        fixture_root, tools={"skill_search": {"enabled": False}, "skill": {"name": "activate"}}
    )
    tools = await tools_of(ws)
    assert "skill_search" not in tools and "activate" in tools and "skill_read" in tools
    assert tools["activate"].workspace_tool_name == "skill"
    with pytest.raises(ValueError, match="name"):
        await tools["activate"].execute({})
    assert "skill" not in await tools_of(Workspace(filesystem=LocalFilesystem(fixture_root)))


# -- discovery ----------------------------------------------------------------------------------------


async def test_discovery_path_forms(fixture_root: Path) -> None:
    async def names(paths: list[str]) -> list[str]:
        return [s.path for s in await skills_of(workspace(fixture_root, paths)).list()]

    assert await names(["skills/pdf-tools"]) == ["skills/pdf-tools"]  # a skill directory
    assert await names(["skills/pdf-tools/SKILL.md"]) == ["skills/pdf-tools"]  # its SKILL.md
    assert await names(["skills/"]) == ["skills/pdf-tools"]  # a parent, trailing slash
    assert await names(["./skills"]) == ["./skills/pdf-tools"]  # the caller's form is kept
    assert await names(["skills/*"]) == ["skills/pdf-tools"]
    assert await names(["**/SKILL.md"]) == [
        ".mastra/skills/brand",
        "node_modules/pkg/skills/pdf-tools",
        "skills/pdf-tools",
    ]
    assert await names(["node_modules/*/skills"]) == ["node_modules/pkg/skills/pdf-tools"]
    assert await names(["missing", "skills/nope/SKILL.md", "skills/pdf-tools/SKILL.md/"]) == [
        "skills/pdf-tools"
    ]
    assert await names([str(fixture_root / ".mastra" / "skills")]) == [
        str(fixture_root / ".mastra/skills/brand")
    ]


async def test_discovery_scans_one_level_only(tmp_path: Path) -> None:
    put(tmp_path, "skills/group/deep/SKILL.md", skill_md("deep"))
    put(tmp_path, "skills/top/SKILL.md", skill_md("top"))
    listed = await skills_of(workspace(tmp_path, ["skills"])).list()
    assert [s.name for s in listed] == ["top"]


async def test_nested_subdirectories_listed_recursively(tmp_path: Path) -> None:
    put(tmp_path, "skills/s/SKILL.md", skill_md("s"))
    put(tmp_path, "skills/s/references/b.md", "b")
    put(tmp_path, "skills/s/references/a/deep/x.md", "x")
    put(tmp_path, "skills/s/assets/img/one.png", b"\x00")
    os.symlink(tmp_path / "skills/s/references/a", tmp_path / "skills/s/references/linked")
    skill = await skills_of(workspace(tmp_path, ["skills"])).get("s")
    assert skill is not None
    assert skill.references == ("a/deep/x.md", "b.md")  # the symlinked directory is not followed
    assert skill.assets == ("img/one.png",)
    assert skill.scripts == ()


async def test_symlinked_aliases_count_once(
    fixture_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (fixture_root / ".claude/skills").mkdir(parents=True)
    os.symlink(fixture_root / "skills/pdf-tools", fixture_root / ".claude/skills/pdf-tools")
    skills = skills_of(workspace(fixture_root, ["skills", ".claude/skills"]))
    listed = await skills.list()
    assert [s.name for s in listed] == ["pdf-tools"]
    with caplog.at_level(logging.WARNING, "agentvfs.skills"):
        skill = await skills.get("pdf-tools")  # no conflict: one real directory
    assert skill is not None and skill.references == ("api.md",)
    assert "Cannot resolve" not in caplog.text
    assert (
        await skills.get_reference(skill.path, "references/api.md") == "line1\nline2\nline3\nline4"
    )


async def test_same_name_across_sources_warns_once(
    fixture_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    skills = skills_of(workspace(fixture_root))
    with caplog.at_level(logging.WARNING, "agentvfs.skills"):
        for _ in range(3):
            await skills.get("pdf-tools")
    warnings = [r.getMessage() for r in caplog.records if "Multiple skills" in r.getMessage()]
    assert warnings == [
        '[WorkspaceSkills] Multiple skills named "pdf-tools" found. Using "skills/pdf-tools" (source: local). '
        'Other candidates: "node_modules/pkg/skills/pdf-tools" (external)'
    ]


async def test_managed_beats_external(tmp_path: Path) -> None:
    put(tmp_path, "node_modules/x/skills/tool/SKILL.md", skill_md("tool", body="external"))
    put(tmp_path, "app/.mastra/skills/tool/SKILL.md", skill_md("tool", body="managed"))
    skills = skills_of(workspace(tmp_path, ["node_modules/x/skills", "app/.mastra/skills"]))
    skill = await skills.get("tool")
    assert skill is not None and skill.instructions == "managed" and skill.source.type == "managed"


async def test_dynamic_skill_paths_are_request_scoped(tmp_path: Path) -> None:
    put(tmp_path, "alice/notes/SKILL.md", skill_md("notes", body="alice secret"))
    put(tmp_path, "bob/notes/SKILL.md", skill_md("notes", body="bob plans"))
    calls: list[str] = []

    async def paths(ctx: RequestContext) -> list[str]:
        calls.append(str(ctx.get("user")))
        return [str(ctx.get("user") or "nobody")]

    ws = workspace(tmp_path, paths, bm25=True)
    await ws.index("doc.txt", "secret plans of the workspace")
    alice, bob = RequestContext([("user", "alice")]), RequestContext([("user", "bob")])
    tools_a, tools_b = await tools_of(ws, alice), await tools_of(ws, bob)
    out_a = await tools_a["skill"].execute({"name": "notes"}, request_context=alice)
    out_b = await tools_b["skill"].execute({"name": "notes"}, request_context=bob)
    assert (out_a, out_b) == ("alice secret", "bob plans")
    found_a = str(
        await tools_a["skill_search"].execute({"query": "secret plans"}, request_context=alice)
    )
    assert re.fullmatch(r"\[notes\] \(lines 1-1\) \(score: \d+\.\d\d\)\nalice secret", found_a)
    found_b = await tools_b["skill_search"].execute({"query": "secret"}, request_context=bob)
    assert found_b == "No results found."
    # the scoped documents are in the shared index but never returned by workspace search
    engine = await ws._search.engine()  # type: ignore[union-attr]
    assert any(i.startswith("skill-scope:alice:skill:alice/notes:SKILL.md") for i in engine.ids())
    assert [r.id for r in await ws.search("secret plans")] == ["doc.txt"]
    # one view per request context and per set of paths
    skills = skills_of(ws)
    view = await skills.get_scoped(alice)
    assert view is await skills.get_scoped(alice)
    assert view is await skills.get_scoped(RequestContext([("user", "alice")]))
    assert view is not await skills.get_scoped(bob)


async def test_dynamic_paths_change_on_maybe_refresh(tmp_path: Path) -> None:
    put(tmp_path, "one/a/SKILL.md", skill_md("a"))
    put(tmp_path, "two/b/SKILL.md", skill_md("b"))
    current = ["one"]
    skills = skills_of(workspace(tmp_path, lambda ctx: list(current)))
    assert [s.name for s in await skills.list()] == ["a"]
    current[:] = ["two"]
    await skills.maybe_refresh()
    assert [s.name for s in await skills.list()] == ["b"]


async def test_skills_read_from_a_resolved_filesystem(tmp_path: Path) -> None:
    for user in ("alice", "bob"):
        put(tmp_path / user, f"skills/{user}-skill/SKILL.md", skill_md(f"{user}-skill"))
    systems = {u: LocalFilesystem(tmp_path / u) for u in ("alice", "bob")}
    ws = Workspace(filesystem=lambda ctx: systems[ctx.get("user")], skills=["skills"])
    for user in ("alice", "bob"):
        ctx = RequestContext([("user", user)])
        tools = await tools_of(ws, ctx)
        out = await tools["skill"].execute({"name": f"{user}-skill"}, request_context=ctx)
        assert out == "body"
        other = "bob" if user == "alice" else "alice"
        missing = str(await tools["skill"].execute({"name": f"{other}-skill"}, request_context=ctx))
        assert missing.startswith(
            f'Skill "{other}-skill" not found. Available skills: {user}-skill (skills/{user}-skill)'
        )


async def test_skill_source_replaces_the_filesystem(fixture_root: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    put(other, "skills/elsewhere/SKILL.md", skill_md("elsewhere"))
    ws = Workspace(
        filesystem=LocalFilesystem(fixture_root),
        skills=["skills"],
        skill_source=LocalSkillSource(other),
    )
    assert [s.name for s in await skills_of(ws).list()] == ["elsewhere"]
    with pytest.raises(WorkspaceError, match="skill_source must provide"):
        _ = Workspace(skills=["s"], skill_source=object()).skills


async def test_local_skill_source_defaults_to_cwd(
    fixture_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(fixture_root)
    ws = Workspace(skills=["skills"])
    skills = skills_of(ws)
    assert isinstance(skills.source, LocalSkillSource)
    skill = await skills.get("pdf-tools")
    assert skill is not None and skill.assets == ("logo.png",)
    assert await skills.get_asset("pdf-tools", "assets/logo.png") == LOGO
    assert await skills.get_script("pdf-tools", "scripts/run.sh") == '#!/bin/sh\npdftotext "$1"\n'
    assert await skills.get_reference("pdf-tools", "references/none.md") is None
    assert await skills.get_reference("ghost", "references/api.md") is None
    assert await skills.list_references("pdf-tools") == ["api.md"]
    assert await skills.list_scripts("pdf-tools") == ["run.sh"]
    assert await skills.list_assets("pdf-tools") == ["logo.png"]
    assert await skills.list_assets("ghost") == []


async def test_symlink_out_of_a_skill_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    root = tmp_path / "ws"
    put(root, "skills/s/SKILL.md", skill_md("s"))
    (root / "skills/s/references").mkdir()
    os.symlink(secret, root / "skills/s/references/leak.md")
    for source in (None, LocalSkillSource(root)):
        ws = Workspace(filesystem=LocalFilesystem(root), skills=["skills"], skill_source=source)
        skills = skills_of(ws)
        with pytest.raises(PermissionError):
            await skills.get_reference("s", "references/leak.md")
        read = (await tools_of(ws))["skill_read"]
        with pytest.raises(PermissionError):
            await read.execute({"skillName": "s", "path": "references/leak.md"})


async def test_destroyed_workspace_refuses_skills(fixture_root: Path) -> None:
    ws = workspace(fixture_root)
    skills = skills_of(ws)
    await skills.list()
    await ws.destroy()
    with pytest.raises(WorkspaceNotReadyError):
        _ = ws.skills
    with pytest.raises(
        WorkspaceNotReadyError, match=r"^Workspace is not ready \(status: destroyed\)$"
    ):
        await skills.list()
    assert Workspace(filesystem=LocalFilesystem(fixture_root)).skills is None
    assert Workspace(filesystem=LocalFilesystem(fixture_root), skills=[]).skills is None


async def test_skills_on_a_memory_filesystem() -> None:
    fs = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/m")
    await fs.write_file("skills/mem/SKILL.md", skill_md("mem", body="in memory"))
    await fs.write_file("skills/mem/references/r.md", "ref")
    ws = Workspace(filesystem=fs, skills=["skills"])
    skill = await skills_of(ws).get("mem")
    assert skill is not None and skill.instructions == "in memory" and skill.references == ("r.md",)


# -- refresh and staleness --------------------------------------------------------------------------


class CountingSource:
    """A LocalSkillSource that counts reads and listings."""

    def __init__(self, root: Path) -> None:
        self.inner = LocalSkillSource(root)
        self.reads: list[str] = []
        self.walks = 0
        self.stats = 0

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)

    async def stat(self, path: str) -> FileStat:
        self.stats += 1
        return await self.inner.stat(path)

    async def read_file(self, path: str) -> bytes:
        self.reads.append(path)
        return await self.inner.read_file(path)

    async def readdir(self, path: str) -> list[FileEntry]:
        self.walks += 1
        return await self.inner.readdir(path)

    async def walk(self, path: str, *, max_depth: int | None = None) -> list[FileEntry]:
        self.walks += 1
        return await self.inner.walk(path, max_depth=max_depth)

    async def realpath(self, path: str) -> str:
        return await self.inner.realpath(path)


async def test_maybe_refresh_cooldown_and_staleness(fixture_root: Path) -> None:
    source = CountingSource(fixture_root)
    skills = WorkspaceSkills(source, ["skills"])
    assert [s.name for s in await skills.list()] == ["pdf-tools"]
    assert len(source.reads) == 3  # one SKILL.md per directory that has one
    walks = source.walks
    await skills.maybe_refresh()  # within the cooldown: no I/O at all
    assert source.walks == walks and len(source.reads) == 3
    skills.staleness_cooldown = 0
    await skills.maybe_refresh()  # nothing changed: listed again, nothing read
    assert source.walks > walks and len(source.reads) == 3
    put(fixture_root, "skills/new-one/SKILL.md", skill_md("new-one"))
    await skills.maybe_refresh()
    assert [s.name for s in await skills.list()] == ["new-one", "pdf-tools"]
    put(fixture_root, "skills/new-one/references/more.md", "more")
    await skills.maybe_refresh()  # a new reference is seen (its directory is listed)
    new = await skills.get("new-one")
    assert new is not None and new.references == ("more.md",)
    # an in-place edit of the same size is only noticed with check_skill_file_mtime
    path = fixture_root / "skills/new-one/SKILL.md"
    path.write_text(skill_md("new-one", body="BODY"))
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 5))
    await skills.maybe_refresh()
    new = await skills.get("new-one")
    assert new is not None and new.instructions == "body"
    skills.check_skill_file_mtime = True
    await skills.maybe_refresh()
    new = await skills.get("new-one")
    assert new is not None and new.instructions == "BODY"


async def test_refresh_add_and_remove(tmp_path: Path) -> None:
    put(tmp_path, "skills/one/SKILL.md", skill_md("one", body="first"))
    ws = workspace(tmp_path, ["skills"], bm25=True)
    skills = skills_of(ws)
    await ws.index("notes.txt", "first notes unrelated")
    assert [s.name for s in await skills.list()] == ["one"]
    put(tmp_path, "skills/two/SKILL.md", skill_md("two", body="second"))
    await skills.refresh()
    assert [s.name for s in await skills.list()] == ["one", "two"]
    (tmp_path / "skills/one/SKILL.md").unlink()
    await skills.refresh()
    assert [s.name for s in await skills.list()] == ["two"]
    ids = set((await ws._search.engine()).ids())  # type: ignore[union-attr]
    assert ids == {
        "notes.txt",
        "skill:skills/two:SKILL.md",
    }  # refresh kept the workspace's document
    put(tmp_path, "extra/three/SKILL.md", skill_md("three", body="third"))
    await skills.add_skill("extra/three")
    assert (await skills.get("three")) is not None
    assert [r.id for r in await ws.search("third")] == ["skill:extra/three:SKILL.md"]
    put(tmp_path, "extra/three/SKILL.md", skill_md("three", body="third edited"))
    await skills.add_skill("extra/three/SKILL.md")
    three = await skills.get("three")
    assert three is not None and three.instructions == "third edited"
    assert [s.name for s in await skills.list()].count("three") == 1
    await skills.remove_skill("three")
    assert await skills.get("three") is None
    assert await ws.search("third") == []
    await skills.remove_skill("three")  # already gone: nothing happens
    put(tmp_path, "extra/bad/SKILL.md", skill_md("Bad"))
    with pytest.raises(InvalidSkillError):
        await skills.add_skill("extra/bad")
    with pytest.raises(FileNotFoundError):
        await skills.add_skill("extra/none")


async def test_concurrent_refreshes_share_work(fixture_root: Path) -> None:
    import anyio

    source = CountingSource(fixture_root)
    skills = WorkspaceSkills(source, ["skills"])
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(skills.list)
    assert len(source.reads) == 3  # one discovery for five first callers
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(skills.refresh)
    assert len(source.reads) <= 3 * 3


async def test_search_index_healed_after_rebuild(tmp_path: Path) -> None:
    put(tmp_path, "skills/one/SKILL.md", skill_md("one", body="findable words"))
    put(tmp_path, "skills/one/references/r.md", "reference words here")
    ws = workspace(tmp_path, ["skills"], bm25=True)
    skills = skills_of(ws)
    found = await skills.search("words")
    assert [(r.skill_name, r.source) for r in found] == [
        ("one", "SKILL.md"),
        ("one", "references/r.md"),
    ] or [(r.skill_name, r.source) for r in found] == [
        ("one", "references/r.md"),
        ("one", "SKILL.md"),
    ]
    assert [r.source for r in await skills.search("words", include_references=False)] == [
        "SKILL.md"
    ]
    await ws.rebuild_search_index(["nothing-here"])  # clears the index, skills' documents too
    assert len(await skills.search("words")) == 2


async def test_skill_search_results_record(tmp_path: Path) -> None:
    put(tmp_path, "skills/one/SKILL.md", skill_md("one", body="alpha\nbeta gamma"))
    skills = skills_of(workspace(tmp_path, ["skills"], bm25=True))
    (hit,) = await skills.search("gamma")
    assert (hit.skill_name, hit.skill_path, hit.source, hit.line_range) == (
        "one",
        "skills/one",
        "SKILL.md",
        (2, 2),
    )
    assert hit.score > 0 and set(hit.score_details) == {"bm25"}
    assert await skills.search("gamma", min_score=1e9) == []


# -- size limits on what is read, whatever the listing showed ----------------------------------------------


def sparse(path: Path, size: int, head: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


async def test_a_skill_md_linked_to_or_swapped_for_a_huge_file_is_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    put(tmp_path, "skills/ok/SKILL.md", skill_md("ok"))
    huge = skill_md("big", body="x").encode()
    # A link lists without a size; a swap after the listing makes the listed size stale.
    sparse(tmp_path / "big.dat", 1 << 30, huge)
    (tmp_path / "skills/linked").mkdir()
    os.symlink("../../big.dat", tmp_path / "skills/linked/SKILL.md")
    put(tmp_path, "skills/swapped/SKILL.md", skill_md("swapped"))
    swap = sparse(tmp_path / "swap.dat", 1 << 30, huge)

    class SwapAfterListing(LocalFilesystem):
        async def walk(self, path: str = "", **options: Any) -> Any:
            entries = await super().walk(path, **options)
            if swap.exists():
                os.replace(swap, tmp_path / "skills/swapped/SKILL.md")
            return entries

    skills = skills_of(Workspace(filesystem=SwapAfterListing(tmp_path), skills=["skills"]))
    with caplog.at_level(logging.ERROR, "agentvfs.skills"), peak_rss_growth() as growth:
        listed = [s.name for s in await skills.list()]
    assert listed == ["ok"]
    assert growth[0] < 64 << 20, growth[0]
    for name in ("linked", "swapped"):
        assert (
            f"Failed to load skill from skills/{name}/SKILL.md: skills/{name}/SKILL.md is too large to load "
            f"as a skill (more than {MAX_SKILL_FILE_BYTES} bytes, the limit). Move content to references/."
        ) in caplog.text
    with pytest.raises(InvalidSkillError, match="is too large to load as a skill"):
        await skills.add_skill("skills/linked")


async def test_huge_references_are_neither_indexed_nor_searched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    put(tmp_path, "skills/s/SKILL.md", skill_md("s", body="the words"))
    put(tmp_path, "skills/s/references/small.md", "small words")
    sparse(tmp_path / "skills/s/references/huge.md", 1 << 30, b"huge words\n")
    for options in ({"bm25": True}, {}):
        skills = skills_of(workspace(tmp_path, ["skills"], **options))
        with caplog.at_level(logging.WARNING, "agentvfs.skills"), peak_rss_growth() as growth:
            found = sorted(r.source for r in await skills.search("words"))
        assert found == ["SKILL.md", "references/small.md"], options
        assert growth[0] < 64 << 20, (options, growth[0])
        assert "skills/s/references/huge.md" in caplog.text
        caplog.clear()


# -- SKILL.md parsing and validation ----------------------------------------------------------------------


def test_parse_front_matter_and_body() -> None:
    parsed = parse_skill_md("---\nname: a\ndescription: d\n---\n\n  Body text\n\n", dir_name="a")
    assert (
        parsed.front_matter == {"name": "a", "description": "d"}
        and parsed.instructions == "Body text"
    )
    crlf = parse_skill_md("---\r\nname: a\r\ndescription: d\r\n---\r\nBody\r\n", dir_name="a")
    assert crlf.instructions == "Body"
    bom = parse_skill_md("\ufeff---\nname: a\ndescription: d\n---\nx", dir_name="a")
    assert bom.front_matter["name"] == "a"
    assert parse_skill_md("---yaml\nname: a\ndescription: d\n---\nx").instructions == "x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("---\nname: [unclosed\n---\nx", "Invalid YAML front matter in SKILL.md: "),
        (
            "---\n- a\n- b\n---\nx",
            "Invalid skill metadata in SKILL.md:\nExpected object, received array",
        ),
        (
            "---\njust text\n---\nx",
            "Invalid skill metadata in SKILL.md:\nExpected object, received string",
        ),
        ("---\nname: a\ndescription: d\n", "Invalid front matter in SKILL.md: no closing --- line"),
        (
            "---js\nmodule.exports = {}\n---\nx",
            "Invalid front matter in SKILL.md: language 'js' is not supported",
        ),
        (
            "no front matter",
            "Invalid skill metadata in SKILL.md:\nname: Expected string, received undefined\ndescription: Expected string, received undefined",
        ),
        ("---\n!!python/object:os.system {}\n---\n", "Invalid YAML front matter in SKILL.md: "),
    ],
)
def test_bad_front_matter(text: str, message: str) -> None:
    with pytest.raises(InvalidSkillError) as caught:
        parse_skill_md(text)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("front", "errors"),
    [
        (
            {"name": "My-Skill", "description": "d"},
            ["name: Skill name must contain only lowercase letters, numbers, and hyphens"],
        ),
        (
            {"name": "a--b", "description": "d"},
            ["name: Skill name must not contain consecutive hyphens"],
        ),
        (
            {"name": "-a-", "description": "d"},
            ["name: Skill name must not start or end with a hyphen"],
        ),
        (
            {"name": "a" * 65, "description": "d"},
            ["name: Skill name must be 64 characters or less"],
        ),
        ({"name": "", "description": "d"}, ["name: Skill name cannot be empty"]),
        ({"name": 12, "description": "d"}, ["name: Expected string, received number"]),
        ({"name": None, "description": "d"}, ["name: Expected string, received object"]),
        ({"name": "a", "description": ""}, ["description: Skill description cannot be empty"]),
        (
            {"name": "a", "description": "   "},
            ["description: Skill description cannot be only whitespace"],
        ),
        (
            {"name": "a", "description": "x" * 1025},
            ["description: Skill description must be 1024 characters or less"],
        ),
        (
            {"name": "a", "description": "d", "license": 3},
            ["license: Expected string, received number"],
        ),
        (
            {"name": "a", "description": "d", "user-invocable": "no"},
            ["user-invocable: Expected boolean, received string"],
        ),
        (
            {"name": "a", "description": "d", "metadata": [1]},
            ["metadata: Expected object, received array"],
        ),
        (
            {
                "name": "a",
                "description": "d",
                "compatibility": {"any": ["thing"]},
                "metadata": {"k": [1, {"x": 2}]},
            },
            [],
        ),
        ({"name": "b", "description": "d"}, ['Skill name "b" must match directory name "a"']),
    ],
)
def test_validation_messages(front: dict[str, Any], errors: list[str]) -> None:
    dir_name = "a" if front.get("name") in ("a", "b") else None
    assert validate_skill_metadata(front, dir_name).errors == errors
    assert validate_skill_metadata(front, dir_name).valid == (not errors)


def test_validation_warnings() -> None:
    long = "\n".join(["word"] * 501)
    result = validate_skill_metadata({"name": "a", "description": "d"}, "a", long)
    assert result.valid
    assert result.warnings == [
        "Instructions have 501 lines (recommended: <500). Consider moving content to references/."
    ]
    wordy = " ".join(["w"] * 4000)
    assert validate_skill_metadata({"name": "a", "description": "d"}, "a", wordy).warnings == [
        "Instructions have ~5200 estimated tokens (recommended: <5000). Consider moving content to references/."
    ]


async def test_bad_skills_are_skipped_with_a_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    put(tmp_path, "skills/good/SKILL.md", skill_md("good"))
    put(tmp_path, "skills/yaml-error/SKILL.md", "---\nname: yaml-error\ndescription: [\n---\n")
    put(tmp_path, "skills/listy/SKILL.md", "---\n- listy\n---\n")
    put(tmp_path, "skills/upper/SKILL.md", skill_md("Upper"))
    put(tmp_path, "skills/a--b/SKILL.md", skill_md("a--b"))
    put(tmp_path, "skills/huge/SKILL.md", skill_md("huge", body="x" * (2 * 1024 * 1024)))
    caplog.set_level(logging.ERROR, "agentvfs.skills")
    source = CountingSource(tmp_path)
    skills = WorkspaceSkills(source, ["skills"])
    assert [s.name for s in await skills.list()] == ["good"]
    assert "skills/huge/SKILL.md" not in source.reads  # refused by its listed size, unread
    text = caplog.text
    assert "Failed to load skill from skills/yaml-error/SKILL.md: Invalid YAML front matter" in text
    assert "skills/listy/SKILL.md:\nExpected object, received array" in text
    assert "name: Skill name must contain only lowercase letters, numbers, and hyphens" in text
    assert "name: Skill name must not contain consecutive hyphens" in text
    size = (tmp_path / "skills/huge/SKILL.md").stat().st_size
    assert (
        f"Failed to load skill from skills/huge/SKILL.md: skills/huge/SKILL.md is too large to load as a "
        f"skill ({size} bytes; the limit is {MAX_SKILL_FILE_BYTES} bytes). Move content to references/."
    ) in text
    with pytest.raises(InvalidSkillError, match="too large"):
        await skills.add_skill("skills/huge/SKILL.md")


@pytest.mark.parametrize("path", ["../x", "references/../../x", "/etc/passwd", "a/..", "..\\x"])
async def test_reference_paths_may_not_escape(fixture_root: Path, path: str) -> None:
    skills = skills_of(workspace(fixture_root))
    for method, label in (
        (skills.get_reference, "reference"),
        (skills.get_script, "script"),
        (skills.get_asset, "asset"),
    ):
        with pytest.raises(InvalidSkillPathError) as caught:
            await method("pdf-tools", path)
        assert str(caught.value) == f"Invalid {label} path: {path}"
        with pytest.raises(InvalidSkillPathError):
            await method("ghost", path)


def test_records_are_frozen() -> None:
    skill = Skill("a", "p", "d")
    with pytest.raises(AttributeError):
        skill.name = "b"  # type: ignore[misc]
    assert skill.to_metadata() == SkillMetadata("a", "p", "d")


def test_search_index_adapter_type() -> None:
    assert callable(getattr(SkillIndex, "index_many", None))


def test_skills_config_must_be_paths() -> None:
    source = LocalSkillSource()
    with pytest.raises(TypeError):
        WorkspaceSkills(source, "skills")
    with pytest.raises(TypeError):
        WorkspaceSkills(source, [1])  # type: ignore[list-item]


async def test_resolver_returning_garbage(tmp_path: Path) -> None:
    bad: Callable[[RequestContext], Any] = lambda ctx: "skills"  # noqa: E731
    skills = WorkspaceSkills(LocalSkillSource(tmp_path), bad)
    with pytest.raises(TypeError, match="must return a list of paths"):
        await skills.list()


async def test_demo_lists_and_opens_a_skill() -> None:
    from agentvfs._demo_skills import demo_skills

    lines: list[str] = []
    await demo_skills(lines.append)
    text = "\n".join(lines)
    assert (
        "  release-notes (skills/release-notes): Write release notes from a list of merged changes."
        in lines
    )
    assert "    # Release notes" in lines and "    - references/style.md" in lines
    assert "    references/style.md (lines 3-4 of 6)" in lines
    assert "skill_search pull request -> [release-notes] (lines 4-4) (score: " in text
    assert not any(line != line.rstrip() for line in lines)


async def test_absolute_path_outside_a_contained_filesystem(
    fixture_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "agentvfs.skills")
    skills = skills_of(workspace(fixture_root, ["/skills"]))
    assert await skills.list() == []
    assert '[WorkspaceSkills] Cannot access skills path "/skills": ' in caplog.text
    assert '(did you mean to use the relative path "skills"?)' in caplog.text


async def test_location_aliases(fixture_root: Path) -> None:
    skills = skills_of(workspace(fixture_root))
    skills.register_location_alias("/home/agent/skills/pdf/SKILL.md", "skills/pdf-tools")
    by_alias = await skills.get("/home/agent/skills/pdf")
    assert by_alias is not None and by_alias.path == "skills/pdf-tools"
    assert await skills.has("/home/agent/skills/pdf/SKILL.md")


async def test_concurrent_requests_keep_their_skills(tmp_path: Path) -> None:
    import anyio

    for user in ("ann", "ben", "cat"):
        put(tmp_path, f"{user}/private/SKILL.md", skill_md("private", body=f"{user} only"))
    ws = workspace(tmp_path, lambda ctx: [ctx.get("user")], bm25=True)
    seen: dict[str, list[str]] = {}

    async def request(user: str) -> None:
        ctx = RequestContext([("user", user)])
        tools = await tools_of(ws, ctx)
        outs = []
        for _ in range(3):
            outs.append(str(await tools["skill"].execute({"name": "private"}, request_context=ctx)))
            outs.append(
                str(await tools["skill_search"].execute({"query": "only"}, request_context=ctx))
            )
        seen[user] = outs

    async with anyio.create_task_group() as tg:
        for user in ("ann", "ben", "cat") * 2:
            tg.start_soon(request, user)
    for user, outs in seen.items():
        assert all(f"{user} only" in out for out in outs), outs
        assert not any(other in out for out in outs for other in {"ann", "ben", "cat"} - {user})
