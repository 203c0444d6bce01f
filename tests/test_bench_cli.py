"""``agentvfs bench`` end to end on the tiny size: output files, peers, servers, bad input, Ctrl-C.

These run the real command in a subprocess (real mounts, real s3rver and fake-gcs-server, real
peers where installed) and check what it leaves behind; they assert on structure and
correctness, never on speed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentvfs.bench._backends import find_s3rver
from agentvfs.bench._model import RunResult
from agentvfs.mounts import Mount, fuse_available, is_mounted
from agentvfs.testing import MotoServer
from conftest import S3_BUCKET

FUSE = fuse_available()
needs_fuse = pytest.mark.skipif(FUSE is not None, reason=f"FUSE unavailable: {FUSE}")
EXE = [str(Path(sys.executable).parent / "agentvfs")] if (Path(sys.executable).parent / "agentvfs").exists() else [
    sys.executable, "-m", "agentvfs.cli"]  # fmt: skip
TINY = ["--size", "tiny", "--repeat", "1", "--warmup", "0", "--quiet"]


def bench(*args: str | Path, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, "bench", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)  # fmt: skip


def mounts_under(path: Path) -> list[str]:
    root = str(path.resolve())
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(root)]


def load(out: Path) -> RunResult:
    return RunResult.from_json(json.loads((out / "results.json").read_text()))


def by_layer(run: RunResult, backend: str, layer: str) -> list[Any]:
    return [m for m in run.measurements if m.backend == backend and m.layer == layer]


@needs_fuse
def test_peers_on_memory_and_local_write_report_plots_and_json(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    res = bench("io", "metadata", "--backend", "memory", "--backend", "local", "--peers", *TINY, "--out", out,
                "--workdir", work, "--json")
    assert res.returncode == 0, res.stderr
    printed = json.loads(res.stdout)
    run = load(out)
    assert printed["measurements"] == run.to_json()["measurements"]
    assert not run.partial
    assert run.command.startswith("agentvfs bench io metadata")
    assert run.machine["cores"] == str(os.cpu_count())
    for backend in ("memory", "local"):
        for layer in ("direct", "agentvfs", "local disk"):
            ms = by_layer(run, backend, layer)
            cases = {m.case for m in ms}
            assert {"seq_read_cold", "seq_read_warm", "rand_read", "seq_write", "rand_write", "create", "ls_cold",
                    "stat", "unlink"} <= cases, (backend, layer, cases)
            for m in ms:
                assert not m.errors, (backend, layer, m.case, m.errors)
                assert m.skipped or len(m.samples) == 1, (backend, layer, m.case)
            assert all((m.median() or 0) > 0 for m in ms if m.unit == "MiB/s")
        metadata = {m.params.get("entries") for m in by_layer(run, backend, "agentvfs") if m.suite == "metadata"}
        assert metadata == {10, 100}
    assert next(m for m in by_layer(run, "memory", "agentvfs") if m.case == "rand_read").latencies
    # Peers: each either ran or is named with its reason.
    for peer in ("fsspec.fuse", "rclone"):
        ran = bool(by_layer(run, "local", peer))
        assert ran or any(s.startswith(f"{peer}:") for s in run.skipped), peer
    assert any(s.startswith("s3fs-fuse:") for s in run.skipped)
    report = (out / "report.md").read_text()
    assert "# agentvfs bench" in report and "PARTIAL" not in report
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "io_throughput.png" in pngs and "metadata_scaling.png" in pngs
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert mounts_under(work) == []
    assert list(work.iterdir()) == []  # the run's scratch directory is gone


@needs_fuse
@pytest.mark.s3
@pytest.mark.gcs
@pytest.mark.skipif(find_s3rver() is None, reason="s3rver not installed (scripts/setup.sh installs it)")
def test_s3rver_and_gcs_emulator_started_and_stopped(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    res = bench("io", "metadata", "--backend", "s3", "--backend", "gcs", *TINY, "--out", out, "--workdir", work)
    assert res.returncode == 0, res.stderr
    run = load(out)
    assert "s3rver" in run.machine["s3 backend"] and "fake-gcs-server" in run.machine["gcs backend"]
    for backend in ("s3", "gcs"):
        for layer in ("direct", "agentvfs"):
            ms = by_layer(run, backend, layer)
            assert ms and all(not m.errors for m in ms), [(m.case, m.errors) for m in ms if m.errors]
        vis = [m for m in by_layer(run, backend, "agentvfs") if m.case == "seq_write_visible"]
        assert vis and vis[0].samples
    assert mounts_under(work) == []
    # No server outlives the run: nothing holds files under the scratch directory.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(work) not in ps


@needs_fuse
@pytest.mark.s3
def test_endpoint_runs_on_an_existing_server_and_removes_its_prefix(tmp_path: Path, moto: MotoServer) -> None:
    out = tmp_path / "out"
    res = bench("io", "--backend", "s3", "--endpoint", moto.endpoint_url, "--key", "testing", "--secret", "testing",
                "--bucket", S3_BUCKET, *TINY, "--out", out)
    assert res.returncode == 0, res.stderr
    run = load(out)
    assert all(not m.errors for m in by_layer(run, "s3", "agentvfs"))
    assert f"S3 at {moto.endpoint_url}" in run.machine["s3 backend"]
    fs = moto.s3fs(use_listings_cache=False)
    assert [p for p in fs.ls(S3_BUCKET) if "agentvfs-bench-" in p] == []


@needs_fuse
def test_fio_jobs_run_on_each_directory_layer(tmp_path: Path) -> None:
    if shutil.which("fio") is None:
        pytest.skip("fio not installed (scripts/setup.sh installs it)")
    out = tmp_path / "out"
    res = bench("io", "--backend", "local", "--fio", *TINY, "--out", out)
    assert res.returncode == 0, res.stderr
    run = load(out)
    fio = [m for m in run.measurements if m.case.startswith("fio_")]
    assert {m.case for m in fio} == {f"fio_{j}" for j in
                                     ("seq_read", "seq_read_4t", "rand_read", "rand_read_4t", "seq_write", "seq_write_4t")}
    assert {m.layer for m in fio} == {"agentvfs"}
    for m in fio:
        assert not m.errors and (m.median() or 0) > 0, (m.case, m.errors)
        assert m.params["jobs"] in (1, 4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bogus"], "unknown suite 'bogus'"),
        (["--backend", "ftp"], "unknown backend 'ftp'"),
        (["--repeat", "0"], "must be at least 1"),
        (["--backend", "s3", "--backend", "gcs", "--endpoint", "http://127.0.0.1:9"], "exactly one of"),
        (["--cranfield", "/nonexistent"], "no cran.all.1400"),
    ],
)
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    res = bench(*args, timeout=60)
    assert res.returncode == 2
    assert message in res.stderr


def test_refused_endpoint_is_reported_before_anything_runs(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        res = bench("io", "--backend", "s3", "--endpoint", f"http://127.0.0.1:{port}", "--out", tmp_path / "o",
                    timeout=60)
    assert res.returncode == 2
    assert f"--endpoint http://127.0.0.1:{port}: cannot connect" in res.stderr
    assert not (tmp_path / "o").exists()


def test_out_directory_must_be_new(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("keep me")
    res = bench("sandbox", *TINY, "--out", tmp_path, timeout=60)
    assert res.returncode == 2 and "is not empty" in res.stderr
    assert (tmp_path / "old.txt").read_text() == "keep me"


@needs_fuse
def test_busy_mount_point_as_workdir_is_refused(tmp_path: Path) -> None:
    from agentvfs import FsspecFilesystem

    busy = tmp_path / "busy"
    busy.mkdir()
    with Mount(FsspecFilesystem("memory://agentvfs-bench-busy"), str(busy)):
        res = bench("io", *TINY, "--workdir", busy, "--out", tmp_path / "o", timeout=60)
        assert is_mounted(str(busy))
    assert res.returncode == 2
    assert f"--workdir {busy} is a mount point in use" in res.stderr


@needs_fuse
def test_ctrl_c_unmounts_stops_servers_and_keeps_partial_results(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen([*EXE, "bench", "io", "metadata", "--backend", "local", "--size", "small",
                             "--repeat", "9", "--out", str(out), "--workdir", str(work)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        # Interrupt while our mount is up: the hardest moment to leave things clean.
        while not any("agentvfs" in m for m in mounts_under(work)):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no mount appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    run = load(out)
    assert run.partial and run.partial_reason and run.partial_reason.startswith("interrupted")
    assert "the io suite" in run.partial_reason
    assert run.measurements  # what was measured before the interrupt is kept
    assert "PARTIAL" in (out / "report.md").read_text()
    assert mounts_under(work) == []
    assert list(work.iterdir()) == []


def test_regenerate_rewrites_report_and_results_md(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = bench("sandbox", *TINY, "--out", out, timeout=300)
    assert res.returncode == 0, res.stderr
    (out / "report.md").unlink()
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Results\n\nhand-written notes\n")
    res = bench("--regenerate", out, "--results-md", results_md, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (out / "report.md").exists()
    text = results_md.read_text()
    assert "hand-written notes" in text and "<!-- agentvfs bench: begin -->" in text
    res = bench("--regenerate", tmp_path / "nothing", timeout=60)
    assert res.returncode == 2 and "no results.json" in res.stderr
