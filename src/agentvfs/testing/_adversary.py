"""The adversarial suite: an agent that attacks its own workspace, with only its tools.

Every attack is an async function that gets an :class:`Arena` (a workspace on a local
directory with a sandbox, next to a host directory it must never reach and a secret it must
never see), tries its escape many times and records each try as held or not. The suite runs
as root and as an unprivileged user; the totals are what ``benchmarks/bench_adversary.py``
reports.

Attacks register themselves with :func:`attack`; :func:`load_attacks` imports the modules
that hold them. ``tests/test_adversary.py`` runs each as a test that fails on the first try
that was not held.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import secrets
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread

if TYPE_CHECKING:
    from ..tools import WorkspaceTool
    from ..workspace import Workspace

__all__ = [
    "ATTACKS",
    "Arena",
    "Attack",
    "AttackReport",
    "attack",
    "load_attacks",
    "requirement_missing",
    "run_attack",
]

Severity = Literal["critical", "high", "medium", "low"]
Requirement = Literal["bwrap", "root", "fuse", "unprivileged", "moto"]

#: Modules holding attacks, imported by :func:`load_attacks`.
_ATTACK_MODULES = (
    "agentvfs.testing._attacks_sandbox",
    "agentvfs.testing._attacks_paths",
    "agentvfs.testing._attacks_tools",
    "agentvfs.testing._attacks_inputs",
    "agentvfs.testing._attacks_snapshots",
)

#: Multiplies every attack's iteration count (``AGENTVFS_ATTACK_SCALE``): 1 in the test suite,
#: more for the benchmark's totals.
SCALE_VARIABLE = "AGENTVFS_ATTACK_SCALE"

#: The name of the host environment variable that holds the arena's secret.
SECRET_VARIABLE = "AGENTVFS_ARENA_SECRET"


@dataclass(frozen=True, slots=True)
class Attack:
    """One registered attack.

    Attributes
    ----------
    name : str
        Unique identifier (``snake_case``), also the test id.
    finding : str
        What the attack tries, in one line.
    severity : str
        ``critical``, ``high``, ``medium`` or ``low``: what a success would cost.
    requires : tuple of str
        What must be there for it to run: ``bwrap`` (working bubblewrap), ``root``,
        ``unprivileged`` (not root), ``fuse`` (``/dev/fuse``), ``moto`` (an S3 emulator: the
        test extra).
    run : callable
        ``await run(arena)``; it records its tries on the arena.
    """

    name: str
    finding: str
    severity: Severity
    requires: tuple[Requirement, ...]
    run: Callable[[Arena], Awaitable[None]]


#: Every registered attack by name (see :func:`load_attacks`).
ATTACKS: dict[str, Attack] = {}


def attack(
    name: str,
    *,
    finding: str,
    severity: Severity,
    requires: Sequence[Requirement] = (),
) -> Callable[[Callable[[Arena], Awaitable[None]]], Callable[[Arena], Awaitable[None]]]:
    """Register the decorated ``async def f(arena)`` as an attack.

    Raises
    ------
    ValueError
        ``name`` is already registered.
    """

    def register(fn: Callable[[Arena], Awaitable[None]]) -> Callable[[Arena], Awaitable[None]]:
        if name in ATTACKS:
            raise ValueError(f"attack {name!r} is registered twice")
        ATTACKS[name] = Attack(name, finding, severity, tuple(requires), fn)
        return fn

    return register


def load_attacks() -> dict[str, Attack]:
    """Import every module that holds attacks and return the registry."""
    for module in _ATTACK_MODULES:
        importlib.import_module(module)
    return ATTACKS


def requirement_missing(requires: Sequence[Requirement]) -> str | None:
    """Why an attack with ``requires`` cannot run here, or None when it can."""
    from ..sandbox import detect_isolation

    for need in requires:
        if need == "root" and os.geteuid() != 0:
            return "needs root"
        if need == "unprivileged" and os.geteuid() == 0:
            return "needs an unprivileged user"
        if need == "fuse" and not os.path.exists("/dev/fuse"):
            return "needs /dev/fuse"
        if need == "moto" and importlib.util.find_spec("moto") is None:
            return "needs moto (install agentvfs[test])"
        if need == "bwrap":
            info = detect_isolation()
            if not info["available"]:
                return f"needs a working bubblewrap: {info['message']}"
    return None


@dataclass
class AttackReport:
    """What one attack achieved.

    Attributes
    ----------
    attempts : int
        Tries made.
    held : int
        Tries the workspace withstood.
    failures : list of str
        What each try that was not held did (the first 20).
    seconds : float
        Wall-clock time of the attack.
    """

    name: str
    severity: Severity
    attempts: int = 0
    held: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every try was held (and there was at least one)."""
        return self.attempts > 0 and self.held == self.attempts


_TOOL_PREFIX = "mastra_workspace_"


class Arena:
    """A workspace under attack, and what it must protect.

    Layout under a fresh temporary directory ``base``: ``base/ws`` is the workspace root and
    the sandbox's working directory (the agent's); ``base/host`` is a host directory the agent
    must never read or change (``secret.txt`` holds :attr:`secret`, ``tree/`` some files and
    a directory). The host environment carries the secret in ``AGENTVFS_ARENA_SECRET`` for the
    arena's life.

    Attack code uses :meth:`tool` and :meth:`sh` (the agent's only means), :meth:`record` for
    each try, and :meth:`outside_changed` to prove nothing outside the root moved.

    Parameters
    ----------
    base : path
        An empty directory the arena may fill (a pytest ``tmp_path``).
    """

    def __init__(self, base: str | os.PathLike[str], *, report: AttackReport | None = None) -> None:
        self.base = Path(base)
        self.root = self.base / "ws"
        self.host = self.base / "host"
        self.secret = "arena-secret-" + secrets.token_hex(12)
        self.report = report or AttackReport("", "low")
        self.scale = max(1.0, float(os.environ.get(SCALE_VARIABLE, "1") or 1))
        self._workspace: Workspace | None = None
        self._tools: dict[str, WorkspaceTool] = {}
        self._saved_env: str | None = None
        self._snapshot: dict[str, tuple[Any, ...]] = {}
        self._extra_watch: list[Path] = []

    # -- setup -------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create the layout, put the secret in place and take the snapshot of the host side."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.host / "tree" / "sub").mkdir(parents=True, exist_ok=True)
        (self.host / "secret.txt").write_text(self.secret + "\n")
        (self.host / "tree" / "a.txt").write_text("host file a\n")
        (self.host / "tree" / "sub" / "b.txt").write_text("host file b\n")
        # World-readable, as most host files are: only containment keeps the agent out.
        for path in (self.base, self.host, self.host / "tree", self.host / "tree" / "sub"):
            path.chmod(0o755)
        self.root.chmod(0o777)
        self._saved_env = os.environ.get(SECRET_VARIABLE)
        os.environ[SECRET_VARIABLE] = self.secret
        self.snapshot()

    def watch(self, path: str | os.PathLike[str]) -> None:
        """Also check ``path`` (outside ``base``) in :meth:`outside_changed`."""
        self._extra_watch.append(Path(path))
        self.snapshot()

    def snapshot(self) -> None:
        """Record the state of everything outside the root (what :meth:`outside_changed` compares)."""
        self._snapshot = self._state()

    def _watched(self) -> Iterator[Path]:
        yield self.base
        yield from self._extra_watch

    def _state(self) -> dict[str, tuple[Any, ...]]:
        out: dict[str, tuple[Any, ...]] = {}
        for top in self._watched():
            out.update(_tree_state(top, skip=self.root))
        return out

    def outside_changed(self) -> list[str]:
        """What changed outside the root since the last snapshot: ``"+ path"``, ``"- path"``
        or ``"~ path"`` lines (empty when nothing did)."""
        now = self._state()
        before = self._snapshot
        changes = [f"+ {p}" for p in sorted(now.keys() - before.keys())]
        changes += [f"- {p}" for p in sorted(before.keys() - now.keys())]
        changes += [f"~ {p}" for p in sorted(p for p in now.keys() & before.keys() if now[p] != before[p])]
        return changes

    async def open(
        self,
        *,
        isolation: str | None = None,
        native_sandbox: dict[str, Any] | None = None,
        allowed_paths: Sequence[str] = (),
        filesystem: Any = None,
        sandbox: Any = "default",
        **workspace_options: Any,
    ) -> dict[str, WorkspaceTool]:
        """(Re)create the workspace and return its tools; the previous one is destroyed.

        Parameters
        ----------
        isolation : str, optional
            The sandbox's isolation; default ``"bwrap"`` where it works, else ``"none"``.
        native_sandbox : dict, optional
            Passed to :class:`~agentvfs.sandbox.LocalSandbox`.
        allowed_paths : sequence of str
            Passed to :class:`~agentvfs.vfs.LocalFilesystem`.
        filesystem : WorkspaceFilesystem, optional
            Replaces the default ``LocalFilesystem(root)`` (there is none when ``mounts``
            are given).
        sandbox : LocalSandbox or None, optional
            Replaces the default sandbox; None for a workspace without one.
        **workspace_options
            Passed to :class:`~agentvfs.Workspace` (``skills``, ``tools``, ``bm25`` ...).
        """
        from ..sandbox import LocalSandbox, detect_isolation
        from ..vfs import LocalFilesystem
        from ..workspace import Workspace

        await self.close()
        if isolation is None:
            isolation = "bwrap" if detect_isolation()["available"] else "none"
        if filesystem is None and "mounts" not in workspace_options:
            filesystem = LocalFilesystem(str(self.root), allowed_paths=list(allowed_paths))
        if sandbox == "default":
            sandbox = LocalSandbox(
                working_directory=str(self.root), isolation=isolation, native_sandbox=native_sandbox
            )
        self._workspace = Workspace(filesystem=filesystem, sandbox=sandbox, **workspace_options)
        await self._workspace.init()
        self._tools = await self._workspace.create_tools()
        return self._tools

    @property
    def workspace(self) -> Workspace:
        """The current workspace (opened on first use of :meth:`tool`)."""
        if self._workspace is None:
            raise RuntimeError("call `await arena.open()` first")
        return self._workspace

    async def close(self) -> None:
        """Destroy the current workspace, if any."""
        if self._workspace is not None:
            workspace, self._workspace = self._workspace, None
            self._tools = {}
            await workspace.destroy()

    def restore(self) -> None:
        """Put the host environment back as it was."""
        if self._saved_env is None:
            os.environ.pop(SECRET_VARIABLE, None)
        else:
            os.environ[SECRET_VARIABLE] = self._saved_env

    # -- the agent's means -------------------------------------------------------------------

    async def tool(self, name: str, /, **args: Any) -> str:
        """Call a tool as the agent does; short names work (``"read_file"``).

        Returns the tool's text, or ``"<ErrorClass>: <message>"`` when it raised (what an
        agent would be shown). Media results come back as their caption plus the data.
        """
        if self._workspace is None:
            await self.open()
        full = name if name in self._tools else _TOOL_PREFIX + name
        if full not in self._tools and name not in self._tools:
            raise KeyError(f"no tool {name!r}; the workspace has {sorted(self._tools)}")
        try:
            result = await self._tools[full].execute(args)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if isinstance(result, str):
            return result
        text = getattr(result, "text", "")
        data = getattr(result, "data", "")
        return f"{text}\n{data}"

    async def sh(self, command: str, *, timeout_ms: int = 30_000, background: bool = False) -> str:
        """Run a shell command through ``execute_command``, as the agent can."""
        args: dict[str, Any] = {"command": command, "timeout": timeout_ms}
        if background:
            args["background"] = True
        return await self.tool("execute_command", **args)

    @contextlib.asynccontextmanager
    async def exchanging(self, a: Path, b: Path, *, seconds: float = 30.0) -> AsyncIterator[None]:
        """Run, for the body of the ``with``, a racer that exchanges ``a`` and ``b`` (two
        paths under the root) with ``renameat2(RENAME_EXCHANGE)`` as fast as it can, started
        the way the agent can: written with ``write_file`` next to ``a`` and run in the
        background with ``execute_command``.

        Raises
        ------
        RuntimeError
            The racer did not start, or made no exchange (the race did not happen).
        """
        where = a.parent.relative_to(self.root)
        script, stop = a.parent / ".racer.py", a.parent / ".racer-stop"
        for left in (stop, Path(f"{stop}.ready"), Path(f"{stop}.count"), Path(f"{stop}.count.part")):
            left.unlink(missing_ok=True)  # from an earlier race in the same directory
        await self.tool("write_file", path=f"{where}/{script.name}", content=_RACER)
        started = await self.sh(f"{sys.executable} {script} {a} {b} {stop} {seconds + 30:.0f}", background=True)
        if "Started background process" not in started:
            raise RuntimeError(f"the racer did not start: {started}")
        # The body runs only once the racer has made its first exchange: on a loaded machine
        # the interpreter can take longer to start than a short body takes to run.
        ready = Path(f"{stop}.ready")
        for _ in range(400):
            if await anyio.to_thread.run_sync(ready.exists):
                break
            await anyio.sleep(0.05)
        else:
            raise RuntimeError("the racer made no exchange within 20 s: the race would not happen")
        try:
            yield
        finally:
            # The stop file comes from the host's side: no tool call in the way of stopping.
            await anyio.to_thread.run_sync(stop.write_text, "stop")
            count = Path(f"{stop}.count")
            for _ in range(200):
                if await anyio.to_thread.run_sync(count.exists):
                    break
                await anyio.sleep(0.05)
            swaps = await anyio.to_thread.run_sync(_read_count, count)
            if swaps == 0:
                raise RuntimeError("the racer made no exchange: the race did not happen")

    # -- bookkeeping -------------------------------------------------------------------------

    def record(self, held: bool, what: str = "") -> bool:
        """Count one try; ``what`` says what it did when it was not held. Returns ``held``."""
        self.report.attempts += 1
        if held:
            self.report.held += 1
        elif len(self.report.failures) < 20:
            self.report.failures.append(what or "not held")
        return held

    def check_outside(self, what: str) -> bool:
        """Record one try held when nothing outside the root changed (then re-snapshot)."""
        changes = self.outside_changed()
        held = self.record(not changes, f"{what}: {', '.join(changes[:5])}")
        if changes:
            self.snapshot()
        return held

    def check_secret(self, output: str, what: str) -> bool:
        """Record one try held when ``output`` does not contain the secret."""
        return self.record(self.secret not in output, f"{what}: the secret appeared")

    def iterations(self, count: int, *, seconds: float = 20.0) -> Iterator[int]:
        """``range(count * scale)``, cut short after ``seconds * scale`` of wall-clock time."""
        deadline = time.monotonic() + seconds * self.scale
        for index in range(int(count * self.scale)):
            if index and time.monotonic() > deadline:
                return
            yield index


# The racer the agent runs in its sandbox: exchange two paths until told to stop, then say how
# many exchanges it made (no exchange means the race did not happen).
_RACER = r'''
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, stop, seconds = sys.argv[1].encode(), sys.argv[2].encode(), sys.argv[3], float(sys.argv[4])
deadline = time.monotonic() + seconds
swaps = 0
while time.monotonic() < deadline and not os.path.exists(stop):
    for _ in range(200):
        if libc.renameat2(-100, a, -100, b, 2) == 0:  # RENAME_EXCHANGE
            swaps += 1
            if swaps == 1:
                open(stop + ".ready", "w").close()
with open(stop + ".count.part", "w") as out:
    out.write(str(swaps))
os.replace(stop + ".count.part", stop + ".count")  # whole: the host reads it once it is there
'''


def _read_count(path: Path) -> int:
    return int(path.read_text() or 0) if path.exists() else 0


def _tree_state(top: Path, *, skip: Path) -> dict[str, tuple[Any, ...]]:
    """Path -> (type, mode, uid, size, content hash or link target) for everything under ``top``
    except ``skip`` (symlinks are not followed)."""
    out: dict[str, tuple[Any, ...]] = {}
    if not os.path.lexists(top):
        return out
    pending = [top]
    while pending:
        path = pending.pop()
        if path == skip:
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        kind = stat.S_IFMT(info.st_mode)
        detail: Any = None
        if stat.S_ISREG(info.st_mode):
            try:
                with open(path, "rb") as f:
                    detail = hashlib.sha256(f.read(1 << 20)).hexdigest()
            except OSError as exc:
                detail = f"unreadable: {exc.errno}"
        elif stat.S_ISLNK(info.st_mode):
            detail = os.readlink(path)
        out[str(path)] = (kind, stat.S_IMODE(info.st_mode), info.st_uid, info.st_size, detail)
        if stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(OSError):
                pending.extend(path / name for name in os.listdir(path))
    return out


@contextlib.asynccontextmanager
async def arena_for(attack: Attack, base: str | os.PathLike[str] | None = None) -> AsyncIterator[Arena]:
    """An :class:`Arena` in ``base`` (a fresh temporary directory by default), cleaned up after."""
    own = base is None
    directory = Path(tempfile.mkdtemp(prefix="agentvfs-arena-")) if base is None else Path(base)
    arena = Arena(directory, report=AttackReport(attack.name, attack.severity))
    arena.prepare()
    try:
        yield arena
    finally:
        try:
            await arena.close()
        finally:
            arena.restore()
            if own:
                _force_rmtree(directory)


def _force_rmtree(path: Path) -> None:
    def unlock(function: Any, name: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o700)
            function(name)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=unlock)
    else:
        shutil.rmtree(path, onerror=unlock)


async def run_attack(attack: Attack, base: str | os.PathLike[str] | None = None) -> AttackReport:
    """Run one attack in a fresh arena and return its report (attempts 0 when skipped).

    A check after the attack itself counts as one more try: nothing outside the root changed
    and no process the attack started still runs.
    """
    started = time.monotonic()
    async with arena_for(attack, base) as arena:
        await attack.run(arena)
        await arena.close()
        arena.check_outside(f"{attack.name} (final check)")
        report = arena.report
    report.seconds = time.monotonic() - started
    return report
