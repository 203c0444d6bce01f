"""The layering of ``src/agentvfs``, as ``docs/architecture.md`` draws it, kept by a test.

Every import in the package is read from the source (including imports inside functions and
under ``TYPE_CHECKING``: a type-only import is still a dependency). Two rules:

1. a unit imports only the units below it (the table ``MAY_IMPORT``);
2. a module never reaches into a private module (``_name``) of another unit, or imports a
   private name from it: what one unit needs of another is a public name of that unit.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

import agentvfs

PACKAGE = Path(agentvfs.__file__).parent

#: The foundation: errors, the request context, the export helper, small async helpers and
#: the process check.
FOUNDATION = frozenset({"errors", "_context", "_exports", "_aio", "_procs"})
#: What each unit may import besides itself. A unit is a subpackage (``vfs``) or a module at
#: the top of the package (``workspace``, ``cli``); ``agentvfs`` is the package's __init__.
BELOW_WORKSPACE = FOUNDATION | {"vfs", "mounts", "search", "snapshots", "sandbox", "skills", "tools"}
APPLICATION = BELOW_WORKSPACE | {"agentvfs", "workspace", "_blocking", "_config", "_demo_skills", "_providers"}
MAY_IMPORT: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "_exports": frozenset(),
    "_aio": frozenset(),
    "_procs": frozenset(),
    "_context": frozenset(),
    "vfs": FOUNDATION,
    "mounts": FOUNDATION | {"vfs"},
    "search": FOUNDATION | {"vfs"},
    "snapshots": FOUNDATION | {"vfs"},
    "sandbox": FOUNDATION | {"vfs", "mounts"},
    "skills": FOUNDATION | {"vfs", "search"},
    "tools": FOUNDATION | {"vfs", "search", "sandbox", "skills"},
    "_providers": FOUNDATION | {"vfs"},
    "workspace": BELOW_WORKSPACE | {"_blocking", "_providers"},
    "_blocking": FOUNDATION | {"vfs", "workspace"},
    "_config": BELOW_WORKSPACE | {"workspace"},
    "_demo_skills": BELOW_WORKSPACE | {"workspace"},
    "agentvfs": BELOW_WORKSPACE | {"workspace"},
    # The adversarial suite attacks the adapters too (archives they restore).
    "testing": APPLICATION | {"integrations"},
    "bench": APPLICATION | {"testing"},
    "integrations": APPLICATION,
    "cli": APPLICATION | {"testing", "bench"},
    "__main__": FOUNDATION | {"cli"},
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted
    name: str | None  # the imported name (``from target import name``), if any
    line: int

    def __str__(self) -> str:
        what = f"{self.target}.{self.name}" if self.name else self.target
        return f"{self.module}:{self.line} imports {what}"


def _module_name(path: Path) -> tuple[str, str]:
    """The dotted name of a source file, and the package its relative imports start from."""
    parts = ["agentvfs", *path.relative_to(PACKAGE).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def imports() -> list[Import]:
    return list(_imports_under(PACKAGE))


@functools.cache
def _imports_under(root: Path) -> tuple[Import, ...]:
    """Every import of the source under ``root``, read once per session (each rule reads
    them all)."""
    found: list[Import] = []
    for path in sorted(root.rglob("*.py")):
        module, package = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [Import(module, a.name, None, node.lineno) for a in node.names if a.name.startswith("agentvfs")]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target == "agentvfs" or target.startswith("agentvfs."):
                    found += [Import(module, target, a.name, node.lineno) for a in node.names]
    return tuple(found)


def unit(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "agentvfs"


def resolved(imp: Import) -> str:
    """The module an import really reaches: ``from agentvfs.vfs import _paths`` reaches the
    module ``agentvfs.vfs._paths``; ``from agentvfs import vfs`` reaches ``agentvfs.vfs``."""
    if imp.name is not None and (PACKAGE.joinpath(*imp.target.split(".")[1:], imp.name).is_dir()
                                 or PACKAGE.joinpath(*imp.target.split(".")[1:], imp.name + ".py").is_file()):
        return f"{imp.target}.{imp.name}"
    return imp.target


def test_every_unit_is_known() -> None:
    units = {unit(i.module) for i in imports()} | {unit(resolved(i)) for i in imports()}
    assert units <= set(MAY_IMPORT), sorted(units - set(MAY_IMPORT))


def test_each_unit_imports_only_the_units_below_it() -> None:
    broken = [
        str(i) for i in imports()
        if unit(i.module) != unit(resolved(i)) and unit(resolved(i)) not in MAY_IMPORT[unit(i.module)]
    ]
    assert not broken, "imports against the layering:\n" + "\n".join(broken)


def test_no_module_reaches_into_another_units_private_modules() -> None:
    broken = []
    for i in imports():
        target = resolved(i)
        if unit(i.module) == unit(target):
            continue
        inner = target.split(".")[2:]  # below the unit
        private_module = any(part.startswith("_") for part in inner)
        private_name = i.name is not None and i.name.startswith("_") and target == resolved(i) and i.name != "__version__"
        if private_module or private_name:
            broken.append(str(i))
    assert not broken, "private names of another unit:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    ("source", "expected", "rule"),
    [
        ("from ..vfs._base import walk", "agentvfs.mounts._x:1 imports agentvfs.vfs._base.walk", "private"),
        ("from ..vfs import _paths", "agentvfs.mounts._x:1 imports agentvfs.vfs._paths", "private"),
        ("from ..tools import _glob", "agentvfs.mounts._x:1 imports agentvfs.tools._glob", "layering"),
    ],
)
def test_the_rules_catch_what_they_are_for(
    source: str, expected: str, rule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test itself must fail on the imports it forbids: plant one in a copy of a unit.
    (tmp_path / "mounts").mkdir()
    (tmp_path / "mounts" / "_x.py").write_text(source + "\n")
    for sub in ("vfs", "tools"):
        (tmp_path / sub).mkdir()
        for name in ("_base.py", "_paths.py", "_glob.py", "__init__.py"):
            (tmp_path / sub / name).write_text("")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    planted = [i for i in imports() if i.module == "agentvfs.mounts._x"]
    assert [str(i) for i in planted] == [expected]
    check = {
        "layering": test_each_unit_imports_only_the_units_below_it,
        "private": test_no_module_reaches_into_another_units_private_modules,
    }[rule]
    with pytest.raises(AssertionError, match=r"agentvfs\.mounts\._x:1"):
        check()
