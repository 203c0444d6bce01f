"""Agent skills: SKILL.md discovery, the ``WorkspaceSkills`` API (``workspace.skills``),
and where skills are read from (the workspace filesystem, ``LocalSkillSource``, or published
versions in a content-addressed ``SkillStore`` served by ``VersionedSkillSource``)."""

from .._exports import fixup_module_metadata
from ..errors import BlobIntegrityError as BlobIntegrityError
from ..errors import InvalidSkillError as InvalidSkillError
from ..errors import InvalidSkillPathError as InvalidSkillPathError
from ..errors import SkillConflictError as SkillConflictError
from ._parse import parse_skill_md as parse_skill_md
from ._parse import validate_skill_metadata as validate_skill_metadata
from ._records import ContentSource as ContentSource
from ._records import Skill as Skill
from ._records import SkillMetadata as SkillMetadata
from ._records import SkillSearchResult as SkillSearchResult
from ._skills import SkillsHost as SkillsHost
from ._skills import WorkspaceSkills as WorkspaceSkills
from ._skills import create_workspace_skills as create_workspace_skills
from ._sources import LocalSkillSource as LocalSkillSource
from ._sources import SkillSource as SkillSource
from ._versioned import BlobRef as BlobRef
from ._versioned import SkillStore as SkillStore
from ._versioned import SkillVersion as SkillVersion
from ._versioned import VersionedSkillSource as VersionedSkillSource
from ._versioned import publish_skill as publish_skill

__all__ = [
    "BlobIntegrityError",
    "BlobRef",
    "ContentSource",
    "InvalidSkillError",
    "InvalidSkillPathError",
    "LocalSkillSource",
    "Skill",
    "SkillConflictError",
    "SkillMetadata",
    "SkillSearchResult",
    "SkillSource",
    "SkillStore",
    "SkillVersion",
    "SkillsHost",
    "VersionedSkillSource",
    "WorkspaceSkills",
    "create_workspace_skills",
    "parse_skill_md",
    "publish_skill",
    "validate_skill_metadata",
]

fixup_module_metadata(__name__, globals())
