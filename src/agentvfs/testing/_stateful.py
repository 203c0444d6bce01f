"""A Hypothesis state machine that runs random operation sequences against a filesystem.

Every step is applied to the filesystem under test and to :class:`FsModel`, an in-memory
model of the contract in :mod:`agentvfs.vfs._base` (a dict of file path -> bytes plus a set
of directory paths; the root always exists). The step fails when the two disagree on the
result or on the *category* of the error (``ENOENT``, ``EEXIST``, ``EISDIR``, ``ENOTDIR``,
``ENOTEMPTY``, ``EACCES``); messages are not compared. An invariant compares the whole tree
(a recursive listing of the root) with the model after every step, and every few steps also
the content of every file, through the filesystem and through the harness's storage oracle.

Usage::

    Machine = make_state_machine(memory_harness)
    run_state_machine_as_test(Machine, settings=settings(max_examples=60))

A harness whose storage needs cleaning up after an example can put a callable under
``harness.extra["cleanup"]``; the machine calls it at teardown.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar, TypeVar

import anyio
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ..vfs import FileEntry, WorkspaceFilesystem
from ._harness import Harness

__all__ = [
    "FilesystemStateMachine",
    "FsModel",
    "ModelError",
    "error_category",
    "make_state_machine",
]

T = TypeVar("T")

#: Path segments: few enough that paths collide, usable both as file and directory names.
NAMES = ("a", "b", "c.txt", "d.txt")
MAX_DEPTH = 3

paths: st.SearchStrategy[str] = st.lists(
    st.sampled_from(NAMES), min_size=1, max_size=MAX_DEPTH
).map("/".join)
contents: st.SearchStrategy[bytes] = st.binary(max_size=12)


def error_category(exc: BaseException) -> str | None:
    """The contract's name for an error: an errno code, or None if it is not a filesystem error."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno == errno.ENOTEMPTY:
        return "ENOTEMPTY"
    for cls, code in (
        (FileNotFoundError, "ENOENT"),
        (FileExistsError, "EEXIST"),
        (IsADirectoryError, "EISDIR"),
        (NotADirectoryError, "ENOTDIR"),
        (PermissionError, "EACCES"),
    ):
        if isinstance(exc, cls):
            return code
    if exc.errno is not None and exc.errno in errno.errorcode:
        return errno.errorcode[exc.errno]
    return f"{type(exc).__name__}(errno={exc.errno})"


class ModelError(Exception):
    """The model's verdict that an operation fails with the error ``category``."""

    def __init__(self, category: str) -> None:
        super().__init__(category)
        self.category = category


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _ancestors(path: str) -> list[str]:
    """Proper ancestors of ``path`` from the top down, without the root."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class FsModel:
    """The workspace filesystem contract over a dict of files and a set of directories.

    Paths are normalised and relative (``""`` is the root, which always exists). Every
    method checks first and mutates only when it succeeds; failures raise :class:`ModelError`.
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {""}
        #: Error categories the current operation may raise instead of the model's verdict:
        #: known backend deviations from the contract, each explained where it is set.
        self.tolerated: set[str] = set()

    def copy(self) -> FsModel:
        other = FsModel()
        other.files = dict(self.files)
        other.dirs = set(self.dirs)
        return other

    # -- helpers -------------------------------------------------------------------------------

    def parent_state(self, path: str) -> str:
        """``ok`` (parent is a directory), ``ENOTDIR`` (an ancestor is a file) or ``missing``.

        The first ancestor, from the top, that is not a directory decides; a file cannot lie
        below a missing directory, so there is no ambiguity.
        """
        for anc in _ancestors(path):
            if anc in self.dirs:
                continue
            return "ENOTDIR" if anc in self.files else "missing"
        return "ok"

    def _check_parent(self, path: str, *, recursive: bool) -> None:
        """The errors of creating ``path``: with ``recursive`` missing parents are created
        and a file anywhere above is ``ENOTDIR``; without it the parent itself must be a
        directory (``ENOTDIR`` if it is a file, ``ENOENT`` if it is missing, even when a file
        lies further up: the contract's "parent missing")."""
        if recursive:
            if self.parent_state(path) == "ENOTDIR":
                raise ModelError("ENOTDIR")
            return
        parent = _parent(path)
        if parent in self.files:
            raise ModelError("ENOTDIR")
        if parent not in self.dirs:
            raise ModelError("ENOENT")

    def _make_parents(self, path: str) -> None:
        self.dirs.update(_ancestors(path))

    def children(self, path: str) -> dict[str, str]:
        """Name -> kind of the entries directly in directory ``path``."""
        out: dict[str, str] = {}
        for p in (*self.dirs, *self.files):
            if p and _parent(p) == path:
                out[p.rpartition("/")[2]] = "directory" if p in self.dirs else "file"
        return out

    def tree(self) -> dict[str, tuple[str, int | None]]:
        """Every path except the root -> (kind, size of files)."""
        out: dict[str, tuple[str, int | None]] = {d: ("directory", None) for d in self.dirs if d}
        out.update({f: ("file", len(data)) for f, data in self.files.items()})
        return out

    # -- operations ----------------------------------------------------------------------------

    def write_file(self, path: str, data: bytes, *, overwrite: bool, recursive: bool) -> None:
        if path in self.dirs:
            raise ModelError("EISDIR")
        self._check_parent(path, recursive=recursive)
        if path in self.files and not overwrite:
            raise ModelError("EEXIST")
        self._make_parents(path)
        self.files[path] = data

    def read_file(self, path: str) -> bytes:
        if path in self.dirs:
            raise ModelError("EISDIR")
        if path not in self.files:
            raise ModelError("ENOENT")
        return self.files[path]

    def append_file(self, path: str, data: bytes) -> None:
        if path in self.dirs:
            raise ModelError("EISDIR")
        if path in self.files:
            self.files[path] += data
            return
        # Creating a missing file is a write with the default recursive=True.
        self.write_file(path, data, overwrite=False, recursive=True)

    def delete_file(self, path: str, *, force: bool) -> None:
        if path in self.dirs:
            raise ModelError("EISDIR")
        if path not in self.files:
            if force:
                return
            raise ModelError("ENOENT")
        # The directory of the deleted file stays, even when it becomes empty.
        del self.files[path]

    def mkdir(self, path: str, *, recursive: bool) -> None:
        if path in self.dirs:
            return
        if path in self.files:
            raise ModelError("EEXIST")
        self._check_parent(path, recursive=recursive)
        self._make_parents(path)
        self.dirs.add(path)

    def rmdir(self, path: str, *, recursive: bool, force: bool) -> None:
        if path == "":
            raise ModelError("EACCES")
        if path in self.files:
            raise ModelError("ENOTDIR")
        if path not in self.dirs:
            if force:
                return
            raise ModelError("ENOENT")
        below = path + "/"
        inside = [p for p in (*self.dirs, *self.files) if p.startswith(below)]
        if inside and not recursive:
            raise ModelError("ENOTEMPTY")
        for p in inside:
            self.dirs.discard(p)
            self.files.pop(p, None)
        self.dirs.discard(path)

    def readdir(self, path: str) -> dict[str, str]:
        if path in self.files:
            raise ModelError("ENOTDIR")
        if path not in self.dirs:
            raise ModelError("ENOENT")
        return self.children(path)

    def stat(self, path: str) -> tuple[str, int | None]:
        if path in self.dirs:
            return "directory", None
        if path in self.files:
            return "file", len(self.files[path])
        raise ModelError("ENOENT")

    def exists(self, path: str) -> bool:
        return path in self.dirs or path in self.files

    def copy_file(self, src: str, dest: str, *, overwrite: bool) -> None:
        """Copy a file (``recursive=False``); parents of ``dest`` are created."""
        if src in self.dirs:
            raise ModelError("EISDIR")
        if src not in self.files:
            raise ModelError("ENOENT")
        if dest in self.dirs:
            raise ModelError("EISDIR")
        if dest in self.files and not overwrite:
            raise ModelError("EEXIST")
        if self.parent_state(dest) == "ENOTDIR":
            raise ModelError("ENOTDIR")
        self._make_parents(dest)
        self.files[dest] = self.files[src]

    def move_file(self, src: str, dest: str, *, overwrite: bool) -> None:
        """Move a file; parents of ``dest`` are created, the directory of ``src`` stays."""
        if src in self.dirs:
            raise ValueError("the model moves files only")
        if src not in self.files:
            raise ModelError("ENOENT")
        if not overwrite and self.exists(dest):
            raise ModelError("EEXIST")
        if src == dest:
            return  # like rename(2): moving a file onto itself is a no-op
        if dest in self.dirs:
            raise ModelError("EISDIR")
        if self.parent_state(dest) == "ENOTDIR":
            raise ModelError("ENOTDIR")
        self._make_parents(dest)
        self.files[dest] = self.files.pop(src)


def _outcome(result: object, error: str | None) -> str:
    return f"raised {error}" if error is not None else f"returned {result!r}"


class FilesystemStateMachine(RuleBasedStateMachine):
    """Random operations on ``make_harness().fs`` checked against :class:`FsModel`.

    Subclass it (or use :func:`make_state_machine`) and set ``make_harness``; every example
    gets a fresh harness, so it must build a filesystem over empty storage.
    """

    make_harness: ClassVar[Callable[[], Harness]]
    #: Compare file contents (through the filesystem and the oracle) every this many steps.
    deep_check_every: ClassVar[int] = 1

    def __init__(self) -> None:
        super().__init__()
        self.harness = type(self).make_harness()
        self.fs: WorkspaceFilesystem = self.harness.fs
        self.model = FsModel()
        self.steps = 0

    # -- plumbing ------------------------------------------------------------------------------

    def p(self, path: str) -> str:
        return self.harness.p(path)

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run one filesystem coroutine to completion on a fresh event loop."""
        return anyio.run(fn)

    def apply(
        self,
        desc: str,
        model_op: Callable[[FsModel], T],
        fs_op: Callable[[], Awaitable[Any]],
    ) -> tuple[T | None, Any]:
        """Apply an operation to both sides and check they agree on success vs error category.

        The model changes only if the operation succeeds. Returns (model result, fs result).
        """
        trial = self.model.copy()
        expected: T | None = None
        expected_error: str | None = None
        try:
            expected = model_op(trial)
        except ModelError as exc:
            expected_error = exc.category
        actual: Any = None
        actual_error: str | None = None
        raised: BaseException | None = None
        try:
            actual = self.run(fs_op)
        except OSError as exc:
            actual_error = error_category(exc)
            raised = exc
        if expected_error != actual_error and actual_error not in trial.tolerated:
            detail = f" ({type(raised).__name__}: {raised})" if raised is not None else ""
            raise AssertionError(
                f"{desc}: the model {_outcome(expected, expected_error)}, "
                f"the filesystem {_outcome(actual, actual_error)}{detail}"
            )
        if actual_error is not None:
            return None, None  # the expected error, or a tolerated one: the model stays
        trial.tolerated.clear()
        self.model = trial
        return expected, actual

    def draw_path(self, data: st.DataObject, pool: Iterable[str], label: str) -> str:
        """A path: mostly one that exists in the model (from ``pool``), else any."""
        existing = sorted(p for p in pool if p)
        if existing:
            pick_existing: bool = data.draw(st.integers(0, 3), label=f"{label} exists") > 0
            if pick_existing:
                return data.draw(st.sampled_from(existing), label=label)
        return data.draw(paths, label=label)

    def any_path(self, data: st.DataObject, label: str) -> str:
        return self.draw_path(data, (*self.model.files, *self.model.dirs), label)

    # -- rules ---------------------------------------------------------------------------------

    @initialize(seed=st.lists(st.tuples(paths, contents), max_size=4))
    def seed_tree(self, seed: list[tuple[str, bytes]]) -> None:
        """Start from a few files (plain writes, checked like any other step)."""
        for path, content in seed:
            self.apply(
                f"write_file({path!r}, {content!r})",
                functools.partial(
                    FsModel.write_file, path=path, data=content, overwrite=True, recursive=True
                ),
                functools.partial(self.fs.write_file, self.p(path), content),
            )

    @rule(data=st.data(), content=contents, overwrite=st.booleans(), recursive=st.booleans())
    def write_file(
        self, data: st.DataObject, content: bytes, overwrite: bool, recursive: bool
    ) -> None:
        path = self.any_path(data, "path")
        self.apply(
            f"write_file({path!r}, {content!r}, overwrite={overwrite}, recursive={recursive})",
            lambda m: m.write_file(path, content, overwrite=overwrite, recursive=recursive),
            functools.partial(
                self.fs.write_file, self.p(path), content, overwrite=overwrite, recursive=recursive
            ),
        )

    @rule(data=st.data())
    def read_file(self, data: st.DataObject) -> None:
        path = self.draw_path(data, self.model.files, "path")
        expected, actual = self.apply(
            f"read_file({path!r})",
            lambda m: m.read_file(path),
            functools.partial(self.fs.read_file, self.p(path)),
        )
        if expected is not None:
            assert actual == expected, f"read_file({path!r}): expected {expected!r}, got {actual!r}"

    @rule(data=st.data(), content=contents)
    def append_file(self, data: st.DataObject, content: bytes) -> None:
        path = self.any_path(data, "path")
        self.apply(
            f"append_file({path!r}, {content!r})",
            lambda m: m.append_file(path, content),
            functools.partial(self.fs.append_file, self.p(path), content),
        )

    @rule(data=st.data(), force=st.booleans())
    def delete_file(self, data: st.DataObject, force: bool) -> None:
        path = self.draw_path(data, self.model.files, "path")
        self.apply(
            f"delete_file({path!r}, force={force})",
            lambda m: m.delete_file(path, force=force),
            functools.partial(self.fs.delete_file, self.p(path), force=force),
        )

    @rule(data=st.data(), recursive=st.booleans())
    def mkdir(self, data: st.DataObject, recursive: bool) -> None:
        path = self.any_path(data, "path")
        self.apply(
            f"mkdir({path!r}, recursive={recursive})",
            lambda m: m.mkdir(path, recursive=recursive),
            functools.partial(self.fs.mkdir, self.p(path), recursive=recursive),
        )

    @rule(data=st.data(), recursive=st.booleans(), force=st.booleans())
    def rmdir(self, data: st.DataObject, recursive: bool, force: bool) -> None:
        path = self.draw_path(data, self.model.dirs, "path")
        if not self.harness.prefix and data.draw(st.integers(0, 19), label="root?") == 0:
            path = ""
        self.apply(
            f"rmdir({path!r}, recursive={recursive}, force={force})",
            lambda m: m.rmdir(path, recursive=recursive, force=force),
            functools.partial(self.fs.rmdir, self.p(path), recursive=recursive, force=force),
        )

    @rule(data=st.data())
    def readdir(self, data: st.DataObject) -> None:
        path = self.draw_path(data, self.model.dirs, "path")
        if data.draw(st.integers(0, 3), label="root?") == 0:
            path = ""
        expected, actual = self.apply(
            f"readdir({path!r})",
            lambda m: m.readdir(path),
            functools.partial(self.fs.readdir, self.p(path)),
        )
        if expected is None:
            return
        entries: list[FileEntry] = actual
        names = [e.name for e in entries]
        assert names == sorted(names), f"readdir({path!r}) is not sorted by name: {names}"
        got = {e.name: e.type for e in entries}
        assert len(got) == len(entries), f"readdir({path!r}) lists a name twice: {names}"
        assert got == expected, (
            f"readdir({path!r}): expected {sorted(expected.items())}, got {sorted(got.items())}"
        )

    @rule(data=st.data())
    def stat(self, data: st.DataObject) -> None:
        path = self.any_path(data, "path")
        if data.draw(st.integers(0, 9), label="root?") == 0:
            path = ""
        expected, actual = self.apply(
            f"stat({path!r})",
            lambda m: m.stat(path),
            functools.partial(self.fs.stat, self.p(path)),
        )
        if expected is not None:
            kind, size = expected
            assert actual.type == kind, f"stat({path!r}).type: expected {kind}, got {actual.type}"
            if size is not None:
                assert actual.size == size, (
                    f"stat({path!r}).size: expected {size}, got {actual.size}"
                )
        found = self.run(functools.partial(self.fs.exists, self.p(path)))
        wanted = self.model.exists(path)
        assert found == wanted, f"exists({path!r}): expected {wanted}, got {found}"

    @rule(data=st.data(), overwrite=st.booleans())
    def copy_file(self, data: st.DataObject, overwrite: bool) -> None:
        src = self.draw_path(data, self.model.files, "src")
        dest = self.draw_path(data, self.model.files, "dest")
        self.apply(
            f"copy_file({src!r}, {dest!r}, overwrite={overwrite})",
            lambda m: m.copy_file(src, dest, overwrite=overwrite),
            functools.partial(self.fs.copy_file, self.p(src), self.p(dest), overwrite=overwrite),
        )

    @rule(data=st.data(), overwrite=st.booleans())
    def move_file(self, data: st.DataObject, overwrite: bool) -> None:
        src = self.draw_path(data, self.model.files, "src")
        if src in self.model.dirs:
            return  # files only: moving trees is outside this machine
        dest = self.draw_path(data, self.model.files, "dest")
        self.apply(
            f"move_file({src!r}, {dest!r}, overwrite={overwrite})",
            lambda m: m.move_file(src, dest, overwrite=overwrite),
            functools.partial(self.fs.move_file, self.p(src), self.p(dest), overwrite=overwrite),
        )

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def tree_matches_model(self) -> None:
        entries = self.run(functools.partial(self.fs.readdir, self.p(""), recursive=True))
        got: dict[str, tuple[str, int | None]] = {}
        seen: set[str] = set()
        for e in entries:
            assert e.name not in got, f"the recursive listing names {e.name!r} twice"
            parent = _parent(e.name)
            assert not parent or parent in seen, f"{e.name!r} is listed before its directory"
            seen.add(e.name)
            got[e.name] = (e.type, e.size if e.type == "file" else None)
        expected = self.model.tree()
        if got != expected:
            missing = sorted(set(expected) - set(got))
            extra = sorted(set(got) - set(expected))
            wrong = sorted(
                f"{k}: expected {expected[k]}, got {got[k]}"
                for k in set(got) & set(expected)
                if got[k] != expected[k]
            )
            raise AssertionError(
                f"tree differs from the model: missing {missing}, unexpected {extra}, wrong {wrong}"
            )
        self.steps += 1
        if self.steps % self.deep_check_every == 0:
            self.check_contents()

    def check_contents(self) -> None:
        """Every file's bytes through the filesystem and the oracle; directories via the oracle."""
        for path, data in sorted(self.model.files.items()):
            got = self.run(functools.partial(self.fs.read_file, self.p(path)))
            assert got == data, f"read_file({path!r}): expected {data!r}, got {got!r}"
            stored = self.harness.get(path)
            assert stored == data, f"storage holds {stored!r} at {path!r}, expected {data!r}"
        for path in sorted(self.model.dirs):
            if path:
                assert self.harness.isdir(path), f"storage has no directory at {path!r}"

    def teardown(self) -> None:
        try:
            self.run(self.fs.destroy)
        finally:
            cleanup = self.harness.extra.get("cleanup")
            if callable(cleanup):
                cleanup()


def make_state_machine(
    make_harness: Callable[[], Harness], *, deep_check_every: int = 1, name: str | None = None
) -> type[FilesystemStateMachine]:
    """Return a state machine class that tests the filesystems ``make_harness`` builds.

    Parameters
    ----------
    make_harness : callable
        Returns a fresh :class:`Harness` over empty storage; called once per example.
    deep_check_every : int
        Compare every file's content (through ``fs`` and the oracle) every this many steps;
        the tree listing is compared after every step.
    name : str, optional
        Class name, shown in Hypothesis reports.
    """
    if deep_check_every < 1:
        raise ValueError("deep_check_every must be at least 1")
    attrs: dict[str, Any] = {
        "make_harness": staticmethod(make_harness),
        "deep_check_every": deep_check_every,
    }
    return type(name or "FilesystemMachine", (FilesystemStateMachine,), attrs)
