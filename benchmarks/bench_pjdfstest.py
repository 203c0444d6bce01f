#!/usr/bin/env python
"""pjdfstest through a mount, inside one mount lifetime and with a remount between test files.

pjdfstest (github.com/pjd/pjdfstest, built from its source: ``autoreconf -ifs && ./configure
&& make pjdfstest``) checks syscall semantics and errno with about 8,800 assertions in 238
test files. Each layer is measured two ways on the same storage:

- **lifetime**: one mount process serves every test file;
- **remount**: every test file runs in a new mount process (the previous one exited), so each
  starts from what storage kept of the files before it.

Layers: ``agentvfs-s3`` and ``agentvfs-local`` (an ``agentvfs mount`` process on moto S3 and
on a local directory), ``s3fs`` (s3fs-fuse) and ``rclone`` (``rclone mount --vfs-cache-mode
writes``) on moto S3. The mount runs with ``allow_other`` (pjdfstest switches users). A
``# TODO`` result counts as passed, as ``prove`` counts it.

Usage::

    python benchmarks/bench_pjdfstest.py --pjdfstest /path/to/pjdfstest \\
        --layers agentvfs-s3 agentvfs-local s3fs rclone --modes lifetime remount --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentvfs.mounts import is_mounted
from agentvfs.testing import MotoServer

BUCKET = "agentvfs-pjdfstest"
LAYERS = ("agentvfs-s3", "agentvfs-local", "s3fs", "rclone")
_RESULT = re.compile(r"^(not )?ok \d+(.*)$")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    env.pop("AWS_CA_BUNDLE", None)
    return env


class Layer:
    """How to start one mount of one layer on its storage (a prefix, or a directory)."""

    def __init__(self, name: str, moto: MotoServer | None, work: Path) -> None:
        self.name = name
        self.moto = moto
        self.work = work
        self.prefix = f"{BUCKET}/{name}-{os.getpid()}-{time.monotonic_ns()}"
        self.local = work / f"{name}-store"
        self.local.mkdir()

    def argv(self, mnt: str) -> list[str]:
        endpoint = self.moto.endpoint_url if self.moto is not None else ""
        bucket, _, prefix = self.prefix.partition("/")
        if self.name.startswith("agentvfs"):
            cli = [sys.executable, "-c", "import sys; from agentvfs.cli import main; sys.exit(main())"]
            state = ["-o", f"state_dir={self.work / 'state'}"]
            if self.name == "agentvfs-local":
                return [*cli, "mount", os.fspath(self.local), mnt, "-o", "allow_other=true", *state]
            return [*cli, "mount", f"s3://{self.prefix}", mnt, "-o", f"endpoint_url={endpoint}",
                    "-o", "allow_other=true", *state]  # fmt: skip
        if self.name == "s3fs":
            secret = self.work / "s3fs-passwd"
            secret.write_text("testing:testing\n")
            secret.chmod(0o600)
            return ["s3fs", f"{bucket}:/{prefix}", mnt, "-f", "-o", f"url={endpoint}", "-o", "use_path_request_style",
                    "-o", f"passwd_file={secret}", "-o", "endpoint=us-east-1", "-o", "allow_other",
                    "-o", "dbglevel=err"]  # fmt: skip
        remote = f":s3,provider=Other,endpoint='{endpoint}',access_key_id=testing,secret_access_key=testing:{self.prefix}"
        return ["rclone", "mount", remote, mnt, "--vfs-cache-mode", "writes", "--allow-other",
                "--cache-dir", os.fspath(self.work / "rclone-cache")]  # fmt: skip

    def start(self, mnt: str) -> subprocess.Popen[bytes]:
        out = open(self.work / f"{self.name}.log", "ab")  # noqa: SIM115  (the child's)
        proc = subprocess.Popen(self.argv(mnt), stdout=out, stderr=out, env=_env())
        out.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not is_mounted(mnt) and proc.poll() is None:
            time.sleep(0.05)
        if not is_mounted(mnt):
            proc.kill()
            raise RuntimeError(f"{self.name} did not mount (see {self.work / f'{self.name}.log'})")
        return proc

    def stop(self, proc: subprocess.Popen[bytes], mnt: str) -> None:
        if self.name.startswith("agentvfs"):
            proc.send_signal(signal.SIGTERM)
        else:
            subprocess.run(["fusermount3", "-u", mnt], check=False, capture_output=True)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-uz", mnt], check=False, capture_output=True)


def run_file(test: Path, cwd: str) -> tuple[int, int, list[str]]:
    """Run one pjdfstest file in ``cwd``: assertions passed, in all, and the failures."""
    try:
        done = subprocess.run(
            ["prove", "-v", os.fspath(test)], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
        )
        output = done.stdout
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    passed = total = 0
    failed: list[str] = []
    for line in output.splitlines():
        match = _RESULT.match(line.strip())
        if match is None:
            continue
        total += 1
        if match.group(1) is None or "# TODO" in match.group(2):
            passed += 1
        else:
            failed.append(line.strip())
    plan = re.search(r"^1\.\.(\d+)", output, re.MULTILINE)
    if plan is not None and int(plan.group(1)) > total:
        failed.append(f"{int(plan.group(1)) - total} assertions did not run")
        total = int(plan.group(1))
    return passed, total, failed


def measure(layer: Layer, mode: str, tests: list[Path], mnt: str) -> dict[str, Any]:
    started = time.monotonic()
    per_file: dict[str, list[int]] = {}
    failures: dict[str, list[str]] = {}
    proc = layer.start(mnt) if mode == "lifetime" else None
    try:
        for test in tests:
            name = f"{test.parent.name}/{test.name}"
            if mode == "remount":
                proc = layer.start(mnt)
            assert proc is not None
            try:
                passed, total, failed = run_file(test, mnt)
            finally:
                if mode == "remount":
                    layer.stop(proc, mnt)
                    proc = None
            per_file[name] = [passed, total]
            if failed:
                failures[name] = failed[:20]
    finally:
        if proc is not None:
            layer.stop(proc, mnt)
    passed = sum(p for p, _ in per_file.values())
    total = sum(t for _, t in per_file.values())
    return {
        "layer": layer.name, "mode": mode, "passed": passed, "total": total,
        "seconds": round(time.monotonic() - started, 1), "files": per_file, "failures": failures,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pjdfstest", required=True, type=Path, help="a built pjdfstest checkout")
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=LAYERS)
    parser.add_argument("--modes", nargs="+", default=["lifetime", "remount"], choices=["lifetime", "remount"])
    parser.add_argument("--only", default="", help="a substring of the test files to run (e.g. chmod/)")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("pjdfstest switches users: run it as root")
    tests = sorted(p for p in (args.pjdfstest / "tests").rglob("*.t") if args.only in f"{p.parent.name}/{p.name}")
    if not (args.pjdfstest / "pjdfstest").is_file() or not tests:
        parser.error(f"{args.pjdfstest} holds no built pjdfstest (run make pjdfstest there)")
    missing = [name for name, tool in (("s3fs", "s3fs"), ("rclone", "rclone")) if name in args.layers and shutil.which(tool) is None]
    if missing:
        parser.error(f"not installed: {', '.join(missing)} (scripts/setup.sh bench installs them)")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agentvfs-pjd-") as tmp:
        work = Path(tmp)
        moto = MotoServer(log_path=work / "moto.log")
        moto.start()
        try:
            moto.s3fs().mkdir(BUCKET)
            for name in args.layers:
                for mode in args.modes:
                    layer_work = work / f"{name}-{mode}"
                    layer_work.mkdir()
                    layer = Layer(name, moto, layer_work)
                    mnt = layer_work / "mnt"
                    mnt.mkdir()
                    os.chmod(layer_work, 0o755)
                    log(f"{name} {mode}: {len(tests)} test files")
                    result = measure(layer, mode, tests, os.fspath(mnt))
                    log(f"{name} {mode}: {result['passed']} / {result['total']} in {result['seconds']} s")
                    results.append(result)
                    if args.json:
                        args.json.write_text(json.dumps(results, indent=1))
        finally:
            moto.stop()
    print(report(results))
    return 0


def report(results: list[dict[str, Any]]) -> str:
    def by(r: dict[str, Any]) -> str:
        return f"{r['passed']:,} / {r['total']:,} ({r['seconds']:.0f} s)"
    lines = ["| layer | one lifetime | remount between test files |", "|---|---:|---:|"]
    for name in dict.fromkeys(r["layer"] for r in results):
        cells = {r["mode"]: by(r) for r in results if r["layer"] == name}
        lines.append(f"| {name} | {cells.get('lifetime', '—')} | {cells.get('remount', '—')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
