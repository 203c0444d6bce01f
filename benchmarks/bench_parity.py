#!/usr/bin/env python
"""Parity with the reference: the share of tool calls whose output is byte-identical.

Runs the differential oracle of the test suite (``tests/_oracle.py``): the hand-written cases
and seeded random ones, through the reference (``@mastra/core`` under Node, installed by
``scripts/setup.sh test``) and through agentvfs. Each call is identical, a documented
deliberate deviation (counted per cause), or unexplained. With ``--baseline-src DIR`` (the
``src`` of another checkout) the same cases also run through that tree, in the same run, so
the two shares compare like with like.

Usage::

    python benchmarks/bench_parity.py --seeds 1 2 --cases 150 --big-seeds 3 4 --big-cases 1000 \
        --baseline-src /tmp/base/src --json parity.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _cases(kind: str, seed: int, count: int) -> list[Any]:
    from _oracle_cases import hand_cases, random_cases

    return hand_cases() if kind == "hand" else random_cases(seed, count)


def _ours(src: Path | None, kind: str, seed: int, count: int, base: Path) -> dict[str, Any]:
    """Run the cases through the agentvfs in ``src`` (this tree when None), in a process of its own."""
    out = base / "ours.json"
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    subprocess.run(
        [sys.executable, __file__, "--worker", kind, str(seed), str(count), str(base), str(out)],
        check=True,
        env=env,
        stderr=subprocess.DEVNULL,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _worker(kind: str, seed: int, count: int, base: Path, out: Path) -> None:
    from _oracle import run_here

    out.write_text(json.dumps(run_here(_cases(kind, seed, count), base)))


def measure(kind: str, seed: int, count: int, baseline: Path | None) -> dict[str, Any]:
    """The figures of one case set, for this tree and the baseline."""
    from _oracle import compare, run_reference, summary

    cases = _cases(kind, seed, count)
    figures: dict[str, Any] = {
        "set": "hand-written" if kind == "hand" else f"random seed {seed}",
        "cases": len(cases),
    }
    with tempfile.TemporaryDirectory(prefix="agentvfs-parity-") as tmp:
        t0 = time.perf_counter()
        reference = run_reference(cases, Path(tmp) / "reference")
        figures["reference_s"] = round(time.perf_counter() - t0, 1)
        trees = {"this tree": None, **({"baseline": baseline} if baseline else {})}
        for label, src in trees.items():
            t0 = time.perf_counter()
            ours = _ours(src, kind, seed, count, Path(tmp) / label.replace(" ", "-"))
            elapsed = round(time.perf_counter() - t0, 1)
            outcomes = [o for c in cases for o in compare(c, reference[c.id], ours[c.id])]
            counts = summary(outcomes)
            counts["share"] = round(100 * counts["identical"] / max(1, counts["calls"]), 1)
            counts["seconds"] = elapsed
            counts["unexplained_examples"] = [
                o.describe()[:400] for o in outcomes if not o.identical and not o.deviation
            ][:5]
            figures[label] = counts
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2])
    parser.add_argument(
        "--cases", type=int, default=150, help="random cases per seed (default 150, as the tests)"
    )
    parser.add_argument("--big-seeds", type=int, nargs="*", default=[3, 4])
    parser.add_argument("--big-cases", type=int, default=1000)
    parser.add_argument("--baseline-src", type=Path, help="the src directory of another checkout")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, seed, count, base, out = args.worker
        _worker(kind, int(seed), int(count), Path(base), Path(out))
        return
    from _oracle import reference_missing

    missing = reference_missing()
    if missing:
        sys.exit(f"bench_parity: {missing}")
    sets = [("hand", 0, 0)] + [("random", s, args.cases) for s in args.seeds]
    sets += [("random", s, args.big_cases) for s in args.big_seeds]
    results = []
    for kind, seed, count in sets:
        figures = measure(kind, seed, count, args.baseline_src)
        results.append(figures)
        for label in ("this tree", "baseline"):
            if label in figures:
                f = figures[label]
                print(
                    f"{figures['set']:<16} {figures['cases']:>5} cases  {label:<9}  {f['identical']:>6}/{f['calls']:<6}"
                    f" identical ({f['share']:.1f} %)  unexplained {f['unexplained']:>4}  {f['seconds']:>6.1f} s"
                    f"  deviations {json.dumps(f['deviations'], sort_keys=True)}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
