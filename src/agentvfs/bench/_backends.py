"""Storage backends of a run, and the servers started for them.

``s3`` is served by s3rver (npm) started here, whose ranged reads stream from files; moto,
right for functional tests, slices the whole object in Python for each ranged GET and caps
every mount near 50 MiB/s, so it is only used when asked (``--s3-server moto``). ``gcs`` is
served by fake-gcs-server. With ``--endpoint`` nothing is started: the run uses that server
(and its credentials) under a fresh prefix it removes afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..testing import EmulatorProcess, FakeGcsServer, MotoServer
from ._args import BACKENDS

__all__ = ["BACKENDS", "Backend", "BenchError", "S3rverServer", "check_endpoint", "find_s3rver"]

BUCKET = "agentvfs-bench"
S3RVER_CREDENTIALS = ("S3RVER", "S3RVER")  # s3rver accepts only its fixed key pair
S3RVER_VERSION = "3.7.1"
MARKER = ".agentvfs-bench"


class BenchError(Exception):
    """Bad input or an environment the run cannot work in; the message says which."""


@dataclass
class Backend:
    """One storage backend: an fsspec protocol, a root inside it and how to reach it.

    ``options`` are the fsspec storage options (endpoint and credentials included); ``server``
    says what serves it, for the report.
    """

    name: str
    protocol: str
    root: str
    options: dict[str, Any] = field(default_factory=dict)
    server: str = "in this process"
    endpoint: str | None = None
    key: str | None = None
    secret: str | None = None
    bucket: str | None = None

    @property
    def remote(self) -> bool:
        return self.name in ("s3", "gcs")

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.root.lstrip('/') if self.protocol != 'file' else self.root}"

    def filesystem(self) -> Any:
        """A fresh fsspec filesystem instance: no instance cache, no listing cache."""
        import fsspec

        extra: dict[str, Any] = {"skip_instance_cache": True}
        if self.protocol in ("s3", "gcs"):
            extra["use_listings_cache"] = False
        return fsspec.filesystem(self.protocol, **{**self.options, **extra})

    def cli_options(self) -> list[str]:
        """The storage options as ``-o key=value`` arguments of ``agentvfs mount``."""
        out: list[str] = []
        for k, v in self.options.items():
            out += ["-o", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
        return out


def find_s3rver() -> str | None:
    """The s3rver executable: ``$S3RVER``, ``scripts/setup.sh bench``'s copy in the venv, PATH."""
    for cand in (
        os.environ.get("S3RVER"),
        str(Path(sys.prefix) / "opt" / "s3rver" / "node_modules" / ".bin" / "s3rver"),
        shutil.which("s3rver"),
    ):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


class S3rverServer(EmulatorProcess):
    """s3rver (npm) on 127.0.0.1 with one bucket, storing objects as files in ``data_dir``."""

    _label = "s3rver"
    _ready_path = "/"

    def __init__(self, exe: str, data_dir: str, bucket: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._exe, self._data, self._bucket = exe, data_dir, bucket

    def _command(self, port: int) -> list[str]:
        return [self._exe, "-d", self._data, "-p", str(port), "-a", "127.0.0.1", "--silent",
                "--configure-bucket", self._bucket]  # fmt: skip

    def start(self) -> Any:
        # s3rver 3.7.1 signs ListObjectsV2 continuation tokens with DES, which the OpenSSL 3 of
        # Node >= 17 refuses (HTTP 500 on every truncated listing) without the legacy provider.
        old = os.environ.get("NODE_OPTIONS")
        os.environ["NODE_OPTIONS"] = f"{old or ''} --openssl-legacy-provider".strip()
        try:
            return super().start()
        finally:
            if old is None:
                os.environ.pop("NODE_OPTIONS", None)
            else:
                os.environ["NODE_OPTIONS"] = old


def check_endpoint(url: str) -> None:
    """Fail fast, naming the endpoint, when nothing accepts connections there."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"--endpoint {url!r}: expected http://host:port or https://host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=5):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise BenchError(f"--endpoint {url}: cannot connect to {parts.hostname}:{port} ({reason})") from exc


class BackendSet:
    """Builds the backends of a run and owns the servers started for them (``close`` stops them)."""

    def __init__(self, workdir: Path, *, endpoint: str | None = None, key: str | None = None,
                 secret: str | None = None, bucket: str | None = None, s3_server: str = "s3rver") -> None:
        self.workdir = workdir
        self.endpoint = endpoint
        self.key, self.secret = key, secret
        self.bucket = bucket
        self.s3_server = s3_server
        self._servers: list[EmulatorProcess] = []
        self._cleanup: list[Backend] = []
        self.run_id = uuid.uuid4().hex[:8]

    def open(self, name: str) -> Backend:
        if name == "memory":
            return Backend("memory", "memory", f"/agentvfs-bench-{self.run_id}")
        if name == "local":
            root = self.workdir / "local-backend"
            root.mkdir(parents=True, exist_ok=True)
            return Backend("local", "file", str(root), server="local disk")
        if name in ("s3", "gcs"):
            b = self._s3() if name == "s3" else self._gcs()
            # An object at the root makes the prefix exist for every layer: a mounter that
            # stats its root first (fsspec.fuse) cannot mount an empty prefix of a bucket.
            b.filesystem().pipe_file(f"{b.root}/{MARKER}", b"agentvfs bench run\n")
            return b
        raise BenchError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")

    def _track(self, server: EmulatorProcess) -> None:
        self._servers.append(server)
        server.start()

    def _s3(self) -> Backend:
        if self.endpoint is not None:
            key = self.key or os.environ.get("AWS_ACCESS_KEY_ID")
            secret = self.secret or os.environ.get("AWS_SECRET_ACCESS_KEY")
            bucket = self.bucket or BUCKET
            opts = {"endpoint_url": self.endpoint, **({"key": key, "secret": secret} if key else {})}
            b = Backend("s3", "s3", f"{bucket}/agentvfs-bench-{self.run_id}", opts, f"S3 at {self.endpoint}",
                        self.endpoint, key, secret, bucket)
            self._probe(b)
            self._cleanup.append(b)
            return b
        if self.s3_server == "moto":
            server: EmulatorProcess = MotoServer(log_path=self.workdir / "moto.log")
            self._track(server)
            assert isinstance(server, MotoServer)
            server.create_bucket(BUCKET)
            key, secret = "testing", "testing"
            what = "moto (ranged reads are bound near 50 MiB/s by the server)"
        else:
            exe = find_s3rver()
            if exe is None:
                raise BenchError(
                    "the s3 backend needs s3rver: run `scripts/setup.sh bench` (or `npm install "
                    f"s3rver@{S3RVER_VERSION}` and set S3RVER to its executable), pass --s3-server moto, "
                    "or --endpoint URL for an existing S3 server")
            data = self.workdir / "s3rver-data"
            data.mkdir(parents=True, exist_ok=True)
            server = S3rverServer(exe, str(data), BUCKET, log_path=self.workdir / "s3rver.log")
            self._track(server)
            key, secret = S3RVER_CREDENTIALS
            what = f"s3rver {_npm_version(exe)}"
        endpoint = server.endpoint_url
        opts = {"endpoint_url": endpoint, "key": key, "secret": secret}
        return Backend("s3", "s3", f"{BUCKET}/run-{self.run_id}", opts, f"{what} on {endpoint}", endpoint, key,
                       secret, BUCKET)

    def _gcs(self) -> Backend:
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        if self.endpoint is not None:
            bucket = self.bucket or BUCKET
            opts: dict[str, Any] = {"endpoint_url": self.endpoint, "token": "anon"}
            b = Backend("gcs", "gcs", f"{bucket}/agentvfs-bench-{self.run_id}", opts, f"GCS at {self.endpoint}",
                        self.endpoint, bucket=bucket)
            self._probe(b)
            self._cleanup.append(b)
            return b
        server = FakeGcsServer(log_path=self.workdir / "fake-gcs.log")
        self._track(server)
        server.create_bucket(BUCKET)
        opts = {"endpoint_url": server.endpoint_url, "token": "anon", "project": "test"}
        return Backend("gcs", "gcs", f"{BUCKET}/run-{self.run_id}", opts,
                       f"fake-gcs-server on {server.endpoint_url}", server.endpoint_url, bucket=BUCKET)

    def _probe(self, b: Backend) -> None:
        """A small write, read and delete under the run's prefix, so bad credentials or a
        missing bucket fail now with the server's words, not halfway through a suite."""
        fs = b.filesystem()
        probe = f"{b.root}/.probe"
        try:
            fs.pipe_file(probe, b"agentvfs bench probe")
            fs.cat_file(probe)
            fs.rm_file(probe)
        except Exception as exc:
            raise BenchError(f"{b.name} at {b.endpoint}: cannot write and read {probe}: {type(exc).__name__}: {exc}") from exc

    def close(self) -> list[str]:
        """Remove what the run wrote on external servers, stop the servers; returns problems."""
        problems: list[str] = []
        for b in self._cleanup:
            try:
                b.filesystem().rm(b.root, recursive=True)
            except FileNotFoundError:
                pass
            except Exception as exc:
                problems.append(f"could not remove {b.url} from {b.endpoint}: {exc}")
        for server in reversed(self._servers):
            with contextlib.suppress(Exception):
                server.stop()
        self._servers.clear()
        return problems


def _npm_version(exe: str) -> str:
    pkg = Path(exe).resolve().parent.parent / "package.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads(pkg.read_text())["version"])
    return "(version unknown)"
