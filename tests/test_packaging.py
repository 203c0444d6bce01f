"""The package as a user installs it: ``python -m build`` makes a wheel and an sdist; the
wheel alone (the core) installs into a fresh virtual environment and runs the workspace, the
tools and the sandbox, and names the extra of each part it lacks; the extras bring those
parts. Real ``pip install``s from the configured package index into new environments."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import zipfile
from pathlib import Path

import pytest

from agentvfs.mounts import fuse_available

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _build(out: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", os.fspath(out), os.fspath(ROOT)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


class _Prepared:
    """The wheel, an environment with it alone and one with every extra, made in a thread from the start of the
    session (:func:`prepare_in_background`, called by ``conftest.py`` when these tests are
    selected): ``pip install`` mostly waits on the package index and unpacks, and the rest of
    the suite runs meanwhile. A failure is raised to the test that needs the result."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="agentvfs-packaging-"))
        atexit.register(shutil.rmtree, self.base, True)
        self._done = threading.Event()
        self._dist: Path | None = None
        self._extras: Path | None = None
        self._core: Path | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="agentvfs-packaging-prepare", daemon=True).start()

    def _run(self) -> None:
        try:
            self._dist = _build(self.base / "dist")
            self._core = _venv(self.base / "core", os.fspath(_wheel(self._dist)))
            self._extras = _venv(self.base / "extras", f"{_wheel(self._dist)}[all]")
        except BaseException as exc:  # handed to the test that waits for it
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> tuple[Path, Path]:
        self._done.wait(timeout=1800)
        if self._error is not None:
            raise self._error
        assert self._dist is not None and self._extras is not None, "preparing timed out"
        return self._dist, self._extras

    def core(self) -> Path:
        """The environment with the wheel alone (the core)."""
        self.result()
        assert self._core is not None
        return self._core


_prepared: _Prepared | None = None


def prepare_in_background() -> None:
    """Start making the wheel and the environment with every extra (once per session)."""
    global _prepared
    if _prepared is None:
        _prepared = _Prepared()


@pytest.fixture(scope="module")
def dist() -> Path:
    prepare_in_background()  # a no-op when conftest started it already
    assert _prepared is not None
    return _prepared.result()[0]


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("agentvfs-*.whl")
    return wheel


def _venv(where: Path, *requirements: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", os.fspath(where)], check=True, timeout=300)
    python = where / "bin" / "python"
    done = subprocess.run(
        [os.fspath(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def _run(python: Path, code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(
        [os.fspath(python), "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env, check=False,
    )  # fmt: skip


def test_build_makes_a_wheel_and_an_sdist(dist: Path) -> None:
    wheel = _wheel(dist)
    (sdist,) = dist.glob("agentvfs-*.tar.gz")
    assert sdist.stat().st_size > 0
    names = zipfile.ZipFile(wheel).namelist()
    assert "agentvfs/py.typed" in names and "agentvfs/__main__.py" in names
    assert any(n.startswith("agentvfs/search/data/") for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
    core = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    # The core needs no compiler and no libfuse: none of the heavy parts is required.
    for heavy in ("pyfuse3", "duckdb", "hnswlib", "numpy", "mcp", "trio"):
        assert not any(line.split()[1].startswith(heavy) for line in core), (heavy, core)
    extras = {line.split("== ")[1].strip("'\"") for line in metadata.splitlines() if "extra ==" in line}
    assert {"fuse", "search", "mcp", "s3", "gcs", "azure", "embed", "all", "bench"} <= extras
    assert {"pydantic-ai", "deepagents", "openai-agents", "claude"} <= extras


CORE = """
import asyncio, sys, tempfile
from agentvfs import FsspecFilesystem, LocalFilesystem, LocalSandbox, Workspace
from agentvfs.errors import MissingExtraError

async def main():
    d = tempfile.mkdtemp()
    async with Workspace(filesystem=LocalFilesystem(d), sandbox=LocalSandbox(working_directory=d)) as ws:
        tools = await ws.create_tools()
        print(await tools["mastra_workspace_write_file"].execute({"path": "a.txt", "content": "hello\\n"}))
        print(await tools["mastra_workspace_edit_file"].execute({"path": "a.txt", "old_string": "hello", "new_string": "bye"}))
        print(await tools["mastra_workspace_grep"].execute({"pattern": "bye"}))
        print(await tools["mastra_workspace_execute_command"].execute({"command": "cat a.txt"}))
    memory = FsspecFilesystem("memory://core")
    await memory.write_file("m.txt", "in memory")
    print(await memory.read_file("m.txt", encoding="utf-8"))
    for what in ("mounts", "search"):
        try:
            __import__("agentvfs." + what)
        except MissingExtraError as exc:
            print("missing:", exc)
    try:
        Workspace(filesystem=memory, bm25=True)
    except MissingExtraError as exc:
        print("missing:", exc)

asyncio.run(main())
"""


def test_the_core_installs_alone_and_works(dist: Path, tmp_path: Path) -> None:
    assert _prepared is not None
    python = _prepared.core()
    done = _run(python, CORE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Wrote 6 bytes to a.txt" in out and "Replaced 1 occurrence in a.txt (lines 1)" in out
    assert "./a.txt:1:1: bye" in out and "in memory" in out
    assert "missing: FUSE mounts (agentvfs.mounts): the module 'pyfuse3' is not installed; pip install 'agentvfs[fuse]'" in out
    assert "missing: Search (agentvfs.search): the module 'duckdb' is not installed; pip install 'agentvfs[search]'" in out
    assert "pip install 'agentvfs[search]'" in out.split("missing:")[-1]
    agentvfs = python.parent / "agentvfs"
    version = subprocess.run([agentvfs, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("agentvfs ")
    for command, extra in ((["mount", "memory://x", os.fspath(tmp_path)], "fuse"), (["mcp", "--root", os.fspath(tmp_path)], "mcp")):
        done = subprocess.run([agentvfs, *command], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert f"pip install 'agentvfs[{extra}]'" in done.stderr
    demo = subprocess.run([agentvfs, "demo"], capture_output=True, text=True, timeout=300, check=False)
    assert demo.returncode == 0, demo.stderr
    assert "(skipped: FUSE mounts" in demo.stdout and demo.stdout.rstrip().endswith("demo finished: every step ran as described")


EXTRAS = """
import asyncio, os, subprocess, sys, tempfile
import fsspec
from agentvfs import FsspecFilesystem, Workspace
from agentvfs.mounts import Mount, helper_unavailable_reason
from agentvfs.search import MiniLMEmbedder
import mcp
# The mount's helper library, built at the first import for the libfuse pyfuse3 links.
print("helper:", helper_unavailable_reason() or "built")
for protocol in ("s3", "gcs", "abfs"):  # each storage extra brings its fsspec class
    print(protocol, fsspec.get_filesystem_class(protocol).__name__)
(vector,) = MiniLMEmbedder()(["an offline sentence embedder"])  # the embed extra, no download
print("dimensions:", len(vector))

async def main():
    fs = FsspecFilesystem("memory://extras")
    await fs.write_file("doc.md", "extras bring search")
    async with Workspace(filesystem=fs, bm25=True, auto_index_paths=["."]) as ws:
        print("hits:", [r.id for r in await ws.search("search")])
asyncio.run(main())
if sys.argv[1] == "fuse":
    with tempfile.TemporaryDirectory() as point, Mount(FsspecFilesystem("memory://extras"), point):
        print("mounted:", sorted(os.listdir(point)))
"""


@pytest.fixture(scope="module")
def with_extras(dist: Path) -> Path:
    """A fresh environment with the wheel and all its extras (fuse, search, mcp, s3, gcs, azure,
    embed)."""
    assert _prepared is not None
    return _prepared.result()[1]


def test_the_extras_bring_their_parts(with_extras: Path, tmp_path: Path) -> None:
    python = with_extras
    fuse = "fuse" if fuse_available() is None else "no-fuse"
    done = _run(python, EXTRAS, fuse, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hits: ['doc.md']" in done.stdout
    assert "s3 S3FileSystem" in done.stdout and "abfs AzureBlobFileSystem" in done.stdout
    assert "gcs " in done.stdout and "dimensions: 384" in done.stdout
    if fuse == "fuse":
        assert "mounted: ['doc.md']" in done.stdout
    assert "helper: built" in done.stdout, done.stdout


PASSTHROUGH = """
import os, sys, tempfile
from agentvfs import FsspecFilesystem
from agentvfs.mounts import Mount, passthrough_unavailable_reason
print("reason:", passthrough_unavailable_reason() or "none")
with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as point:
    open(os.path.join(data, "f.txt"), "w").write("on disk")
    with Mount(FsspecFilesystem("file://" + data), point) as m:
        print("read:", open(os.path.join(point, "f.txt")).read())
        print("passthrough:", m.operations.passthrough is not None)
"""


@pytest.mark.skipif(os.geteuid() != 0 or fuse_available() is not None, reason="passthrough needs root and FUSE")
def test_setup_passthrough_for_a_pip_install(with_extras: Path, tmp_path: Path) -> None:
    """A pip install mounts without passthrough; agentvfs setup-passthrough builds libfuse 3.17
    into the environment and rebuilds pyfuse3 against it, and then mounts use it."""
    before = _run(with_extras, PASSTHROUGH, cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    assert "passthrough: False" in before.stdout and "reason: none" not in before.stdout
    done = subprocess.run(
        [os.fspath(with_extras.parent / "agentvfs"), "setup-passthrough"],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FUSE passthrough is set up" in done.stderr
    after = _run(with_extras, PASSTHROUGH, cwd=tmp_path)
    assert after.returncode == 0, after.stderr
    assert "reason: none" in after.stdout and "read: on disk" in after.stdout and "passthrough: True" in after.stdout
    assert (with_extras.parents[1] / "opt/libfuse/lib/libfuse3.so.4").exists()
