"""Value objects of the skills API and its errors."""

from __future__ import annotations

import errno as _errno
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "BlobIntegrityError",
    "ContentSource",
    "InvalidSkillError",
    "InvalidSkillPathError",
    "Skill",
    "SkillConflictError",
    "SkillMetadata",
    "SkillSearchResult",
    "SourceType",
]

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


class InvalidSkillError(ValueError):
    """A SKILL.md that cannot be loaded: unreadable front matter, or metadata that breaks the
    Agent Skills rules (the message lists every problem, one a line)."""

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.errors = list(errors or [])


class SkillConflictError(ValueError):
    """Two distinct skills of the same name and the same source type: neither wins."""


class InvalidSkillPathError(ValueError, PermissionError):
    """A path inside a skill that is absolute, climbs out with ``..``, or resolves outside the
    skill directory (``EACCES``); nothing outside the skill is ever read."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.errno = _errno.EACCES
        self.strerror = message

    def __str__(self) -> str:
        return self.strerror or ""


class BlobIntegrityError(OSError):
    """A stored blob whose content does not hash to its name (``EIO``): it is never served."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = _errno.EIO
        self.strerror = message

    def __str__(self) -> str:
        return self.strerror or ""
