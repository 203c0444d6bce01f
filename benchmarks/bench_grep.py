#!/usr/bin/env python
"""Wall time of the grep tool on a tree of source files, this tree against another checkout.

The grep tool reads patterns in JavaScript's dialect and matches text as UTF-16 code units,
as the reference does; this measures what that costs against a baseline (``--baseline-src``,
the ``src`` of another checkout). The corpus is ``--files`` Python files copied from the
installed packages; each pattern runs through ``Workspace.create_tools()`` on a local
directory. Trees alternate round by round, each round in a fresh process of its own (after
one warm-up call per pattern), and the median per pattern is reported.

Usage::

    python benchmarks/bench_grep.py --files 2000 --rounds 5 --baseline-src /tmp/base/src
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

#: (label, input): literal, classes, alternation, a dot run, ignoring case, a word boundary.
PATTERNS: list[tuple[str, dict[str, Any]]] = [
    ("literal", {"pattern": "TODO"}),
    ("class", {"pattern": "[A-Z][a-z]+Error"}),
    ("escape", {"pattern": "def \\w+\\(self"}),
    ("alternation", {"pattern": "foo|bar|baz"}),
    ("dot run", {"pattern": "import.*os"}),
    ("ignore case", {"pattern": "todo", "caseSensitive": False}),
    ("ignore case, class", {"pattern": "\\w+error", "caseSensitive": False}),
    ("boundary", {"pattern": "\\bself\\b", "maxCount": 1}),
]


def _corpus(target: Path, files: int) -> int:
    source = Path(sysconfig.get_paths()["purelib"])
    count = 0
    for path in sorted(source.rglob("*.py")):
        if count >= files:
            break
        if path.stat().st_size > 200_000:
            continue
        dest = target / f"{count // 100:03d}" / f"{count}-{path.name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        count += 1
    return count


def _worker(root: str) -> None:
    import anyio

    from agentvfs import LocalFilesystem, Workspace

    async def main() -> dict[str, float]:
        ws = Workspace(filesystem=LocalFilesystem(base_path=root))
        await ws.init()
        grep = (await ws.create_tools())["mastra_workspace_grep"]
        out: dict[str, float] = {}
        for label, args in PATTERNS:
            await grep.execute(dict(args))  # warm: page cache, compiled pattern caches
            t0 = time.perf_counter()
            await grep.execute(dict(args))
            out[label] = time.perf_counter() - t0
        await ws.destroy()
        return out

    print(json.dumps(anyio.run(main)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-src", type=Path, help="the src directory of another checkout")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    trees: dict[str, Path | None] = {"this tree": None}
    if args.baseline_src:
        trees["baseline"] = args.baseline_src
    with tempfile.TemporaryDirectory(prefix="agentvfs-bench-grep-") as tmp:
        files = _corpus(Path(tmp), args.files)
        times: dict[str, dict[str, list[float]]] = {t: {p: [] for p, _ in PATTERNS} for t in trees}
        for _ in range(args.rounds):
            for label, src in trees.items():
                env = dict(os.environ)
                if src is not None:
                    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", tmp],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                for pattern, seconds in json.loads(proc.stdout.splitlines()[-1]).items():
                    times[label][pattern].append(seconds)
    print(
        f"grep tool over {files} Python files, median of {args.rounds} rounds (ms; lower is better)"
    )
    header = (
        f"{'pattern':<20}"
        + "".join(f"{t:>12}" for t in trees)
        + ("    ratio" if len(trees) == 2 else "")
    )
    print(header)
    for pattern, _ in PATTERNS:
        medians = [statistics.median(times[t][pattern]) * 1000 for t in trees]
        ratio = f"{medians[0] / medians[1]:>9.2f}" if len(medians) == 2 else ""
        print(f"{pattern:<20}" + "".join(f"{m:>12.1f}" for m in medians) + ratio)


if __name__ == "__main__":
    main()
