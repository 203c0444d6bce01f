"""SKILL.md: YAML front matter plus a markdown body, checked against the Agent Skills rules
(reference §17.1), with the reference's messages.

Front matter is read with PyYAML's safe loader only (``safe_load``'s, in C when available):
no tags that build objects, no other front-matter languages (JavaScript front matter would
be code).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import InvalidSkillError

__all__ = [
    "MAX_COMPATIBILITY_LENGTH",
    "MAX_DESCRIPTION_LENGTH",
    "MAX_INSTRUCTION_LINES",
    "MAX_INSTRUCTION_TOKENS",
    "MAX_NAME_LENGTH",
    "MAX_SKILL_FILE_BYTES",
    "ParsedSkill",
    "ValidationResult",
    "parse_skill_md",
    "split_front_matter",
    "validate_skill_metadata",
]

MAX_NAME_LENGTH = 64
MAX_DESCRIPTION_LENGTH = 1024
MAX_COMPATIBILITY_LENGTH = 500
#: Above these the body still loads, with a warning suggesting ``references/``.
MAX_INSTRUCTION_LINES = 500
MAX_INSTRUCTION_TOKENS = 5000
#: A SKILL.md larger than this is refused unread: instructions are meant to be read whole
#: into a model's context, and a runaway file must not be pulled into memory on discovery.
MAX_SKILL_FILE_BYTES = 1024 * 1024

_NAME = re.compile(r"^[a-z0-9-]+$")
_DELIMITER = "---"
_CLOSE = re.compile(r"^---[ \t]*\r?$", re.MULTILINE)
_YAML_LANGUAGES = frozenset({"", "yaml", "yml"})
#: ``yaml.safe_load``'s loader, in its C build when PyYAML has one (eight times faster; the
#: same safe subset of YAML: plain data, no tags that construct objects).
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """Errors make a skill invalid; warnings are only logged."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors


@dataclass(frozen=True, slots=True)
class ParsedSkill:
    """A parsed SKILL.md: its front matter (a mapping) and the trimmed body."""

    front_matter: dict[str, Any]
    instructions: str
    warnings: list[str] = field(default_factory=list)


def _js_type(value: Any) -> str:
    """The JavaScript ``typeof`` of a YAML value (the reference's messages name these)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object"  # null, lists, mappings and dates alike


_MISSING = object()


def _type_of(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key, _MISSING)
    return "undefined" if value is _MISSING else _js_type(value)


def split_front_matter(text: str, file_path: str = "SKILL.md") -> tuple[dict[str, Any], str]:
    """Split ``text`` into its front matter (a mapping; ``{}`` if there is none) and body.

    As gray-matter: the file starts with ``---`` (optionally followed by the language, which
    must be YAML), and the front matter ends at the next line that is ``---``.

    Raises
    ------
    InvalidSkillError
        Front matter that is not closed, not YAML, not valid YAML, or not a mapping.
    """
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.startswith(_DELIMITER) or text[len(_DELIMITER) : len(_DELIMITER) + 1] == "-":
        return {}, text
    rest = text[len(_DELIMITER) :]
    first_line, newline, rest = rest.partition("\n")
    language = first_line.strip().lower()
    if language not in _YAML_LANGUAGES:
        raise InvalidSkillError(
            f"Invalid front matter in {file_path}: language {first_line.strip()!r} is not "
            "supported (only YAML front matter is read)"
        )
    if not newline:
        raise InvalidSkillError(f"Invalid front matter in {file_path}: no closing --- line")
    close = _CLOSE.search(rest)
    if close is None:
        raise InvalidSkillError(f"Invalid front matter in {file_path}: no closing --- line")
    block = rest[: close.start()]
    body = rest[close.end() :]
    if body.startswith("\n"):
        body = body[1:]
    try:
        data = yaml.load(block, Loader=_SAFE_LOADER) if block.strip() else None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise InvalidSkillError(f"Invalid YAML front matter in {file_path}: {detail}") from None
    if data is None:
        return {}, body
    if not isinstance(data, dict):
        kind = "array" if isinstance(data, list) else _js_type(data)
        message = f"Expected object, received {kind}"
        raise InvalidSkillError(f"Invalid skill metadata in {file_path}:\n{message}", [message])
    return {str(k): v for k, v in data.items()}, body


def _validate_name(data: Mapping[str, Any]) -> list[str]:
    name = data.get("name", _MISSING)
    if not isinstance(name, str):
        return [f"name: Expected string, received {_type_of(data, 'name')}"]
    if not name:
        return ["name: Skill name cannot be empty"]
    errors = []
    if len(name) > MAX_NAME_LENGTH:
        errors.append(f"name: Skill name must be {MAX_NAME_LENGTH} characters or less")
    if not _NAME.match(name):
        errors.append("name: Skill name must contain only lowercase letters, numbers, and hyphens")
    if name.startswith("-") or name.endswith("-"):
        errors.append("name: Skill name must not start or end with a hyphen")
    if "--" in name:
        errors.append("name: Skill name must not contain consecutive hyphens")
    return errors


def _validate_description(data: Mapping[str, Any]) -> list[str]:
    description = data.get("description", _MISSING)
    if not isinstance(description, str):
        return [f"description: Expected string, received {_type_of(data, 'description')}"]
    if not description:
        return ["description: Skill description cannot be empty"]
    errors = []
    if len(description) > MAX_DESCRIPTION_LENGTH:
        errors.append(
            f"description: Skill description must be {MAX_DESCRIPTION_LENGTH} characters or less"
        )
    if not description.strip():
        errors.append("description: Skill description cannot be only whitespace")
    return errors


def estimate_tokens(text: str) -> int:
    """The reference's rough token count: words times 1.3, rounded up."""
    return math.ceil(len(text.split()) * 1.3)


def validate_skill_metadata(
    data: Any, dir_name: str | None = None, instructions: str | None = None
) -> ValidationResult:
    """Check front matter against the Agent Skills rules.

    Parameters
    ----------
    data : Any
        The front matter.
    dir_name : str, optional
        The directory holding SKILL.md: the name must equal it (not checked when empty).
    instructions : str, optional
        The body, for the length warnings.
    """
    if not isinstance(data, Mapping):
        kind = "null" if data is None else "array" if isinstance(data, list) else _js_type(data)
        return ValidationResult([f"Expected object, received {kind}"])
    errors = [*_validate_name(data), *_validate_description(data)]
    license = data.get("license")
    if license is not None and not isinstance(license, str):
        errors.append(f"license: Expected string, received {_js_type(license)}")
    invocable = data.get("user-invocable", _MISSING)
    if invocable is not _MISSING and not isinstance(invocable, bool):
        errors.append(f"user-invocable: Expected boolean, received {_js_type(invocable)}")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        kind = "array" if isinstance(metadata, list) else _js_type(metadata)
        errors.append(f"metadata: Expected object, received {kind}")
    name = data.get("name")
    if dir_name and isinstance(name, str) and name != dir_name:
        errors.append(f'Skill name "{name}" must match directory name "{dir_name}"')
    warnings = []
    if instructions:
        lines = instructions.count("\n") + 1
        tokens = estimate_tokens(instructions)
        if lines > MAX_INSTRUCTION_LINES:
            warnings.append(
                f"Instructions have {lines} lines (recommended: <{MAX_INSTRUCTION_LINES}). "
                "Consider moving content to references/."
            )
        if tokens > MAX_INSTRUCTION_TOKENS:
            warnings.append(
                f"Instructions have ~{tokens} estimated tokens (recommended: "
                f"<{MAX_INSTRUCTION_TOKENS}). Consider moving content to references/."
            )
    return ValidationResult(errors, warnings)


def parse_skill_md(
    content: str | bytes,
    *,
    file_path: str = "SKILL.md",
    dir_name: str | None = None,
    validate: bool = True,
) -> ParsedSkill:
    """Parse a SKILL.md: front matter, body (trimmed), validation.

    Parameters
    ----------
    content : str or bytes
        The file; bytes are decoded as UTF-8 (invalid sequences replaced).
    file_path : str
        Named in error messages.
    dir_name : str, optional
        The directory the file is in; the skill's name must equal it.
    validate : bool
        Apply the Agent Skills rules (errors raise, warnings are returned).

    Raises
    ------
    InvalidSkillError
        Larger than ``MAX_SKILL_FILE_BYTES``, bad front matter, or (with ``validate``) metadata
        that breaks the rules: ``Invalid skill metadata in <file>:`` and one problem a line.
    """
    size = len(content) if isinstance(content, bytes) else len(content.encode("utf-8", "replace"))
    if size > MAX_SKILL_FILE_BYTES:
        raise InvalidSkillError(too_large_message(file_path, size))
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    front, body = split_front_matter(text, file_path)
    instructions = body.strip()
    warnings: list[str] = []
    if validate:
        result = validate_skill_metadata(front, dir_name, instructions)
        if not result.valid:
            raise InvalidSkillError(
                f"Invalid skill metadata in {file_path}:\n" + "\n".join(result.errors),
                result.errors,
            )
        warnings = result.warnings
    return ParsedSkill(front, instructions, warnings)


def too_large_message(file_path: str, size: int) -> str:
    return (
        f"{file_path} is too large to load as a skill ({size} bytes; the limit is "
        f"{MAX_SKILL_FILE_BYTES} bytes). Move content to references/."
    )
