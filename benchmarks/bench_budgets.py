#!/usr/bin/env python
"""How far past its time limit a bounded tool call ends, on an idle and on a busy machine,
this tree against another checkout.

Each case is a call with a limit: grep of regex bombs in 20 files (``match_timeout_ms`` 1.5 s),
grep of a directory of bombs with the default limit (5 s), ``execute_command`` of ``sleep 5``
with a 1 s timeout, and of a command that ignores SIGTERM (1 s and the 1 s grace). Each is
measured with no load and with ``--hogs`` busy loops beside it (by default one per core and
two more), trees alternating round by round, each round in a fresh process; the report gives
the worst and the median overrun (seconds past the limit) and the load average of the run.

Usage::

    python benchmarks/bench_budgets.py --rounds 3 --baseline-src /tmp/base/src
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BOMB_LINE = "a" * 30 + "!"
BOMB = "(a|aa)+$"
#: (label, the call's limit in seconds)
CASES: list[tuple[str, float]] = [
    ("grep bombs x20, 1.5 s", 1.5),
    ("grep bombs, default 5 s", 5.0),
    ("command sleep 5, timeout 1 s", 1.0),
    ("command ignoring TERM, 1 s + 1 s", 2.0),
]


def _worker(root: str) -> None:
    import anyio

    from agentvfs import LocalFilesystem, LocalSandbox, Workspace

    async def main() -> dict[str, float]:
        bombs = Path(root) / "bombs"
        many = Path(root) / "many"
        ws = Workspace(
            filesystem=LocalFilesystem(base_path=root),
            sandbox=LocalSandbox(working_directory=root),
            tools={"mastra_workspace_grep": {"match_timeout_ms": 1500}},
        )
        await ws.init()
        tools = await ws.create_tools()
        default = Workspace(filesystem=LocalFilesystem(base_path=str(bombs)))
        await default.init()
        default_grep = (await default.create_tools())["mastra_workspace_grep"]
        grep, command = tools["mastra_workspace_grep"], tools["mastra_workspace_execute_command"]
        await grep.execute({"pattern": "warm up"})
        out: dict[str, float] = {}
        calls: list[tuple[str, Any]] = [
            (CASES[0][0], lambda: grep.execute({"pattern": BOMB, "path": many.name})),
            (CASES[1][0], lambda: default_grep.execute({"pattern": BOMB})),
            (CASES[2][0], lambda: command.execute({"command": "sleep 5", "timeout": 1})),
            (CASES[3][0], lambda: command.execute({"command": "trap '' TERM; sleep 5", "timeout": 1})),
        ]
        for label, call in calls:
            t0 = time.monotonic()
            with contextlib.suppress(Exception):
                await call()
            out[label] = time.monotonic() - t0
        await default.destroy()
        await ws.destroy()
        return out

    print(json.dumps(anyio.run(main)))


def _tree(root: Path) -> None:
    (root / "many").mkdir()
    for index in range(20):
        (root / "many" / f"{index:02}.txt").write_text((BOMB_LINE + "\n") * 5)
    (root / "bombs").mkdir()
    for index in range(10):
        (root / "bombs" / f"{index}.txt").write_text((BOMB_LINE + "\n") * 50)


@contextlib.contextmanager
def _hogs(count: int) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=(os.cpu_count() or 1) + 2)
    parser.add_argument("--baseline-src", type=Path, help="the src directory of another checkout")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    trees: dict[str, Path | None] = {"this tree": None}
    if args.baseline_src:
        trees["baseline"] = args.baseline_src
    loads: dict[str, list[float]] = {"idle": [], "busy": []}
    overrun: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="agentvfs-bench-budgets-") as tmp:
        _tree(Path(tmp))
        for _ in range(args.rounds):
            for state in ("idle", "busy"):
                with _hogs(args.hogs if state == "busy" else 0):
                    for label, src in trees.items():
                        env = dict(os.environ)
                        if src is not None:
                            env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
                        done = subprocess.run(
                            [sys.executable, __file__, "--worker", tmp],
                            env=env, capture_output=True, text=True, check=True, timeout=900,
                        )  # fmt: skip
                        loads[state].append(os.getloadavg()[0])
                        for case, seconds in json.loads(done.stdout.splitlines()[-1]).items():
                            limit = dict(CASES)[case]
                            overrun.setdefault((case, state, label), []).append(seconds - limit)
    print(f"seconds past the limit, {args.rounds} rounds; busy: {args.hogs} busy loops on {os.cpu_count()} cores")
    print(f"load average (1 min) idle {statistics.median(loads['idle']):.1f}, busy {statistics.median(loads['busy']):.1f}")
    header = f"{'case':<36}{'state':>6}" + "".join(f"{t + ' worst':>18}{'median':>9}" for t in trees)
    print(header)
    for case, _limit in CASES:
        for state in ("idle", "busy"):
            row = f"{case:<36}{state:>6}"
            for label in trees:
                values = overrun[(case, state, label)]
                row += f"{max(values):>+18.2f}{statistics.median(values):>+9.2f}"
            print(row)


if __name__ == "__main__":
    main()
