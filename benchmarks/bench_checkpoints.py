"""What undo checkpoints cost a shell command, on a local workspace of 2,000 files.

Times ``execute_command`` through ``Workspace.create_tools()`` with a ``LocalSandbox`` over
the workspace's own directory, in three configurations whose rounds alternate in one run:

* ``off``: no checkpoints (the baseline);
* ``writes only``: ``{"checkpoints": {"commands": False}}``, checkpoints before file-tool
  writes only, so a command costs what it did before commands were covered;
* ``commands``: ``{"checkpoints": True}``: a snapshot before each command and a comparison
  with it after.

Each configuration runs a command that changes nothing (``true``), one that rewrites a
file and adds another, and a ``write_file`` after a read (which starts a batch of writes);
with checkpoints on, ``mastra_workspace_undo`` then takes the command back, and that is
timed too. A baseline runs the same script with ``PYTHONPATH`` set to another
checkout's ``src``.

Usage: ``python benchmarks/bench_checkpoints.py [--files 2000] [--repeat 7]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import anyio

from agentvfs import WORKSPACE_TOOLS, LocalFilesystem, Workspace
from agentvfs.sandbox import LocalSandbox

SB = WORKSPACE_TOOLS.SANDBOX
UNDO = WORKSPACE_TOOLS.CHECKPOINTS.UNDO

CONFIGS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "writes only": {"checkpoints": {"commands": False}},
    "commands": {"checkpoints": True, UNDO: {"enabled": True}},
}


def make_tree(root: str, files: int) -> None:
    for i in range(files):
        path = os.path.join(root, f"pkg{i % 20:02d}", f"mod{(i // 20) % 10}", f"file{i:05d}.py")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(20)))


async def one_round(root: str, config: dict[str, Any] | None, step: int) -> dict[str, float]:
    ws = Workspace(
        filesystem=LocalFilesystem(root),
        sandbox=LocalSandbox(working_directory=root),
        tools=config,
    )
    await ws.init()
    try:
        tools = await ws.create_tools()
        run = tools[SB.EXECUTE_COMMAND]
        await run.execute({"command": "true"})  # warm-up (and the first, full snapshot)
        out: dict[str, float] = {}
        started = time.perf_counter()
        await run.execute({"command": "true"})
        out["command changing nothing"] = time.perf_counter() - started
        command = f"echo {step} >> pkg00/mod0/file00000.py && echo new > added-{step}.txt"
        started = time.perf_counter()
        await run.execute({"command": command})
        out["command changing 2 files"] = time.perf_counter() - started
        if UNDO in tools:
            started = time.perf_counter()
            answer = str(await tools[UNDO].execute({}))
            out["undo of that command"] = time.perf_counter() - started
            assert answer.startswith("Undid 1 command: restored 2 paths"), answer
        else:
            os.remove(os.path.join(root, f"added-{step}.txt"))
        # A write after a read starts a batch: with checkpoints on, a snapshot first. The
        # second such batch is timed (the first one of "writes only" is its first snapshot).
        for batch in ("first", "second"):
            await tools[WORKSPACE_TOOLS.FILESYSTEM.READ_FILE].execute({"path": "pkg00/mod0/file00000.py"})
            started = time.perf_counter()
            await tools[WORKSPACE_TOOLS.FILESYSTEM.WRITE_FILE].execute({"path": f"w-{step}-{batch}.txt", "content": "w\n"})
            out[f"write_file starting a {batch} batch"] = time.perf_counter() - started
        for batch in ("first", "second"):
            os.remove(os.path.join(root, f"w-{step}-{batch}.txt"))
        return out
    finally:
        await ws.destroy()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    import logging

    logging.getLogger("agentvfs.sandbox").setLevel(logging.ERROR)  # the "no isolation" warning
    samples: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-checkpoints-") as root:
        make_tree(root, args.files)
        step = 0
        for _ in range(args.repeat):
            for name, config in CONFIGS.items():  # alternating: the machine's drift hits all alike
                step += 1
                for what, seconds in (await one_round(root, config, step)).items():
                    samples.setdefault((name, what), []).append(seconds)
    print(f"# checkpoints and shell commands: {args.files} files on local disk, {args.repeat} rounds")
    print(f"# {platform.platform()}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print("| configuration | step | median ms | min–max ms |")
    print("|---|---|---|---|")
    for (name, what), values in samples.items():
        median = statistics.median(values) * 1000
        print(f"| {name} | {what} | {median:,.1f} | {min(values) * 1000:,.1f}–{max(values) * 1000:,.1f} |")


if __name__ == "__main__":
    anyio.run(main)
