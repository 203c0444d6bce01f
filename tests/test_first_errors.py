"""What a user who got something wrong is told: credentials, endpoints, buckets, options,
roots and missing extras each end in one line naming the cause and the fix, fast.

The credential cases run against a moto server that checks signatures (its IAM knows one
user, who may not list the bucket), the others against the session's moto server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _mountproc import CLI, cli_env
from agentvfs import FsspecFilesystem
from agentvfs.errors import BucketNotFound, StorageAccessError, StorageUnreachableError
from agentvfs.mounts import fuse_available, is_mounted
from agentvfs.testing import MotoServer
from agentvfs.vfs import accepted_storage_options, check_storage_options, filesystem_class

pytestmark = [pytest.mark.s3, pytest.mark.anyio]


@pytest.fixture(scope="module")
def strict_moto() -> Iterator[tuple[MotoServer, dict[str, str]]]:
    """A moto server that authenticates requests once its first three actions are done (the
    bucket, an IAM user and its key), and that user's key."""
    import boto3

    before = os.environ.get("INITIAL_NO_AUTH_ACTION_COUNT")
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
    try:
        server = MotoServer()
        server.start()
    finally:
        if before is None:
            del os.environ["INITIAL_NO_AUTH_ACTION_COUNT"]
        else:
            os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = before
    try:
        server.create_bucket("strict")
        iam = boto3.client(
            "iam", endpoint_url=server.endpoint_url, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        iam.create_user(UserName="agent")
        key = iam.create_access_key(UserName="agent")["AccessKey"]
        yield server, {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    finally:
        server.stop()


async def _probe(url: str, **options: Any) -> None:
    await FsspecFilesystem(url, storage_options={"skip_instance_cache": True, **options}).probe()


async def test_an_unknown_access_key_is_named(strict_moto: tuple[MotoServer, dict[str, str]]) -> None:
    server, _ = strict_moto
    with pytest.raises(StorageAccessError) as info:
        await _probe("s3://strict", endpoint_url=server.endpoint_url, key="AKIANOBODYKNOWS00000", secret="x")
    assert str(info.value) == (
        "Cannot use s3://strict: the server does not know the access key ID (InvalidAccessKeyId); "
        "check AWS_ACCESS_KEY_ID, AWS_PROFILE or the storage option key"
    )
    assert isinstance(info.value, PermissionError) and info.value.code == "EACCES"


async def test_a_wrong_secret_is_named(strict_moto: tuple[MotoServer, dict[str, str]]) -> None:
    server, key = strict_moto
    with pytest.raises(StorageAccessError, match=r"secret key does not match .*SignatureDoesNotMatch.*AWS_SECRET_ACCESS_KEY"):
        await _probe("s3://strict/some/prefix", endpoint_url=server.endpoint_url, key=key["key"], secret="wrong")


async def test_valid_credentials_without_the_permission_to_list(strict_moto: tuple[MotoServer, dict[str, str]]) -> None:
    server, key = strict_moto
    with pytest.raises(StorageAccessError, match=r"may not list it \(AccessDenied\); allow s3:ListBucket"):
        await _probe("s3://strict", endpoint_url=server.endpoint_url, **key)


async def test_no_credentials_at_all(moto: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    # No credentials file either, and no instance metadata service to ask.
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.fspath(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", os.fspath(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StorageAccessError, match=r"^Cannot use s3://agentvfs-test: no credentials were found; set AWS_ACCESS_KEY_ID"):
        await _probe("s3://agentvfs-test", endpoint_url=moto.endpoint_url)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_endpoint_that_is_down_is_reported_at_once() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(StorageUnreachableError) as info:
        await _probe("s3://bucket/prefix", endpoint_url=endpoint, key="k", secret="s")
    assert time.monotonic() - started < 2  # not the client's retries (16.7 s)
    assert str(info.value) == (
        f"Cannot reach {endpoint} for s3://bucket/prefix: connection refused; check endpoint_url (storage "
        "option) and that the server runs and is reachable from here"
    )
    assert isinstance(info.value, ConnectionError) and info.value.errno == 111


async def test_a_missing_bucket_is_a_missing_bucket(moto: MotoServer) -> None:
    with pytest.raises(BucketNotFound) as info:
        await _probe("s3://no-such-bucket-at-all/x", endpoint_url=moto.endpoint_url, key="testing", secret="testing")
    assert str(info.value).startswith("Bucket not found: s3://no-such-bucket-at-all (check the name, the endpoint_url")
    assert isinstance(info.value, FileNotFoundError)


async def test_the_right_credentials_pass(moto: MotoServer) -> None:
    await _probe("s3://agentvfs-test/anything", endpoint_url=moto.endpoint_url, key="testing", secret="testing")


# -- storage options ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options", "expected"),
    [
        ("memory://x", {"metdata_ttl": 5}, r"Unknown storage option 'metdata_ttl' for memory://; MemoryFileSystem takes:"),
        ("file:///tmp", {"auto_mkdr": True}, r"'auto_mkdr' for file:// \(did you mean 'auto_mkdir'\?\)"),
        ("s3://bucket", {"endpoint": "http://x"}, r"'endpoint' for s3:// \(did you mean 'endpoint_url'\?\)"),
        ("gcs://bucket", {"projetc": "p"}, r"'projetc' for gcs:// \(did you mean 'project'\?\)"),
    ],
)
def test_a_mistyped_storage_option_is_refused(url: str, options: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        FsspecFilesystem(url, storage_options=options)


def test_the_options_of_the_known_classes() -> None:
    s3 = accepted_storage_options(filesystem_class("s3"))
    assert s3 is not None and {"key", "secret", "endpoint_url", "anon", "profile", "skip_instance_cache"} <= s3
    local = accepted_storage_options(filesystem_class("file"))
    assert local is not None and "auto_mkdir" in local and "metadata_ttl" not in local
    # A class that may pass keywords on to a library not known here is not checked.
    assert accepted_storage_options(type("Other", (filesystem_class("memory"),), {})) is None
    check_storage_options("s3", {"profile": "dev", "use_listings_cache": False, "client_kwargs": {}})


def test_an_unknown_protocol_is_named() -> None:
    with pytest.raises(ValueError, match=r"Unknown storage protocol 'nosuch': use a URL such as s3://bucket/prefix"):
        FsspecFilesystem("nosuch://x")


# -- the command line --------------------------------------------------------------------


def _cli(*args: str, code: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``agentvfs ARGS``; ``code`` runs first in the same interpreter (to hide a package)."""
    command = [sys.executable, "-c", f"import sys\n{code}\nfrom agentvfs.cli import main; sys.exit(main())", *args]
    return subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=cli_env(), timeout=timeout, check=False
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_mount_refuses_a_root_that_does_not_exist(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    done = _cli("mount", os.fspath(tmp_path / "nope"), os.fspath(tmp_path / "mnt"))
    assert done.returncode == 2
    assert _one_line(done) == (
        f"agentvfs mount: {tmp_path / 'nope'} does not exist; give an existing directory, or --create to make it"
    )
    assert not (tmp_path / "nope").exists()


@pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")
def test_mount_create_makes_the_root(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen(
        [*CLI, "mount", "--create", os.fspath(tmp_path / "new"), os.fspath(mnt)],
        stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(os.fspath(mnt)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_mounted(os.fspath(mnt))
        (mnt / "f.txt").write_text("x")
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert (tmp_path / "new/f.txt").read_text() == "x"


def test_mount_names_a_mistyped_option_and_the_one_meant(tmp_path: Path) -> None:
    done = _cli("mount", "memory://x", os.fspath(tmp_path), "-o", "metdata_ttl=5")
    assert done.returncode == 2
    assert _one_line(done).startswith(
        "agentvfs mount: Unknown storage option 'metdata_ttl' for memory:// (did you mean 'metadata_ttl', a mount option?)"
    )


def test_mount_reports_an_endpoint_that_is_down_in_one_line(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _cli("mount", "s3://bucket", os.fspath(tmp_path), "-o", f"endpoint_url=http://127.0.0.1:{_closed_port()}")
    assert done.returncode == 1 and time.monotonic() - started < 20
    assert "connection refused; check endpoint_url" in _one_line(done)


def test_mcp_refuses_a_root_that_does_not_exist(tmp_path: Path) -> None:
    done = _cli("mcp", "--root", os.fspath(tmp_path / "typo"))
    assert done.returncode == 2 and f"{tmp_path / 'typo'} does not exist" in done.stderr
    done = _cli("mcp", "--url", f"file://{tmp_path}/typo2")
    assert done.returncode == 2 and f"{tmp_path / 'typo2'} does not exist" in done.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "typo2").exists()


def test_a_missing_extra_is_named(tmp_path: Path) -> None:
    done = _cli("mount", "s3://bucket", os.fspath(tmp_path), code="sys.modules['s3fs'] = None")
    assert done.returncode == 1
    assert _one_line(done) == (
        "agentvfs mount: Storage s3:// needs a package that is not installed; pip install 'agentvfs[s3]'"
    )
    # Without the bench extra every other command works, and bench says what to install.
    no_pytest = "sys.modules['pytest'] = None"
    assert _cli("mount", "--help", code=no_pytest).returncode == 0
    done = _cli("bench", "--out", os.fspath(tmp_path / "out"), code=no_pytest)
    assert done.returncode == 1
    assert _one_line(done) == "agentvfs bench: the module 'pytest' is not installed; pip install 'agentvfs[bench]'"
    assert not (tmp_path / "out").exists()


def test_an_unexpected_error_is_one_line_unless_debug(tmp_path: Path) -> None:
    config = tmp_path / "ws.json"
    config.write_text(json.dumps({"root": os.fspath(tmp_path), "tools": 7}))
    done = _cli("mcp", "--config", os.fspath(config))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    boom = "import agentvfs.cli as c; c._recover = lambda args: 1 / 0"
    done = _cli("recover", code=boom)
    assert done.returncode == 1
    assert _one_line(done) == (
        "agentvfs recover: division by zero (ZeroDivisionError; run 'agentvfs --debug ...' for the traceback)"
    )
    done = _cli("--debug", "recover", code=boom)
    assert done.returncode == 1 and "Traceback" in done.stderr and "ZeroDivisionError" in done.stderr
