"""Session-wide emulators (started and stopped by the test session itself) and harnesses."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Mount journals and recovered files of the session's mounts (and of the mount processes
# they start) go to a directory of the test run, not the user's state directory, removed with
# the run.
if "AGENTVFS_STATE_DIR" not in os.environ:
    os.environ["AGENTVFS_STATE_DIR"] = tempfile.mkdtemp(prefix="agentvfs-test-state-")
    atexit.register(shutil.rmtree, os.environ["AGENTVFS_STATE_DIR"], True)

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs.testing import (
    FakeGcsServer,
    Harness,
    MotoServer,
    composite_harness,
    fsspec_harness,
    local_harness,
)


def _share_botocore_data_loader() -> None:
    """One botocore data loader for every session this process makes.

    Each test makes its own S3 clients (a new s3fs, a boto3 client), and each new botocore
    session would read and parse the service models again: about 0.2 s a client, which the
    S3 tests pay hundreds of times. The models are read-only data, which botocore already
    shares between the clients of one session; they are the same for every session here.
    """
    try:
        import botocore.loaders
        import botocore.session
    except ImportError:  # pragma: no cover - the test extras bring botocore
        return
    create = botocore.loaders.create_loader
    loaders: dict[str | None, botocore.loaders.Loader] = {}

    def shared(search_path_string: str | None = None) -> botocore.loaders.Loader:
        if search_path_string not in loaders:
            loaders[search_path_string] = create(search_path_string)
        return loaders[search_path_string]

    botocore.session.create_loader = shared


_share_botocore_data_loader()

S3_BUCKET = "agentvfs-test"
GCS_BUCKET = "agentvfs-test"


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        server.create_bucket(S3_BUCKET)
        yield server


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGcsServer]:
    with FakeGcsServer() as server:
        server.create_bucket(GCS_BUCKET)
        yield server


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def memory_harness() -> Harness:
    raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
    return fsspec_harness(raw, f"/{unique('ws')}", name="memory")


def s3_harness(moto: MotoServer, **options: object) -> Harness:
    raw = moto.s3fs(use_listings_cache=False)
    return fsspec_harness(raw, f"{S3_BUCKET}/{unique('ws')}", name="s3", **options)


def gcs_harness(fake_gcs: FakeGcsServer) -> Harness:
    raw = fake_gcs.gcsfs()
    return fsspec_harness(raw, f"{GCS_BUCKET}/{unique('ws')}", name="gcs")


def file_harness(tmp_path: object) -> Harness:
    from fsspec.implementations.local import LocalFileSystem

    root = os.path.join(str(tmp_path), "root")
    os.makedirs(root)
    return fsspec_harness(LocalFileSystem(), root, name="file")


def harness_for(backend: str, request: pytest.FixtureRequest, tmp_path: object) -> Harness:
    """A fresh harness on ``backend`` (``local``, ``memory``, ``s3`` or ``gcs``)."""
    if backend == "local":
        base = os.path.join(str(tmp_path), "base")
        os.makedirs(base)
        return local_harness(base)
    if backend == "memory":
        return memory_harness()
    if backend == "s3":
        return s3_harness(request.getfixturevalue("moto"))
    return gcs_harness(request.getfixturevalue("fake_gcs"))


#: Parameters for fixtures that run a test on every backend.
BACKENDS = ["local", "memory", pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


__all__ = ["composite_harness", "local_harness"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--oracle-cases",
        type=int,
        default=150,
        help="random cases per seed in tests/test_mastra_oracle.py (default 150; thousands for a deep run)",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the packaging tests' slow preparation (a wheel, an environment with every extra)
    at once when they are selected, so it overlaps the rest of the suite."""
    if session.config.option.collectonly:
        return
    if any(item.nodeid.startswith("tests/test_packaging.py::") for item in session.items):
        import test_packaging

        test_packaging.prepare_in_background()
