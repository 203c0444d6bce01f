"""The ``metadata`` suite: create, ``ls -l``, stat and unlink over growing directories.

For each directory size of the size profile (100 to 100,000 entries in ``full``) and each
layer, a round creates that many small files in a new directory, then mounts the layer
afresh with caches dropped and lists it with ``ls -l`` (cold, then warm), stats every entry
(served from the caches the listing filled, as ``ls -l`` then ``stat`` storms of agents
are), and unlinks them all. The direct layer does the same with ``pipe_file``, ``ls``,
``info`` and ``rm_file``.

A layer that took long at one size is not run at the next: when the measured time times the
size factor is over ``--budget`` seconds, the larger size is recorded as skipped with the
estimate, so a slow peer cannot hold the run for hours.
"""

from __future__ import annotations

import time

from ._context import Context
from ._layers import LayerSpec
from ._model import DIRECT, Measurement
from ._system import drop_caches
from ._targets import FsspecTarget, Target

__all__ = ["run"]

SUITE = "metadata"
PAYLOAD = b"x" * 100
SETTLE_S = 120.0
CASES = (
    ("create", "create files", "ops/s"),
    ("ls_cold", "`ls -l`, cold", "s"),
    ("ls_warm", "`ls -l`, warm", "s"),
    ("stat", "stat every entry (after ls)", "ops/s"),
    ("unlink", "unlink every entry", "ops/s"),
)


def _measurements(ctx: Context, backend: str, layer: str, n: int) -> dict[str, Measurement]:
    return {case: ctx.measurement(SUITE, case, backend, layer, label, unit, n if unit == "ops/s" else 0, entries=n)
            for case, label, unit in CASES}  # fmt: skip


def run(ctx: Context) -> None:
    """Run the metadata suite on every backend of the run."""
    for backend in ctx.backends:
        layers = ctx.layers[backend.name]
        sizes = ctx.size.entries
        ctx.progress.start(f"metadata on {backend.name} ({', '.join(f'{n:,}' for n in sizes)} entries)",
                           len(sizes) * ctx.repeat * len(layers))
        # Per layer: the seconds one round took at the previous size, for the budget estimate.
        spent: dict[str, tuple[int, float]] = {}
        direct = FsspecTarget(DIRECT, backend.name, backend.filesystem(), backend.root)
        for n in sizes:
            names = [f"f{i:06d}.txt" for i in range(n)]
            for rnd in range(ctx.repeat):
                for spec in layers:
                    ms = _measurements(ctx, backend.name, spec.name, n)
                    if (backend.name, spec.name) in ctx.harness.broken:
                        reason: str | None = "the layer did not mount earlier in the run"
                    else:
                        reason = _over_budget(ctx, spec.name, n, spent)
                    if reason is not None:
                        for m in ms.values():
                            m.skipped = reason
                        ctx.progress.advance(f"{spec.name} {n:,}: skipped")
                        continue
                    with ctx.timer() as elapsed:
                        _round(ctx, spec, ms, names, f"meta-{n}-{rnd}", direct)
                    prev_n, prev_t = spent.get(spec.name, (0, 0.0))
                    spent[spec.name] = (n, max(elapsed(), prev_t) if prev_n == n else elapsed())
                    ctx.progress.advance(f"round {rnd + 1}: {spec.name}, {n:,} entries ({elapsed():.1f} s)")


def _over_budget(ctx: Context, layer: str, n: int, spent: dict[str, tuple[int, float]]) -> str | None:
    prev = spent.get(layer)
    if prev is None or prev[0] >= n:
        return None
    estimate = prev[1] * n / prev[0]
    if estimate <= ctx.budget:
        return None
    return (f"estimated {estimate:,.0f} s per round ({prev[1]:.1f} s at {prev[0]:,} entries), "
            f"over the {ctx.budget:,.0f} s budget (--budget)")


def _round(ctx: Context, spec: LayerSpec, ms: dict[str, Measurement], names: list[str], rel: str,
           direct: FsspecTarget) -> None:
    n = len(names)
    limit = 60.0 + n / 20  # 20 entries/s is broken already
    try:
        with spec.open(ctx.harness) as target:
            target.makedirs(rel)
            with target.guard(limit, "create"):
                if not ctx.record(ms["create"], lambda: target.create_files(rel, names, PAYLOAD)):
                    target.remove(rel)
                    return
            if spec.mounted and not _all_in_backend(direct, rel, n):
                # A mount that uploads after close (rclone) must finish before it is
                # unmounted, or the files are lost with its cache directory.
                ms["create"].errors.append(f"not all {n:,} files in the backend {SETTLE_S:.0f} s after the last close")
                target.remove(rel)
                return
        # Freshly mounted, caches dropped: the listing must come from the backend.
        with spec.open(ctx.harness) as target:
            if ctx.cold:
                drop_caches()
            elif not ms["ls_cold"].notes:
                ms["ls_cold"].notes.append("caches not dropped (not root): not cold")
            _listing(ctx, target, ms, rel, n, limit)
            with target.guard(limit, "stat"):
                ctx.record(ms["stat"], lambda: target.stat_files(rel, names))
            with target.guard(limit, "unlink"):
                ctx.record(ms["unlink"], lambda: target.unlink_files(rel, names))
            target.remove(rel)
    except Exception as exc:
        # A layer that cannot even make the directory (or mount) fails this round, not the run.
        ms["create"].errors.append(f"{type(exc).__name__}: {exc}")
        ctx.progress.log(f"  error: {spec.name}: {exc}")


def _all_in_backend(direct: FsspecTarget, rel: str, n: int) -> bool:
    deadline = time.monotonic() + SETTLE_S
    while True:
        direct._fresh()
        try:
            if len(direct.fs.ls(direct._p(rel), detail=False)) >= n:
                return True
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _listing(ctx: Context, target: Target, ms: dict[str, Measurement], rel: str, n: int, limit: float) -> None:
    for case in ("ls_cold", "ls_warm"):
        with target.guard(limit, "ls -l"):
            if not ctx.record(ms[case], lambda: target.list_long(rel, n, limit)):
                return
