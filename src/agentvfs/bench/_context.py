"""What every suite receives: sizes, repetitions, backends, layers, the recorder and progress."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._model import Measurement, RunResult

if TYPE_CHECKING:
    from ._backends import Backend
    from ._layers import Harness, LayerSpec

__all__ = ["SIZES", "Context", "Progress", "SizeProfile", "Timeout"]

MiB = 1 << 20


class Timeout(Exception):
    """An operation on a mount ran past its watchdog limit (the mount was killed)."""


@dataclass(frozen=True)
class SizeProfile:
    """How big each suite's data is. ``tiny`` exists for tests of the command itself."""

    name: str
    #: io: sequential file size on local and memory backends, and on remote ones.
    io_bytes: int
    io_remote_bytes: int
    #: io: random reads (count x length) and random writes (count x length) per round.
    random_ops: int
    random_len: int
    #: metadata: directory sizes to create, stat, list and unlink.
    entries: tuple[int, ...]
    #: agent: files in the generated repository tree.
    repo_files: int
    #: search: documents (0 = the whole corpus) and queries (0 = all).
    search_docs: int
    search_queries: int
    #: sandbox: commands per case.
    commands: int
    #: fio: seconds per job and file size per job.
    fio_runtime: int
    fio_bytes: int


SIZES: dict[str, SizeProfile] = {
    "tiny": SizeProfile("tiny", 4 * MiB, 4 * MiB, 16, 64 << 10, (10, 100), 60, 300, 20, 5, 1, 8 * MiB),
    "small": SizeProfile("small", 64 * MiB, 64 * MiB, 64, 256 << 10, (100, 1_000), 2_000, 0, 0, 20, 5, 64 * MiB),
    "full": SizeProfile("full", 1 << 30, 256 * MiB, 256, 256 << 10, (100, 1_000, 10_000, 100_000), 2_000, 0, 0, 50,
                        30, 1 << 30),
}  # fmt: skip


class Progress:
    """Progress of the run on stderr: rich bars on a terminal, one plain line per step elsewhere."""

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._rich: Any = None
        self._task: Any = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), transient=False)  # fmt: skip

    def __enter__(self) -> Progress:
        if self._rich is not None:
            self._rich.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(None, None, None)

    def start(self, description: str, total: int) -> None:
        """A new bar (one per suite and backend) of ``total`` steps."""
        if self._rich is not None:
            if self._task is not None:
                self._rich.update(self._task, completed=self._rich.tasks[self._task].total)
            self._task = self._rich.add_task(description, total=total)
        else:
            self.log(f"== {description}")

    def advance(self, what: str) -> None:
        """One step of the current bar done."""
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, advance=1)
        elif self._enabled:
            self.log(f"   {what}")

    def log(self, message: str) -> None:
        if self._rich is not None:
            self._rich.console.print(message, markup=False, highlight=False)
        elif self._enabled:
            print(message, file=sys.stderr, flush=True)


@dataclass
class Context:
    """Everything a suite needs; suites add measurements to ``run`` and never raise for a
    layer's failure (it is recorded on the measurement)."""

    run: RunResult
    backends: list[Backend]
    layers: dict[str, list[LayerSpec]]
    size: SizeProfile
    repeat: int
    warmup: int
    harness: Harness
    progress: Progress
    workdir: Path
    #: Seconds one case may take on one layer before larger sizes of it are skipped.
    budget: float
    cold: bool = False
    fio: bool = False
    #: Directory holding the Cranfield collection, when available.
    cranfield: Path | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def measurement(self, suite: str, case: str, backend: str, layer: str, label: str, unit: str,
                    amount: float = 0.0, **params: Any) -> Measurement:
        """The measurement of this case, created on first use (rounds append to it)."""
        m = self.run.find(suite, case, backend, layer, params)
        if m is None:
            m = self.run.add(Measurement(suite, case, backend, layer, label, unit, amount, dict(params)))
        return m

    def record(self, m: Measurement, fn: Callable[[], float], *, warmup: bool = False) -> bool:
        """Run ``fn`` (which returns seconds, or a score for unit ``score``) into ``m``.

        With ``warmup`` the call is first made ``self.warmup`` times untimed. Any error (a
        client library's own exception types included: a truncated HTTP response is an
        ``aiohttp`` error, not an ``OSError``) is recorded on the measurement, logged, and not
        raised; ``KeyboardInterrupt`` passes.
        """
        try:
            if warmup:
                for _ in range(self.warmup):
                    fn()
            m.samples.append(fn())
            return True
        except Exception as exc:
            msg = f"{type(exc).__name__}: {exc}"
            m.errors.append(msg)
            self.progress.log(f"  error: {m.backend} / {m.layer} / {m.label}: {msg}")
            return False

    @contextlib.contextmanager
    def timer(self) -> Iterator[Callable[[], float]]:
        """``with ctx.timer() as elapsed: ...; elapsed()`` for inline timing."""
        t0 = time.perf_counter()
        yield lambda: time.perf_counter() - t0
