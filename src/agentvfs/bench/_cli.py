"""``agentvfs bench``: arguments, the run around the suites, and its clean end on any exit."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from ..mounts import fuse_available, is_mounted
from ._args import MOUNT_SUITES, SUITES, add_arguments
from ._backends import BackendSet, BenchError, check_endpoint
from ._context import SIZES, Context, Progress
from ._layers import Harness, LayerSpec, layers_for
from ._model import RunResult
from ._system import can_drop_caches, machine_description

__all__ = ["SUITES", "add_arguments", "main", "run"]

def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class _Interrupted(KeyboardInterrupt):
    pass


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    # SIGTERM and SIGHUP unwind like Ctrl-C: through every finally that unmounts.
    raise _Interrupted(signal.Signals(signum).name)


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    # SIGINT too: a shell without job control starts background jobs with SIGINT ignored, and
    # an inherited SIG_IGN would make the run impossible to stop cleanly.
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, _raise_interrupt) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _check_workdir(path: Path) -> None:
    if is_mounted(str(path)):
        raise BenchError(f"--workdir {path} is a mount point in use; give a plain directory")
    if path.exists() and not path.is_dir():
        raise BenchError(f"--workdir {path} is not a directory")


def _validate(args: argparse.Namespace) -> None:
    backends = args.backends or ["memory", "local"]
    if args.endpoint is not None:
        remote = [b for b in backends if b in ("s3", "gcs")]
        if len(remote) != 1:
            raise BenchError("--endpoint names one server: use it with exactly one of --backend s3 or --backend gcs")
        check_endpoint(args.endpoint)
    if args.results_md is not None and args.regenerate is None:
        raise BenchError("--results-md is only used with --regenerate")
    if args.budget <= 0:
        raise BenchError(f"--budget must be positive, got {args.budget}")
    if args.cranfield is not None and not (args.cranfield / "cran.all.1400").is_file():
        raise BenchError(f"--cranfield {args.cranfield}: no cran.all.1400 there")
    if args.workdir is not None:
        _check_workdir(args.workdir)


def run(args: argparse.Namespace, progress: Progress) -> RunResult:
    """Run the suites asked for; the result is marked partial when interrupted.

    Every mount is unmounted and every server stopped before this returns, whatever happened.
    """
    suites = list(dict.fromkeys(args.suites or SUITES))
    backend_names = list(dict.fromkeys(args.backends or ["memory", "local"]))
    size = SIZES[args.size]
    cranfield = args.cranfield or (Path(os.environ["CRANFIELD_DIR"]) if os.environ.get("CRANFIELD_DIR") else None)
    base = args.workdir
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="agentvfs-bench-", dir=base))
    cold = can_drop_caches()
    run_result = RunResult(
        command=shlex.join(["agentvfs", *getattr(args, "argv", ["bench"])]),
        started=_now(),
        machine=machine_description(),
        config={"suites": suites, "backends": backend_names, "peers": args.peers, "size": size.name,
                "repeat": args.repeat, "warmup": args.warmup, "budget_seconds": args.budget, "fio": args.fio,
                "caches_dropped": cold, "s3_server": args.endpoint or args.s3_server},
    )  # fmt: skip
    if not cold:
        run_result.problem("page cache not dropped (needs root): figures marked cold are not cold")
    harness = Harness(workdir)
    servers = BackendSet(workdir, endpoint=args.endpoint, key=args.key, secret=args.secret, bucket=args.bucket,
                         s3_server=args.s3_server)
    current = "starting"
    try:
        with _signals():
            backends = []
            for name in backend_names:
                current = f"starting the {name} backend"
                b = servers.open(name)
                backends.append(b)
                run_result.machine[f"{name} backend"] = f"{b.url} ({b.server})"
            layers: dict[str, list[LayerSpec]] = {}
            why_no_fuse = fuse_available()
            for b in backends:
                specs, skipped = layers_for(b, peers=args.peers)
                if why_no_fuse is not None:
                    run_result.skip_once(f"mount layers: {why_no_fuse}")
                    specs = [s for s in specs if not s.mounted]
                for reason in skipped:
                    run_result.skip_once(reason)
                for spec in specs:
                    run_result.layers[f"{b.name} {spec.name}"] = spec.how
                layers[b.name] = specs
            ctx = Context(run_result, backends, layers, size, args.repeat, args.warmup, harness, progress, workdir,
                          args.budget, cold=cold, fio=args.fio, cranfield=cranfield)
            ctx.extras["peers"] = args.peers
            for suite in suites:
                current = f"the {suite} suite"
                module: Any = importlib.import_module(SUITES[suite], __package__)
                ctx.layers = {
                    b.name: [s for s in layers[b.name]
                             if (suite in MOUNT_SUITES or not s.mounted) and (s.suites is None or suite in s.suites)]
                    for b in backends
                }  # fmt: skip
                module.run(ctx)
    except KeyboardInterrupt as exc:
        run_result.partial = True
        run_result.partial_reason = f"interrupted ({exc or 'SIGINT'}) during {current}"
        progress.log(f"interrupted during {current}: unmounting and stopping the servers")
    except BenchError:
        raise
    except Exception as exc:  # a bug or a broken environment: keep what was measured
        run_result.partial = True
        run_result.partial_reason = f"{type(exc).__name__} during {current}: {exc}"
        progress.log(f"error during {current}: {type(exc).__name__}: {exc}")
    finally:
        # Cleanup must finish even if a second Ctrl-C arrives while it runs.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            harness.close()
            for p in harness.problems:
                run_result.problem(p)
            for p in servers.close():
                run_result.problem(p)
            for key, times in harness.ready_times.items():
                run_result.layers[key] = run_result.layers.get(key, "") + (
                    f" (mounted in {sorted(times)[len(times) // 2]:.2f} s, median)")
            shutil.rmtree(workdir, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, old)
    run_result.finished = _now()
    return run_result


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``agentvfs bench``: 0 when the run completed, 130 when interrupted, 2 for bad input."""
    from ._report import regenerate_results_md, write_report

    try:
        _validate(args)
        if args.regenerate is not None:
            return _regenerate(args, regenerate_results_md, write_report)
        progress = Progress(enabled=not args.quiet)
        out: Path = args.out or Path("bench-results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        if out.exists() and any(out.iterdir()):
            raise BenchError(f"--out {out} exists and is not empty; give a new directory")
        out.mkdir(parents=True, exist_ok=True)
        with progress:
            result = run(args, progress)
    except BenchError as exc:
        parser.error(str(exc))  # exits 2 with the usage line
    paths = write_report(result, out)
    errors = sum(len(m.errors) for m in result.measurements)
    print(f"agentvfs bench: {len(result.measurements)} measurements, {errors} errors"
          f"{' (PARTIAL: ' + (result.partial_reason or '') + ')' if result.partial else ''}", file=sys.stderr)
    print(f"report: {paths['report.md']}", file=sys.stderr)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2)
        print()
    return 130 if result.partial and (result.partial_reason or "").startswith("interrupted") else (
        1 if result.partial else 0)


def _regenerate(args: argparse.Namespace, regenerate_results_md: Callable[[Path, Path], None],
                write_report: Callable[[RunResult, Path], dict[str, Path]]) -> int:
    run_dir: Path = args.regenerate
    src = run_dir / "results.json"
    try:
        result = RunResult.from_json(json.loads(src.read_text()))
    except FileNotFoundError:
        raise BenchError(f"--regenerate {run_dir}: no results.json there") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise BenchError(f"--regenerate {run_dir}: results.json is not a bench result: {exc}") from None
    write_report(result, run_dir)
    if args.results_md is not None:
        regenerate_results_md(run_dir, args.results_md)
        print(f"updated {args.results_md}", file=sys.stderr)
    print(f"rewrote {run_dir / 'report.md'}", file=sys.stderr)
    return 0


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """Parse ``agentvfs bench`` arguments alone (for tests and ``python -m``)."""
    p = argparse.ArgumentParser(prog="agentvfs bench")
    add_arguments(p)
    return p.parse_args(argv), p
