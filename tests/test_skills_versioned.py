"""Skill sources beyond the workspace filesystem: published versions in a content-addressed
store (memory and S3 via moto), integrity checks, and skills discovered on S3."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem, LocalFilesystem, Workspace
from agentvfs.skills import (
    BlobIntegrityError,
    InvalidSkillError,
    LocalSkillSource,
    SkillStore,
    SkillVersion,
    VersionedSkillSource,
    WorkspaceSkills,
    publish_skill,
)
from agentvfs.testing import MotoServer
from agentvfs.tools import WorkspaceTool
from agentvfs.vfs import sha256_hex as sha256
from conftest import S3_BUCKET

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


SKILL_MD = "---\nname: pdf-tools\ndescription: Extract text from PDFs\nlicense: MIT\n---\n# PDF Tools\n\nUse tables.\n"
LOGO = b"\x89PNG\x00\x01\x02"


def put(root: Path, rel: str, data: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.fixture
def skill_root(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    put(root, "skills/pdf-tools/SKILL.md", SKILL_MD)
    put(root, "skills/pdf-tools/references/api.md", "line1\nline2\nline3\nline4")
    put(root, "skills/pdf-tools/scripts/run.sh", "#!/bin/sh\n")
    put(root, "skills/pdf-tools/assets/logo.png", LOGO)
    put(root, "skills/pdf-tools/assets/copy.png", LOGO)  # same content: one blob
    return root


def memory_fs() -> FsspecFilesystem:
    return FsspecFilesystem(
        MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/store"
    )


class CountingStoreFs:
    """Counts writes reaching the store's filesystem."""

    def __init__(self, store: SkillStore) -> None:
        self.writes: list[str] = []
        inner = store.fs.write_file

        async def write_file(path: str, content: Any, **options: Any) -> None:
            self.writes.append(path)
            await inner(path, content, **options)

        store.fs.write_file = write_file  # type: ignore[method-assign]
        # Blobs are written create-only, through put_new where the filesystem has it.
        put = getattr(store.fs, "put_new", None)
        if put is not None:

            async def put_new(path: str, content: bytes) -> None:
                self.writes.append(path)
                await put(path, content)

            store.fs.put_new = put_new  # type: ignore[attr-defined]


async def tools_of(ws: Workspace) -> dict[str, WorkspaceTool]:
    return await ws.create_tools()


async def test_publish_layout_and_idempotence(skill_root: Path) -> None:
    store = SkillStore(memory_fs(), prefix="published")
    counter = CountingStoreFs(store)
    source = LocalFilesystem(skill_root)
    version = await publish_skill(source, "skills/pdf-tools", store)
    assert version.name == "pdf-tools"
    assert sorted(version.files) == [
        "SKILL.md",
        "assets/copy.png",
        "assets/logo.png",
        "references/api.md",
        "scripts/run.sh",
    ]
    logo = version.files["assets/logo.png"]
    assert logo.hash == sha256(LOGO) and logo.size == 7 and logo.mime_type == "image/png"
    assert version.files["assets/copy.png"].hash == logo.hash
    assert version.version == SkillVersion.version_id("pdf-tools", version.files)
    blob_writes = [w for w in counter.writes if "/blobs/" in w]
    assert len(blob_writes) == 4  # five files, four distinct contents
    assert f"published/blobs/{logo.hash[:2]}/{logo.hash}" in blob_writes
    manifest = json.loads(
        await store.fs.read_file(f"published/skills/pdf-tools/versions/{version.version}.json")
    )
    assert manifest["files"]["assets/logo.png"] == {
        "hash": logo.hash,
        "size": 7,
        "mime_type": "image/png",
    }
    # the same files again: nothing written, the first version returned
    counter.writes.clear()
    again = await publish_skill(source, "skills/pdf-tools", store)
    assert counter.writes == []
    assert again == version
    # one file changed: one new blob and a new version
    put(skill_root, "skills/pdf-tools/references/api.md", "line1\nchanged")
    changed = await publish_skill(source, "skills/pdf-tools", store)
    assert changed.version != version.version
    assert [w for w in counter.writes if "/blobs/" in w] == [
        store.blob_path(sha256(b"line1\nchanged"))
    ]
    assert [v.version for v in await store.list_versions("pdf-tools")] == [
        version.version,
        changed.version,
    ]
    latest = await store.latest_version("pdf-tools")
    assert latest is not None and latest.version == changed.version
    assert await store.list_versions("never-published") == []


async def test_publish_refuses_bad_skills(tmp_path: Path) -> None:
    put(tmp_path, "skills/bad/SKILL.md", "---\nname: Bad\ndescription: d\n---\n")
    put(tmp_path, "skills/empty/readme.md", "no skill here")
    put(
        tmp_path,
        "skills/huge/SKILL.md",
        "---\nname: huge\ndescription: d\n---\n" + "x" * (2 * 1024 * 1024),
    )
    source, store = LocalSkillSource(tmp_path), SkillStore(memory_fs())
    with pytest.raises(InvalidSkillError, match="Skill name must contain only lowercase"):
        await publish_skill(source, "skills/bad", store)
    with pytest.raises(InvalidSkillError, match=r"^SKILL.md not found in skills/empty$"):
        await publish_skill(source, "skills/empty", store)
    with pytest.raises(InvalidSkillError, match="too large"):
        await publish_skill(source, "skills/huge", store)
    with pytest.raises(FileNotFoundError):
        await publish_skill(source, "skills/missing", store)
    assert await store.fs.exists("blobs") is False


async def test_versioned_source_serves_a_version(skill_root: Path) -> None:
    store = SkillStore(memory_fs())
    version = await publish_skill(LocalFilesystem(skill_root), "skills/pdf-tools", store)
    source = await VersionedSkillSource.from_store(store, {"pdf-tools": version.version})
    assert await source.exists("pdf-tools/references") and await source.exists(
        "/pdf-tools/SKILL.md"
    )
    assert not await source.exists("pdf-tools/nope")
    assert [e.name for e in await source.readdir("")] == ["pdf-tools"]
    assert [(e.name, e.type) for e in await source.readdir("pdf-tools")] == [
        ("SKILL.md", "file"),
        ("assets", "directory"),
        ("references", "directory"),
        ("scripts", "directory"),
    ]
    stat = await source.stat("pdf-tools/assets/logo.png")
    assert (stat.type, stat.size, stat.etag, stat.modified_at) == (
        "file",
        7,
        sha256(LOGO),
        version.created_at,
    )
    assert (await source.stat("pdf-tools")).type == "directory"
    with pytest.raises(FileNotFoundError):
        await source.stat("pdf-tools/none")
    with pytest.raises(IsADirectoryError):
        await source.read_file("pdf-tools/assets")
    with pytest.raises(NotADirectoryError):
        await source.readdir("pdf-tools/SKILL.md")

    ws = Workspace(skills=["."], skill_source=source)
    assert ws.skills is not None
    (listed,) = await ws.skills.list()
    assert (listed.name, listed.path, listed.license) == ("pdf-tools", "pdf-tools", "MIT")
    tools = await tools_of(ws)
    assert await tools["skill"].execute({"name": "pdf-tools"}) == (
        "# PDF Tools\n\nUse tables.\n\n## References\n- references/api.md\n\n## Scripts\n- scripts/run.sh"
        "\n\n## Assets\n- assets/copy.png\n- assets/logo.png"
    )
    read = tools["skill_read"]
    assert await read.execute(
        {"skillName": "pdf-tools", "path": "references/api.md", "startLine": 2, "endLine": 3}
    ) == ("references/api.md (lines 2-3 of 4)\nline2\nline3")
    assert (
        await read.execute({"skillName": "pdf-tools", "path": "assets/logo.png"})
        == "Binary file: pdf-tools/assets/logo.png (7 bytes)"
    )
    # nothing can change in a published version: the staleness check never refreshes
    ws.skills.staleness_cooldown = 0
    await ws.skills.maybe_refresh()
    assert [s.name for s in await ws.skills.list()] == ["pdf-tools"]


async def test_tampered_blob_is_never_served(
    skill_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fs = memory_fs()
    store = SkillStore(fs)
    version = await publish_skill(LocalFilesystem(skill_root), "skills/pdf-tools", store)
    api = version.files["references/api.md"]
    await fs.write_file(store.blob_path(api.hash), b"line1\nline2\nEVIL\nline4")
    source = VersionedSkillSource(store, [version])
    with pytest.raises(BlobIntegrityError) as caught:
        await source.read_file("pdf-tools/references/api.md")
    assert str(caught.value).startswith(
        f"Blob content does not match hash {api.hash} (file: pdf-tools/references/api.md)"
    )
    ws = Workspace(skills=["."], skill_source=source)
    read = (await tools_of(ws))["skill_read"]
    with pytest.raises(BlobIntegrityError):
        await read.execute({"skillName": "pdf-tools", "path": "references/api.md"})
    # a tampered SKILL.md makes the skill unloadable (skipped, with the reason logged)
    skill_md = version.files["SKILL.md"]
    await fs.write_file(
        store.blob_path(skill_md.hash), SKILL_MD.replace("Use tables", "Use t4bles")
    )
    caplog.set_level(logging.ERROR, "agentvfs.skills")
    fresh = WorkspaceSkills(VersionedSkillSource(store, [version]), ["."])
    assert await fresh.list() == []
    assert (
        "Failed to load skill from pdf-tools/SKILL.md: Blob content does not match hash"
        in caplog.text
    )


async def test_tampered_manifest_is_refused(skill_root: Path) -> None:
    fs = memory_fs()
    store = SkillStore(fs)
    version = await publish_skill(LocalFilesystem(skill_root), "skills/pdf-tools", store)
    path = store.manifest_path("pdf-tools", version.version)
    manifest = json.loads(await fs.read_file(path))
    manifest["files"]["references/api.md"]["hash"] = version.files["assets/logo.png"].hash
    await fs.write_file(path, json.dumps(manifest))
    with pytest.raises(BlobIntegrityError, match="does not match its version id"):
        await store.get_version("pdf-tools", version.version)
    manifest["files"]["../../etc/passwd"] = manifest["files"].pop("SKILL.md")
    await fs.write_file(path, json.dumps(manifest))
    with pytest.raises(BlobIntegrityError, match=r"invalid file path '\.\./\.\./etc/passwd'"):
        await store.get_version("pdf-tools", version.version)
    await fs.write_file(path, b"{not json")
    with pytest.raises(BlobIntegrityError, match="Malformed skill version manifest"):
        await store.get_version("pdf-tools", version.version)
    with pytest.raises(ValueError, match="not a SHA-256"):
        store.blob_path("../../x")
    with pytest.raises(ValueError, match="invalid skill name"):
        store.manifest_path("../x", version.version)
    with pytest.raises(FileNotFoundError):
        await VersionedSkillSource.from_store(store, {"other": None})
    with pytest.raises(ValueError, match="two versions"):
        VersionedSkillSource(store, [version, version])


@pytest.mark.s3
async def test_versioned_skills_round_trip_through_s3(moto: MotoServer) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{uuid.uuid4().hex[:10]}"
    live = FsspecFilesystem(raw, root=f"{prefix}/live")
    await live.write_file("skills/pdf-tools/SKILL.md", SKILL_MD)
    await live.write_file("skills/pdf-tools/references/api.md", "line1\nline2\nline3\nline4")
    await live.write_file("skills/pdf-tools/assets/logo.png", LOGO)
    await live.write_file(
        "skills/other/SKILL.md", "---\nname: other\ndescription: d\n---\nOther body\n"
    )

    # discovery straight from S3, and a new skill noticed by the staleness check
    ws_live = Workspace(filesystem=live, skills=["skills"])
    assert ws_live.skills is not None
    assert [s.name for s in await ws_live.skills.list()] == ["other", "pdf-tools"]
    ws_live.skills.staleness_cooldown = 0
    await ws_live.skills.maybe_refresh()
    await live.write_file("skills/third/SKILL.md", "---\nname: third\ndescription: d\n---\nThird\n")
    await ws_live.skills.maybe_refresh()
    assert [s.name for s in await ws_live.skills.list()] == ["other", "pdf-tools", "third"]

    # publish to a store on another S3 prefix, then serve the version
    store = SkillStore(raw, prefix=f"{prefix}/store")
    version = await publish_skill(live, "skills/pdf-tools", store)
    assert await publish_skill(live, "skills/pdf-tools", store) == version
    served = await VersionedSkillSource.from_store(
        SkillStore(FsspecFilesystem(raw, root=f"{prefix}/store")), {"pdf-tools": None}
    )
    ws = Workspace(skills=["."], skill_source=served)
    tools = await tools_of(ws)
    assert str(await tools["skill"].execute({"name": "pdf-tools"})).startswith(
        "# PDF Tools\n\nUse tables.\n\n## References"
    )
    assert await tools["skill_read"].execute(
        {"skillName": "pdf-tools", "path": "references/api.md", "startLine": 4}
    ) == ("references/api.md (lines 4-4 of 4)\nline4")
    # a blob overwritten behind the store's back is refused
    api = version.files["references/api.md"]
    raw.pipe(f"{prefix}/store/blobs/{api.hash[:2]}/{api.hash}", b"tampered")
    tampered = VersionedSkillSource(SkillStore(raw, prefix=f"{prefix}/store"), [version])
    with pytest.raises(BlobIntegrityError):
        await tampered.read_file("pdf-tools/references/api.md")
