"""fio job files (the shape mountpoint-s3 publishes) run against every directory layer.

The job files in ``fio/`` use 256 KiB blocks, the sync engine, time-based runs and
``group_reporting``: sequential read, random read and sequential write with 1 and 4 jobs.
Read jobs get their files laid out first (``--create_only``, untimed) and the caches
dropped, so the timed run starts cold; a file shorter than the runtime is read again from
the start, so later passes may be served by the page cache, as they would for any reader.
Results are recorded in the ``io`` suite as ``fio_<job>`` cases (MiB/s over fio's own
runtime); the direct API has no directory to point fio at, so local disk is their limit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from ._backends import Backend
from ._context import Context, MiB
from ._layers import LOCAL_DISK, LayerSpec, MountFailed
from ._system import drop_caches

__all__ = ["JOBS", "job_files", "run_jobs"]

JOBS = ("seq_read", "seq_read_4t", "rand_read", "rand_read_4t", "seq_write", "seq_write_4t")


def job_files() -> dict[str, Path]:
    """The packaged job files by name."""
    root = resources.files("agentvfs.bench") / "fio"
    return {name: Path(str(root / f"{name}.fio")) for name in JOBS}


def _parse(output: str, job: str) -> tuple[int, float]:
    """Bytes moved and seconds from fio's JSON output (reads or writes, by the job)."""
    data = json.loads(output[output.index("{"):])  # fio may print notices before the JSON
    stats = data["jobs"][0]["write" if "write" in job else "read"]
    return int(stats["io_bytes"]), float(stats["runtime"]) / 1e3


def run_jobs(ctx: Context, backend: Backend, layers: list[LayerSpec]) -> None:
    """Run every job file once on every directory layer of ``backend``.

    Once, not once per round: each job is already a time-based run of many operations, as
    mountpoint-s3 runs them; fio's own figure is its throughput over that time.
    """
    if shutil.which("fio") is None:
        ctx.run.skip_once("fio: not installed (apt-get install fio); --fio jobs not run")
        return
    # Directories only: the mounts and local disk (the API layers have nothing to point fio at).
    targets = [s for s in layers if s.mounted or s.name == LOCAL_DISK]
    files = job_files()
    size = min(ctx.size.fio_bytes, ctx.size.io_remote_bytes if backend.remote else ctx.size.fio_bytes)
    env = {**os.environ, "AGENTVFS_FIO_SIZE": str(size), "AGENTVFS_FIO_RUNTIME": f"{ctx.size.fio_runtime}s"}
    ctx.progress.start(f"fio on {backend.name} ({len(JOBS)} jobs, {ctx.size.fio_runtime} s each)",
                       len(targets) * len(JOBS))
    for spec in targets:
        if (backend.name, spec.name) in ctx.harness.broken:
            continue
        for job in JOBS:
            jobs = 4 if job.endswith("_4t") else 1
            label = f"fio {job.removesuffix('_4t').replace('_', ' ')}, {jobs} job{'s' if jobs > 1 else ''}, 256 KiB"
            m = ctx.measurement("io", f"fio_{job}", backend.name, spec.name, label, "MiB/s", 0, jobs=jobs)
            try:
                with spec.open(ctx.harness) as target:
                    d = os.path.join(target.path or "", f"fio-{job}")
                    os.makedirs(d, exist_ok=True)
                    argv = ["fio", "--output-format=json", f"--directory={d}", str(files[job])]
                    limit = 120.0 + 4 * ctx.size.fio_runtime + jobs * size / MiB / 2
                    with target.guard(limit, f"fio {job}"):
                        out = None
                        if "read" in job:
                            # Lay the files out first, untimed, so the timed run starts cold.
                            out = subprocess.run([*argv, "--create_only=1"], env=env, capture_output=True,
                                                 text=True, timeout=limit, check=False)
                            if ctx.cold:
                                drop_caches()
                        if out is None or out.returncode == 0:
                            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=limit,
                                                 check=False)
                    if out.returncode != 0:
                        what = "laying out the files" if "--create_only=1" in out.args else "the job"
                        detail = (out.stderr.strip() or out.stdout.strip())[-300:]
                        m.errors.append(f"fio exited {out.returncode} in {what}: {detail}")
                    else:
                        nbytes, seconds = _parse(out.stdout, job)
                        # amount varies per run (time based): keep bytes per second as the sample
                        # by normalising to 1 MiB moved in `seconds * MiB / nbytes`.
                        m.amount = MiB
                        m.samples.append(seconds * MiB / nbytes if nbytes else float("inf"))
                    shutil.rmtree(d, ignore_errors=True)
            except (MountFailed, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
                m.errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                ctx.progress.log(f"  error: fio {job} on {backend.name} / {spec.name}: {exc}")
            ctx.progress.advance(f"fio {job}: {spec.name}")
