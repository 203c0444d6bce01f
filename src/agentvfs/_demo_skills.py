"""The skills part of ``agentvfs demo``: a skill on disk, listed and opened through the tools."""

from __future__ import annotations

import tempfile
from collections.abc import Callable

__all__ = ["demo_skills"]

_SKILL_MD = """\
---
name: release-notes
description: Write release notes from a list of merged changes.
license: Apache-2.0
metadata:
  owner: docs
---
# Release notes

1. Group the changes by area (API, CLI, docs).
2. Lead with user-visible changes; one line each, imperative mood.
3. Read references/style.md for the house style before writing.
"""

_STYLE = "# Style\n\nUse sentence case.\nLink every change to its pull request.\nNo emoji.\n"


async def demo_skills(say: Callable[[str], None]) -> None:
    """Build a skill in a temporary directory, then list it, open it with the ``skill`` tool
    and read one of its references with ``skill_read``, printing through ``say``."""
    from .vfs import LocalFilesystem
    from .workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="agentvfs-skills-") as root:
        files = LocalFilesystem(root)
        await files.write_file("skills/release-notes/SKILL.md", _SKILL_MD)
        await files.write_file("skills/release-notes/references/style.md", _STYLE)
        async with Workspace(filesystem=files, skills=["skills"], bm25=True) as ws:
            skills = ws.skills
            assert skills is not None
            say("skills:")
            for meta in await skills.list():
                say(f"  {meta.name} ({meta.path}): {meta.description}")
            tools = await ws.create_tools()
            say(f"skill tools: {', '.join(n for n in tools if n.startswith('skill'))}")
            say('skill {"name": "release-notes"} ->')
            for line in str(await tools["skill"].execute({"name": "release-notes"})).splitlines():
                say(f"    {line}".rstrip())
            args = {
                "skillName": "release-notes",
                "path": "references/style.md",
                "startLine": 3,
                "endLine": 4,
            }
            say(f"skill_read {args} ->")
            for line in str(await tools["skill_read"].execute(args)).splitlines():
                say(f"    {line}".rstrip())
            found = str(await tools["skill_search"].execute({"query": "pull request"}))
            say(f"skill_search pull request -> {found.splitlines()[0]}")
