"""Value objects of the skills API (its errors are in :mod:`agentvfs.errors`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ContentSource", "Skill", "SkillMetadata", "SkillSearchResult", "SourceType"]

SourceType = Literal["local", "managed", "external"]


@dataclass(frozen=True, slots=True)
class ContentSource:
    """Where a skill was found: the configured skills path and what kind of place it is.

    ``type`` is ``external`` for a path with a ``node_modules`` segment, ``managed`` for one
    under ``.mastra/skills``, else ``local``; same-named skills prefer local, then managed,
    then external.
    """

    type: SourceType
    path: str

    @property
    def project_path(self) -> str | None:
        """The configured path of a ``local`` source (the reference's ``projectPath``)."""
        return self.path if self.type == "local" else None

    @property
    def mastra_path(self) -> str | None:
        """The configured path of a ``managed`` source (the reference's ``mastraPath``)."""
        return self.path if self.type == "managed" else None

    @property
    def package_path(self) -> str | None:
        """The configured path of an ``external`` source (the reference's ``packagePath``)."""
        return self.path if self.type == "external" else None


@dataclass(frozen=True, slots=True)
class SkillMetadata:
    """What ``WorkspaceSkills.list()`` tells about a skill: its SKILL.md front matter and
    where it lives (``path``: the directory holding SKILL.md, in the source's path space)."""

    name: str
    path: str
    description: str
    license: str | None = None
    compatibility: Any = None
    user_invocable: bool | None = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Skill(SkillMetadata):
    """A whole skill (``WorkspaceSkills.get()``): the metadata, the SKILL.md body as
    ``instructions``, its source, and the files below ``references/``, ``scripts/`` and
    ``assets/`` (paths relative to that directory)."""

    instructions: str = ""
    source: ContentSource = field(default_factory=lambda: ContentSource("local", ""))
    references: tuple[str, ...] = ()
    scripts: tuple[str, ...] = ()
    assets: tuple[str, ...] = ()

    def to_metadata(self) -> SkillMetadata:
        """The listing record of this skill."""
        return SkillMetadata(
            self.name,
            self.path,
            self.description,
            self.license,
            self.compatibility,
            self.user_invocable,
            self.metadata,
        )


@dataclass(frozen=True, slots=True)
class SkillSearchResult:
    """One skill search hit: which skill, which of its files (``SKILL.md`` or
    ``references/<path>``), the matching text and its score."""

    skill_name: str
    skill_path: str
    source: str
    content: str
    score: float
    line_range: tuple[int, int] | None = None
    score_details: dict[str, float] = field(default_factory=dict)
