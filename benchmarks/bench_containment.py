"""What containment by descriptors costs local-disk tool calls, against the code before it.

Two worker processes run the same tool calls on their own copy of the same tree: one imports
this checkout, the other a git worktree of ``--baseline`` (default: the commit before
``src/agentvfs/vfs/_disk.py`` was added, when containment was ``realpath()`` then open by
name). Rounds alternate between them (baseline, current, baseline, ...), so both see the same
machine at the same moments; each round runs every operation ``--calls`` times.

Operations (``Workspace`` tools on a ``LocalFilesystem`` of 200 small files in 10
directories): ``read_file``, ``file_stat``, ``write_file`` (a new file each call),
``edit_file``, ``list_files`` (the whole tree), ``grep`` (the whole tree), and
``read_file`` through a symlink inside the root. Reported: median µs per call over the
rounds, min-max, and the median ratio current/baseline.

Usage: ``python benchmarks/bench_containment.py [--rounds 7] [--calls 200] [--baseline REV]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OPS = ("read_file", "file_stat", "write_file", "edit_file", "list_files", "grep", "read_link")

# The worker: builds its tree, then answers {"op", "calls"} lines with {"op", "seconds"}.
_WORKER = r'''
import json, os, sys, time, anyio
from agentvfs import LocalFilesystem, Workspace

async def main(root):
    for d in range(10):
        os.makedirs(f"{root}/pkg{d}", exist_ok=True)
        for f in range(20):
            with open(f"{root}/pkg{d}/mod{f}.py", "w") as out:
                out.write("".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(20)))
    os.symlink("pkg3/mod4.py", f"{root}/linked.py")
    ws = Workspace(filesystem=LocalFilesystem(root))
    await ws.init()
    tools = await ws.create_tools()
    def t(name):
        return tools["mastra_workspace_" + name]
    counter = [0]
    async def write():
        counter[0] += 1
        await t("write_file").execute({"path": f"new/w{counter[0]}.txt", "content": "x" * 100})
    calls = {
        "read_file": lambda: t("read_file").execute({"path": "pkg1/mod2.py"}),
        "file_stat": lambda: t("file_stat").execute({"path": "pkg1/mod2.py"}),
        "write_file": write,
        "edit_file": lambda: t("edit_file").execute(
            {"path": "pkg2/mod3.py", "old_string": "return x + 7\n", "new_string": "return x + 7\n"}),
        "list_files": lambda: t("list_files").execute({"path": ".", "maxDepth": 3}),
        "grep": lambda: t("grep").execute({"pattern": "x \\+ 19", "path": "."}),
        "read_link": lambda: t("read_file").execute({"path": "linked.py"}),
    }
    await t("read_file").execute({"path": "pkg2/mod3.py"})  # edit_file needs a read first
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        fn = calls[ask["op"]]
        await fn()  # warm
        started = time.perf_counter()
        for _ in range(ask["calls"]):
            await fn()
        print(json.dumps({"op": ask["op"], "seconds": time.perf_counter() - started}), flush=True)

anyio.run(main, sys.argv[1])
'''


def _baseline_rev() -> str:
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "src/agentvfs/vfs/_disk.py"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not added:
        raise SystemExit("cannot find the commit that added src/agentvfs/vfs/_disk.py; pass --baseline")
    return f"{added[-1]}^"


class Worker:
    def __init__(self, name: str, src: Path, root: Path) -> None:
        self.name = name
        env = dict(os.environ, PYTHONPATH=str(src))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(root)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        first = json.loads(self.proc.stdout.readline())
        assert first.get("ready"), first

    def run(self, op: str, calls: int) -> float:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "calls": calls}) + "\n")
        self.proc.stdin.flush()
        return float(json.loads(self.proc.stdout.readline())["seconds"]) / calls

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--baseline", default=None, help="git revision to compare with")
    args = parser.parse_args()
    rev = args.baseline or _baseline_rev()
    scratch = Path(tempfile.mkdtemp(prefix="agentvfs-bench-containment-", dir="/var/tmp"))
    worktree = scratch / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(worktree), rev], cwd=REPO, check=True)
    try:
        label = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
        workers = {
            "baseline": Worker("baseline", worktree / "src", scratch / "tree-baseline"),
            "current": Worker("current", REPO / "src", scratch / "tree-current"),
        }
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for op in OPS:
                for name, worker in workers.items():
                    samples.setdefault((name, op), []).append(worker.run(op, args.calls))
        for worker in workers.values():
            worker.close()
        print(f"baseline {label} (realpath, then open by name) against this checkout (descriptors); "
              f"{args.rounds} rounds x {args.calls} calls, interleaved\n")  # fmt: skip
        print("| tool call | baseline µs | current µs | current/baseline |")
        print("|---|---|---|---|")
        for op in OPS:
            base, cur = samples[("baseline", op)], samples[("current", op)]
            ratios = [c / b for b, c in zip(base, cur, strict=True)]
            print(
                f"| {op} | {statistics.median(base) * 1e6:,.0f} [{min(base) * 1e6:,.0f}-{max(base) * 1e6:,.0f}]"
                f" | {statistics.median(cur) * 1e6:,.0f} [{min(cur) * 1e6:,.0f}-{max(cur) * 1e6:,.0f}]"
                f" | {statistics.median(ratios):.2f} |"
            )
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
