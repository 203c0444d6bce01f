"""Suite ``agent``: what a coding agent does to a repository, through each layer.

A generated repository (``size.repo_files`` files of Python, Markdown and JSON, a few KiB
each, the same bytes every run) is written once per backend through its fsspec API, under
``agent-repo/`` of the backend root, where every layer sees it. Each round then runs, on
every layer in turn, the steps of an agent's session:

``list``
    the whole tree (``find . -type f``; ``list_files`` without a mount);
``grep``
    a known token in every file (``grep -rn``; the ``grep`` tool), match count checked;
``read_ranges``
    a line range of 50 files (``sed -n 'A,Bp'``; ``read_file`` with offset and limit);
``edit``
    10 edits: read a file, bump its ``REVISION = N`` line, write it back (``cat`` then
    ``sed -i``; ``read_file`` then ``edit_file``), content checked afterwards;
``command``
    ``wc -l`` over every ``.py`` file (shell layers only: an API has no shell);
``total``
    the sum of list, grep, read_ranges and edit, which every layer runs.

The ``local disk`` layer gets a copy of its own in its directory. On a directory (a mount,
local disk) the steps are shell commands run as subprocesses in the
tree, what an agent in a sandbox runs; on the ``direct`` layer they are the agentvfs
workspace tools over an `FsspecFilesystem` of the backend, what an agent without a mount
calls. Results are checked after the clock stops; a mismatch is an error of that step.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._backends import Backend
from ._context import Context, Timeout
from ._layers import LayerSpec, MountFailed
from ._model import DIRECT, Measurement
from ._targets import Target

__all__ = ["NEEDLE", "REPO_DIR", "STEPS", "Repo", "build_repo", "run"]

SUITE = "agent"
#: Directory of the generated repository below the backend root (and a local-disk copy's).
REPO_DIR = "agent-repo"
#: The token `grep` looks for; nothing else in the tree contains it.
NEEDLE = "AGENTVFS_NEEDLE_7F3A"
SEED = 20240611
READ_FILES = 50
READ_LINES = 30
EDITS = 10
STEPS = ("list", "grep", "read_ranges", "edit", "command", "total")
#: Steps summed into ``total``: those every layer runs (``command`` has no API form).
TOTAL_OF = ("list", "grep", "read_ranges", "edit")
NO_SHELL = "no shell over the API"
#: Output limit given to the tools, so their summaries (which we check) are never cut.
TOOL_OUTPUT_TOKENS = 10**8

_REVISION = re.compile(r"^REVISION = (\d+)$", re.MULTILINE)
_LIST_SUMMARY = re.compile(r"(\d+) director(?:y|ies), (\d+) files?")
_GREP_SUMMARY = re.compile(r"^(\d+) match(?:es)? across (\d+) files?")
_ERRORS = (OSError, RuntimeError, ValueError, TimeoutError, Timeout)


# -- the repository ---------------------------------------------------------------------------

_VOCABULARY = (
    "account alpha batch buffer cache client config cursor delta event filter frame graph "
    "handler index item journal key layer ledger mapper merge node offset order packet parser "
    "queue reader record region report request result router sample schema session shard "
    "signal snapshot source stream table task token tracker update user value vector window "
    "worker writer"
)
_WORDS = tuple(_VOCABULARY.split())


@dataclass(frozen=True)
class ReadRange:
    path: str
    offset: int  # 1-based first line
    limit: int
    expect: str  # the lines, joined by "\n"


@dataclass
class Repo:
    """The generated tree and every answer the steps are checked against."""

    files: dict[str, bytes]
    dirs: int
    needle_lines: int
    needle_files: int
    py_lines: int
    reads: list[ReadRange] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.files.values())


def _ident(rng: random.Random, parts: int = 2) -> str:
    return "_".join(rng.choice(_WORDS) for _ in range(parts))


def _python(rng: random.Random, i: int, needles: int) -> str:
    lines = [f'"""{_ident(rng, 3).replace("_", " ").capitalize()} for the {rng.choice(_WORDS)} service."""', "",
             "from __future__ import annotations", "", "import logging", "from dataclasses import dataclass", "",
             "REVISION = 0", f"logger = logging.getLogger({_ident(rng)!r})", ""]  # fmt: skip
    funcs = rng.randint(5, 9)
    slots = sorted(rng.sample(range(funcs), needles)) if needles else []
    for f in range(funcs):
        name = _ident(rng)
        if f % 3 == 0:
            lines += ["", "@dataclass", f"class {name.title().replace('_', '')}{i}:",
                      f'    """A {rng.choice(_WORDS)} of {rng.choice(_WORDS)}s."""', ""]  # fmt: skip
            lines += [f"    {_ident(rng)}: int = {rng.randint(0, 999)}" for _ in range(rng.randint(2, 5))]
        lines += ["", "", f"def {name}_{f}({rng.choice(_WORDS)}: int, {rng.choice(_WORDS)}s: list[int]) -> int:",
                  f'    """Return the {rng.choice(_WORDS)} after {rng.randint(1, 99)} {rng.choice(_WORDS)}s."""',
                  "    total = 0"]  # fmt: skip
        if f in slots:
            lines.append(f"    # {NEEDLE}: revisit once the {rng.choice(_WORDS)} API settles")
        for _ in range(rng.randint(3, 8)):
            lines.append(f"    total += {rng.choice(_WORDS)}s[{rng.randint(0, 9)}] * {rng.randint(1, 97)}"
                         f"  # {rng.choice(_WORDS)} {rng.choice(_WORDS)}")
        lines += [f"    logger.debug('{_ident(rng)} %s', total)", "    return total"]
    return "\n".join(lines) + "\n"


def _markdown(rng: random.Random, i: int, needles: int) -> str:
    lines = [f"# {_ident(rng, 2).replace('_', ' ').title()} ({i})", ""]
    sections = rng.randint(4, 7)
    slots = set(rng.sample(range(sections), needles)) if needles else set()
    for s in range(sections):
        lines += [f"## {rng.choice(_WORDS).title()} {rng.choice(_WORDS)}", ""]
        for _ in range(rng.randint(3, 5)):
            lines.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(10, 16))) + ".")
        if s in slots:
            lines.append(f"See {NEEDLE} in the design notes.")
        lines += ["", "```python", f"{_ident(rng)} = load({rng.choice(_WORDS)!r})", "```", ""]
    return "\n".join(lines) + "\n"


def _json(rng: random.Random, i: int, needles: int) -> str:
    records: list[dict[str, Any]] = []
    for r in range(rng.randint(8, 14)):
        rec: dict[str, Any] = {"id": i * 100 + r, "name": _ident(rng), "tags": rng.sample(_WORDS, 3),
                               "weight": round(rng.random() * 100, 3), "enabled": rng.random() < 0.5}  # fmt: skip
        if r < needles:
            rec["comment"] = f"{NEEDLE} marks this record"
        records.append(rec)
    return json.dumps({"version": 1, "records": records}, indent=2) + "\n"


def build_repo(files: int, seed: int = SEED) -> Repo:
    """The repository of ``files`` files: ``src/`` packages (70 %), ``docs/`` (20 %), ``data/``.

    Every seventh file holds the needle, every 21st twice (on separate lines), so the count
    of matching lines differs from the count of matching files.
    """
    rng = random.Random(seed)
    out: dict[str, bytes] = {}
    needle_lines = needle_files = 0
    for i in range(files):
        needles = (2 if i % 21 == 3 else 1) if i % 7 == 3 else 0
        kind = i % 10
        if kind < 7:
            path = f"src/proj/pkg{i % 12:02d}/sub{(i // 12) % 6}/module_{i:05d}.py"
            text = _python(rng, i, needles)
        elif kind < 9:
            path = f"docs/section{i % 5}/page_{i:05d}.md"
            text = _markdown(rng, i, needles)
        else:
            path = f"data/set{i % 4}/record_{i:05d}.json"
            text = _json(rng, i, needles)
        out[path] = text.encode()
        needle_lines += needles
        needle_files += needles > 0
    dirs: set[str] = set()
    for path in out:
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[: k + 1]) for k in range(len(parts)))
    py_lines = sum(b.count(b"\n") for p, b in out.items() if p.endswith(".py"))
    repo = Repo(out, len(dirs), needle_lines, needle_files, py_lines)
    names = sorted(out)
    py = [p for p in names if p.endswith(".py")]
    repo.edits = py[:: max(1, len(py) // EDITS)][:EDITS]
    others = [p for p in names if p not in set(repo.edits)]
    for path in others[:: max(1, len(others) // READ_FILES)][:READ_FILES]:
        lines = out[path].decode().split("\n")
        limit = min(READ_LINES, len(lines) - 1)
        offset = rng.randint(1, len(lines) - limit)
        repo.reads.append(ReadRange(path, offset, limit, "\n".join(lines[offset - 1 : offset - 1 + limit])))
    return repo


# -- checks (pure, so they are tested on their own) -------------------------------------------


def check_find(stdout: str, repo: Repo) -> None:
    """``find . -type f`` listed exactly the repository's files."""
    got = {line[2:] if line.startswith("./") else line for line in stdout.splitlines() if line}
    if got != set(repo.files):
        missing, extra = sorted(set(repo.files) - got), sorted(got - set(repo.files))
        raise OSError(f"find listed {len(got)} files, expected {len(repo.files)} ({len(missing)} missing, "
                      f"{len(extra)} unexpected, such as {(missing + extra)[:3]})")  # fmt: skip


def check_list_files(output: str, repo: Repo) -> None:
    """``list_files`` ended with ``D directories, F files`` of the repository."""
    found = _LIST_SUMMARY.search(output.rsplit("\n", 1)[-1])
    if found is None:
        raise OSError(f"list_files gave no summary line: {output[-200:]!r}")
    dirs, files = int(found.group(1)), int(found.group(2))
    if (dirs, files) != (repo.dirs, len(repo.files)):
        raise OSError(f"list_files counted {dirs} directories and {files} files, expected {repo.dirs} and {len(repo.files)}")


def check_grep_rn(stdout: str, repo: Repo) -> None:
    """``grep -rn`` printed one ``path:line:text`` per matching line."""
    lines = [line for line in stdout.splitlines() if line]
    files = {line.split(":", 1)[0] for line in lines}
    check_matches(len(lines), len(files), repo)


def check_grep_tool(output: str, repo: Repo) -> None:
    """The ``grep`` tool's summary: ``N matches across M files``."""
    found = _GREP_SUMMARY.match(output)
    if found is None:
        raise OSError(f"grep tool gave no summary: {output[:200]!r}")
    check_matches(int(found.group(1)), int(found.group(2)), repo)


def check_matches(lines: int, files: int, repo: Repo) -> None:
    if (lines, files) != (repo.needle_lines, repo.needle_files):
        raise OSError(f"grep {NEEDLE} found {lines} lines in {files} files, "
                      f"expected {repo.needle_lines} lines in {repo.needle_files} files")  # fmt: skip


def check_range(got: str, want: ReadRange) -> None:
    if got.rstrip("\n") != want.expect.rstrip("\n"):
        raise OSError(f"lines {want.offset}-{want.offset + want.limit - 1} of {want.path} differ from what was written")


def bump(text: str, path: str) -> tuple[str, str, str]:
    """The edit an agent makes after reading ``text``: ``(old line, new line, new text)``."""
    found = _REVISION.search(text)
    if found is None:
        raise OSError(f"{path} has no REVISION line to edit")
    n = int(found.group(1))
    old, new = f"REVISION = {n}\n", f"REVISION = {n + 1}\n"
    return old, new, text.replace(old, new, 1)


def check_edit(got: str, want: str, path: str) -> None:
    if got != want:
        raise OSError(f"{path} after the edit is not the text read with its REVISION line bumped")


# -- shell steps on a directory ---------------------------------------------------------------

_ENV = {**os.environ, "LC_ALL": "C"}


def _sh(argv: list[str], cwd: str, timeout: float, ok: tuple[int, ...] = (0,)) -> str:
    """Run ``argv`` in ``cwd`` in a session of its own; stdout, or OSError / Timeout."""
    proc = subprocess.Popen(argv, cwd=cwd, env=_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        raise Timeout(f"{' '.join(argv)[:80]} still running after {timeout:.0f} s") from exc
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode not in ok:
        msg = " | ".join(err.decode(errors="replace").strip().splitlines())[:300]
        raise OSError(f"{' '.join(argv)[:80]} exited {proc.returncode}: {msg}")
    return out.decode(errors="replace")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.communicate(timeout=10)


class ShellAgent:
    """The steps as shell commands in ``<target.path>/agent-repo``, each under the watchdog."""

    def __init__(self, target: Target, repo: Repo, limit: float) -> None:
        assert target.path is not None
        self.target, self.repo, self.limit = target, repo, limit
        self.cwd = os.path.join(target.path, REPO_DIR)

    def write_copy(self) -> None:
        """A copy of the tree for a local-disk layer (untimed)."""
        for rel, data in self.repo.files.items():
            path = os.path.join(self.cwd, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)

    def sh(self, argv: list[str], ok: tuple[int, ...] = (0,)) -> str:
        return _sh(argv, self.cwd, self.limit, ok)

    def _guard(self, what: str) -> contextlib.AbstractContextManager[None]:
        return self.target.guard(self.limit, what)

    def list(self) -> float:
        with self._guard("find"):
            t0 = time.perf_counter()
            out = self.sh(["find", ".", "-type", "f"])
            dt = time.perf_counter() - t0
        check_find(out, self.repo)
        return dt

    def grep(self) -> float:
        with self._guard("grep -rn"):
            t0 = time.perf_counter()
            out = self.sh(["grep", "-rn", NEEDLE, "."], ok=(0, 1))
            dt = time.perf_counter() - t0
        check_grep_rn(out, self.repo)
        return dt

    def read_ranges(self) -> float:
        got: list[str] = []
        with self._guard("sed -n"):
            t0 = time.perf_counter()
            for r in self.repo.reads:
                got.append(self.sh(["sed", "-n", f"{r.offset},{r.offset + r.limit - 1}p", r.path]))
            dt = time.perf_counter() - t0
        for text, want in zip(got, self.repo.reads, strict=True):
            check_range(text, want)
        return dt

    def edit(self) -> float:
        wants: list[tuple[str, str]] = []
        with self._guard("cat and sed -i"):
            t0 = time.perf_counter()
            try:
                for rel in self.repo.edits:
                    text = self.sh(["cat", rel])
                    old, new, after = bump(text, rel)
                    self.sh(["sed", "-i", f"s/^{old.strip()}$/{new.strip()}/", rel])
                    wants.append((rel, after))
            except OSError:
                self._tidy()
                raise
            dt = time.perf_counter() - t0
            for rel, after in wants:
                with open(os.path.join(self.cwd, rel), encoding="utf-8") as f:
                    check_edit(f.read(), after, rel)
        return dt

    def _tidy(self) -> None:
        """Remove what a failed ``sed -i`` left (its temporary file, when the layer cannot
        rename it into place), so later steps and layers see the tree they expect."""
        for d in {os.path.dirname(rel) for rel in self.repo.edits}:
            with contextlib.suppress(OSError):
                for name in os.listdir(os.path.join(self.cwd, d)):
                    if name.startswith("sed") and f"{d}/{name}" not in self.repo.files:
                        with contextlib.suppress(OSError):
                            os.unlink(os.path.join(self.cwd, d, name))

    def command(self) -> float:
        with self._guard("wc -l"):
            t0 = time.perf_counter()
            out = self.sh(["sh", "-c", "find . -name '*.py' -exec cat {} + | wc -l"])
            dt = time.perf_counter() - t0
        if out.strip() != str(self.repo.py_lines):
            raise OSError(f"wc -l over the .py files counted {out.strip()!r} lines, expected {self.repo.py_lines}")
        return dt


# -- workspace tools over the fsspec API ------------------------------------------------------


class ToolAgent:
    """The steps as calls of the agentvfs workspace tools, on an event loop of their own."""

    def __init__(self, backend: Backend, repo: Repo) -> None:
        self.backend, self.repo = backend, repo
        self.root = f"{backend.root.rstrip('/')}/{REPO_DIR}"
        self._stack = contextlib.ExitStack()
        self.tools: dict[str, Any] = {}
        self.portal: Any = None

    def __enter__(self) -> ToolAgent:
        from anyio.from_thread import start_blocking_portal

        from .. import WORKSPACE_TOOLS

        self.names = WORKSPACE_TOOLS.FILESYSTEM
        self.portal = self._stack.enter_context(start_blocking_portal())
        try:
            self.tools = self.portal.call(self._create_tools)
        except BaseException:
            self._stack.close()
            raise
        return self

    async def _create_tools(self) -> dict[str, Any]:
        from .. import WORKSPACE_TOOLS, FsspecFilesystem, Workspace

        fs_names = WORKSPACE_TOOLS.FILESYSTEM
        # A fresh filesystem instance every round: no listing or instance cache carried over.
        ws = Workspace(filesystem=FsspecFilesystem(self.backend.filesystem(), root=self.root),
                       tools={fs_names.GREP: {"max_output_tokens": TOOL_OUTPUT_TOKENS},
                              fs_names.LIST_FILES: {"max_output_tokens": TOOL_OUTPUT_TOKENS},
                              fs_names.READ_FILE: {"max_output_tokens": TOOL_OUTPUT_TOKENS}})  # fmt: skip
        return await ws.create_tools()

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def call(self, name: str, **args: Any) -> str:
        try:
            return str(self.portal.call(self.tools[name].execute, args))
        except _ERRORS:
            raise
        except Exception as exc:  # a tool's own error types: an error of the step
            raise RuntimeError(f"{name}: {type(exc).__name__}: {exc}") from exc

    def list(self) -> float:
        t0 = time.perf_counter()
        out = self.call(self.names.LIST_FILES, path=".", maxDepth=64)
        dt = time.perf_counter() - t0
        check_list_files(out, self.repo)
        return dt

    def grep(self) -> float:
        t0 = time.perf_counter()
        out = self.call(self.names.GREP, pattern=NEEDLE, path=".")
        dt = time.perf_counter() - t0
        check_grep_tool(out, self.repo)
        return dt

    def read_ranges(self) -> float:
        got: list[str] = []
        t0 = time.perf_counter()
        for r in self.repo.reads:
            got.append(self.call(self.names.READ_FILE, path=r.path, offset=r.offset, limit=r.limit,
                                 showLineNumbers=False))  # fmt: skip
        dt = time.perf_counter() - t0
        for text, want in zip(got, self.repo.reads, strict=True):
            check_range(text.split("\n", 1)[1] if "\n" in text else "", want)
        return dt

    def edit(self) -> float:
        wants: list[tuple[str, str]] = []
        t0 = time.perf_counter()
        for rel in self.repo.edits:
            shown = self.call(self.names.READ_FILE, path=rel, showLineNumbers=False)
            text = shown.split("\n", 1)[1] if "\n" in shown else ""
            old, new, after = bump(text, rel)
            said = self.call(self.names.EDIT_FILE, path=rel, old_string=old, new_string=new)
            if not said.startswith("Replaced 1 occurrence"):
                raise OSError(f"edit_file {rel}: {said[:200]}")
            wants.append((rel, after))
        dt = time.perf_counter() - t0
        fs = self.backend.filesystem()
        for rel, after in wants:
            check_edit(fs.cat_file(f"{self.root}/{rel}").decode(), after, rel)
        return dt

    def command(self) -> float:  # pragma: no cover - never called: the step is skipped
        raise RuntimeError(NO_SHELL)


# -- the suite --------------------------------------------------------------------------------

_LABELS = {
    "list": "list the tree ({n:,} files)",
    "grep": "grep a token in {n:,} files",
    "read_ranges": "read " + str(READ_LINES) + " lines of {reads} files",
    "edit": "{edits} edits (read, replace, write back)",
    "command": "wc -l over every .py file",
    "total": "agent session (list + grep + read + edit)",
}


def _measurements(ctx: Context, backend: Backend, layer: str, repo: Repo) -> dict[str, Measurement]:
    n = len(repo.files)
    out = {step: ctx.measurement(SUITE, step, backend.name, layer,
                                 _LABELS[step].format(n=n, reads=len(repo.reads), edits=len(repo.edits)), "s",
                                 files=n)
           for step in STEPS}  # fmt: skip
    if layer == DIRECT:
        out["command"].skipped = NO_SHELL
    return out


def write_tree(fs: Any, root: str, repo: Repo, *, markers: bool = False) -> None:
    """The repository under ``root`` through the fsspec API (replacing an older one).

    With ``markers`` every directory also gets a zero-byte ``dir/`` object, as agentvfs's
    ``mkdir`` writes: s3rver lists a prefix as a directory only when an object sits directly
    below it, so without them no mount would see ``agent-repo`` there. Real S3, moto and GCS
    list every prefix and get no markers (fsspec.fuse shows a marker as a broken entry).
    """
    with contextlib.suppress(FileNotFoundError):
        if fs.exists(root):
            fs.rm(root, recursive=True)
    dirs = sorted({"/".join(p.split("/")[:k]) for p in repo.files for k in range(1, p.count("/") + 1)})
    for d in dirs:
        fs.makedirs(f"{root}/{d}", exist_ok=True)
    if markers:
        fs.pipe({f"{root}/": b"", **{f"{root}/{d}/": b"" for d in dirs}})
    fs.pipe({f"{root}/{p}": data for p, data in repo.files.items()})


def tidy_backend(backend: Backend, repo: Repo) -> list[str]:
    """Remove, through the API, files that are not the repository's from the directories of
    the edited files; returns their names.

    A failed ``sed -i`` leaves its temporary file there, and a mount that uploads after a
    rename may leave one behind too; left in place it would fail the next layer's checks.
    """
    fs = backend.filesystem()
    root = f"{backend.root.rstrip('/')}/{REPO_DIR}"
    known = {f"{root}/{p}".lstrip("/") for p in repo.files}
    removed: list[str] = []
    for d in sorted({os.path.dirname(rel) for rel in repo.edits}):
        with contextlib.suppress(Exception):
            here = f"{root}/{d}".strip("/")
            for entry in fs.ls(f"{root}/{d}", detail=True):
                name = str(entry["name"])
                if name.endswith("/") or name.strip("/") == here:
                    continue  # the directory's own marker object
                if entry.get("type") == "file" and name.lstrip("/") not in known:
                    with contextlib.suppress(Exception):
                        fs.rm_file(name)
                        removed.append(f"{d}/{name.rsplit('/', 1)[-1]}")
    return removed


def _fail_all(ctx: Context, ms: dict[str, Measurement], msg: str, timed: bool) -> None:
    ctx.progress.log(f"  error: {msg}")
    if not timed:
        return
    for m in ms.values():
        if m.skipped is None:
            m.errors.append(msg)


def _as_step_error(fn: Callable[[], float]) -> Callable[[], float]:
    """``fn`` with any exception but the ones `Context.record` keeps turned into RuntimeError,
    so an odd failure of one layer is recorded on its step instead of ending the suite."""

    def call() -> float:
        try:
            return fn()
        except _ERRORS:
            raise
        except Exception as exc:
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc

    return call


def _run_steps(ctx: Context, agent: ShellAgent | ToolAgent, ms: dict[str, Measurement], timed: bool) -> None:
    took: dict[str, float] = {}
    for step in STEPS[:-1]:
        m = ms[step]
        if m.skipped is not None:
            continue
        fn = _as_step_error(getattr(agent, step))
        if timed:
            if ctx.record(m, fn):
                took[step] = m.samples[-1]
            continue
        try:
            fn()
        except _ERRORS as exc:
            ctx.progress.log(f"  warm-up error: {m.backend} / {m.layer} / {step}: {type(exc).__name__}: {exc}")
    if not timed:
        return
    if all(s in took for s in TOTAL_OF):
        ms["total"].samples.append(sum(took[s] for s in TOTAL_OF))
    else:
        failed = ", ".join(s for s in TOTAL_OF if s not in took)
        note = f"rounds where {failed} failed have no total"
        if note not in ms["total"].notes:
            ms["total"].notes.append(note)


def _run_layer(ctx: Context, backend: Backend, spec: LayerSpec, repo: Repo, timed: bool, limit: float,
               copies: set[str]) -> None:
    ms = _measurements(ctx, backend, spec.name, repo)
    if (backend.name, spec.name) in ctx.harness.broken:
        _fail_all(ctx, ms, f"{spec.name} on {backend.name} did not mount earlier in the run", timed)
        return
    try:
        with spec.open(ctx.harness) as target:
            if target.path is None:
                with ToolAgent(backend, repo) as tool_agent:
                    _run_steps(ctx, tool_agent, ms, timed)
                return
            agent = ShellAgent(target, repo, limit)
            if not spec.mounted and not (agent.cwd in copies and os.path.isdir(agent.cwd)):
                # Local disk: a copy of its own, once (the layer may keep its directory
                # between openings; edits made there then carry over as they do on a mount).
                copies.add(agent.cwd)
                agent.write_copy()
            _run_steps(ctx, agent, ms, timed)
    except MountFailed as exc:
        _fail_all(ctx, ms, f"MountFailed: {exc}", timed)
    except Exception as exc:  # whatever opening or closing the layer raised: this layer's round only
        _fail_all(ctx, ms, f"{backend.name} / {spec.name}: {type(exc).__name__}: {exc}", timed)
    if spec.mounted or spec.name == DIRECT:
        # After the unmount, when a mount has written everything it was going to write.
        stray = tidy_backend(backend, repo)
        if stray:
            msg = f"{spec.name} left {len(stray)} unexpected file(s) beside the edited ones, such as {stray[0]} (removed)"
            ctx.run.problem(f"agent suite on {backend.name}: {msg}")
            if msg not in ms["edit"].notes:
                ms["edit"].notes.append(msg)


def run(ctx: Context) -> None:
    """Run the agent suite on every backend and layer of ``ctx``."""
    repo = build_repo(ctx.size.repo_files)
    limit = max(120.0, 2 * ctx.budget)
    rounds = ctx.warmup + ctx.repeat
    for backend in ctx.backends:
        specs = ctx.layers.get(backend.name, [])
        if not specs:
            continue
        ctx.progress.start(f"agent · {backend.name} · {len(repo.files):,} files", rounds * len(specs))
        fs = backend.filesystem()
        root = f"{backend.root.rstrip('/')}/{REPO_DIR}"
        copies: set[str] = set()
        try:
            try:
                write_tree(fs, root, repo, markers=backend.protocol == "s3" and "s3rver" in backend.server)
            except Exception as exc:
                msg = f"writing the repository to {backend.name} failed: {type(exc).__name__}: {exc}"
                for spec in specs:
                    _fail_all(ctx, _measurements(ctx, backend, spec.name, repo), msg, True)
                continue
            for r in range(rounds):
                timed = r >= ctx.warmup
                for spec in specs:
                    _run_layer(ctx, backend, spec, repo, timed, limit, copies)
                    ctx.progress.advance(f"{'round ' + str(r - ctx.warmup + 1) if timed else 'warm-up'}: {spec.name}")
        finally:
            with contextlib.suppress(Exception):
                fs.rm(root, recursive=True)
            for copy in copies:
                shutil.rmtree(copy, ignore_errors=True)

