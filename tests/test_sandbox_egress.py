"""Network egress by allow-list: the host patterns, the host-side proxy (CONNECT and plain HTTP,
403 refusals; one request per plain connection, under the Host that was checked, its body
framed by the proxy), and real sandboxes where an allowed name is reached through the proxy, others
are refused and a direct connection finds no network."""

from __future__ import annotations

import http.server
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import agentvfs
from agentvfs.sandbox import LocalSandbox
from agentvfs.sandbox._egress import (
    EgressProxy,
    HostPattern,
    _RequestBody,
    host_allowed,
    parse_host_patterns,
)
from agentvfs.sandbox._isolation import detect_isolation, normalize_native_sandbox

pytestmark = pytest.mark.anyio

BWRAP = detect_isolation()
needs_bwrap = pytest.mark.skipif(not BWRAP["available"], reason=f"bubblewrap unusable here: {BWRAP['message']}")


# -- patterns -------------------------------------------------------------------------------------


def test_patterns() -> None:
    patterns = parse_host_patterns(["Example.org", "*.internal", "api.test:8443", "10.0.0.1", "[::1]:443"])
    assert patterns == (
        HostPattern("example.org"),
        HostPattern("internal", wildcard=True),
        HostPattern("api.test", port=8443),
        HostPattern("10.0.0.1"),
        HostPattern("::1", port=443),
    )
    assert patterns is not None
    assert [str(p) for p in patterns] == ["example.org", "*.internal", "api.test:8443", "10.0.0.1", "[::1]:443"]
    assert host_allowed(patterns, "example.org", 443)
    assert host_allowed(patterns, "EXAMPLE.ORG.", 80)
    assert not host_allowed(patterns, "www.example.org", 443)
    assert host_allowed(patterns, "a.b.internal", 80)
    assert not host_allowed(patterns, "internal", 80)
    assert not host_allowed(patterns, "evilinternal", 80)
    assert host_allowed(patterns, "api.test", 8443)
    assert not host_allowed(patterns, "api.test", 443)
    assert host_allowed(patterns, "10.0.0.1", 22)
    assert host_allowed(patterns, "[::1]", 443) and not host_allowed(patterns, "::1", 80)
    assert parse_host_patterns(None) is None
    assert parse_host_patterns([]) == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("example.org", "must be a list of host patterns"),
        (["https://example.org"], "is a URL; give the host only"),
        (["example.org/path"], "is a URL"),
        (["exa mple.org"], "is not a host name"),
        (["example.org:99999"], "invalid port"),
        (["*.10.0.0.1"], "'\\*\\.' does not apply to an address"),
        ([3], "entries must be strings"),
    ],
)
def test_bad_patterns_are_refused_by_name(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_host_patterns(value)


def test_option_conflicts() -> None:
    with pytest.raises(ValueError, match="allow_network=True gives the whole network"):
        normalize_native_sandbox({"allowed_hosts": ["a.test"], "allow_network": True})
    with pytest.raises(ValueError, match="custom bwrap_args replace"):
        normalize_native_sandbox({"allowed_hosts": ["a.test"], "bwrap_args": ["--ro-bind", "/", "/"]})
    with pytest.raises(ValueError, match="needs isolation='bwrap'"):
        LocalSandbox(native_sandbox={"allowed_hosts": ["a.test"]})


# -- the proxy on its own -----------------------------------------------------------------------


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from the host {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def host_server() -> Iterator[tuple[str, int]]:
    """An HTTP server on the host's loopback, and a name of this machine that resolves to it."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        pytest.skip(f"this machine's name {name!r} does not resolve")
    if not address.startswith("127."):
        pytest.skip(f"this machine's name resolves to {address}, not to a loopback address")
    server = http.server.ThreadingHTTPServer((address, 0), _Hello)
    # Polled often, so that shutdown() returns at once rather than after the default 0.5 s.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield name, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(host_server: tuple[str, int]) -> Iterator[EgressProxy]:
    patterns = parse_host_patterns([host_server[0]])
    assert patterns is not None
    egress = EgressProxy(patterns, name="test")
    egress.start()
    yield egress
    egress.close()


def ask(proxy: EgressProxy, request: bytes) -> bytes:
    with proxy.connect() as sock:
        sock.settimeout(10)
        sock.sendall(request)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            if len(chunks) == 1 and chunks[0].startswith(b"HTTP/1.1 200 Connection Established"):
                # The tunnel is open: speak HTTP through it.
                sock.sendall(b"GET /tunnel HTTP/1.0\r\n\r\n")
        return b"".join(chunks)


def test_proxy_plain_http_connect_and_refusals(proxy: EgressProxy, host_server: tuple[str, int]) -> None:
    name, port = host_server
    answer = ask(proxy, f"GET http://{name}:{port}/plain HTTP/1.1\r\nHost: {name}\r\nProxy-Connection: keep-alive\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"hello from the host /plain\n"), answer
    answer = ask(proxy, f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\n")
    assert answer.endswith(b"hello from the host /tunnel\n"), answer
    for request in (
        f"GET http://example.com:{port}/ HTTP/1.1\r\n\r\n",
        "CONNECT example.com:443 HTTP/1.1\r\n\r\n",
        f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n",  # the address is not the allowed name
    ):
        answer = ask(proxy, request.encode())
        assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer
        assert b"are not allowed. Allowed hosts: " + name.encode() in answer
        assert b"native_sandbox['allowed_hosts']" in answer
    assert ask(proxy, b"GET /relative HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert ask(proxy, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400")


# -- plain HTTP: one request, the Host that was checked, a body framed by the proxy --------------


def _done(body: _RequestBody) -> bool:
    # A call, not the attribute: type checkers would keep an earlier assert's narrowing.
    return body.done


def test_request_bodies_are_framed_and_chunks_reencoded() -> None:
    body = _RequestBody(5, chunked=False)
    assert body.feed(b"hel") == b"hel" and not _done(body)
    assert body.feed(b"loGET /next HTTP/1.1\r\n\r\n") == b"lo" and _done(body)
    assert body.feed(b"more") == b""
    assert _RequestBody(0, chunked=False).done
    # Extensions and trailers are dropped; the upstream gets exactly the chunks read.
    raw = b"5 ;name=value\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\nGET /next HTTP/1.1\r\n\r\n"
    canonical = b"5\r\nhello\r\na\r\n0123456789\r\n0\r\n\r\n"
    whole = _RequestBody(0, chunked=True)
    assert whole.feed(raw) == canonical and whole.done
    bytewise = _RequestBody(0, chunked=True)
    assert b"".join(bytewise.feed(raw[i : i + 1]) for i in range(len(raw))) == canonical
    for bad in (b"zz\r\nhello\r\n", b"5\r\nhelloXX0\r\n\r\n", b"5\nhello\r\n", b"0x5\r\nhello\r\n", b"f" * 5000):
        with pytest.raises(ValueError):
            _RequestBody(0, chunked=True).feed(bad)


@pytest.fixture
def raw_upstream() -> Iterator[tuple[int, list[bytes]]]:
    """A server on 127.0.0.1 that records everything a connection sends until its end, then
    answers ``ok``: the exact bytes the proxy forwarded."""
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                received.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept() (closing alone does not)
    server.close()
    thread.join(timeout=5)


def ask_and_close(proxy: EgressProxy, request: bytes) -> bytes:
    """Send ``request``, end the sending side, and read the answer to its end."""
    with proxy.connect() as sock:
        sock.settimeout(10)
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
        return b"".join(chunks)


def test_plain_http_goes_upstream_as_one_request_under_its_checked_host(raw_upstream: tuple[int, list[bytes]]) -> None:
    port, received = raw_upstream
    patterns = parse_host_patterns(["127.0.0.1"])
    assert patterns is not None
    egress = EgressProxy(patterns, name="test")
    egress.start()
    where = f"127.0.0.1:{port}"
    try:
        # The client's Host (any number of them) gives way to the URL's authority, the hop's
        # headers and those the Connection header names go, a pipelined request is dropped.
        answer = ask_and_close(
            egress,
            f"GET http://user:pw@{where}/a?q=1 HTTP/1.1\r\nHost: internal-admin.corp\r\nHOST: other\r\n"
            "Connection: X-Secret, keep-alive\r\nX-Secret: s\r\nProxy-Authorization: p\r\nAccept: */*\r\n\r\n"
            "GET /admin HTTP/1.1\r\nHost: internal-admin.corp\r\n\r\n".encode(),
        )
        assert answer.endswith(b"\r\n\r\nok"), answer
        assert received[-1] == f"GET /a?q=1 HTTP/1.1\r\nHost: {where}\r\nAccept: */*\r\nConnection: close\r\n\r\n".encode()
        # A body by Content-Length, then nothing more.
        ask_and_close(egress, f"POST http://{where}/p HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /x HTTP/1.1\r\n\r\n".encode())
        assert received[-1] == f"POST /p HTTP/1.1\r\nHost: {where}\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc".encode()
        # A chunked body, re-chunked; the request after it dropped.
        ask_and_close(
            egress,
            f"POST http://{where}/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\nGET /x HTTP/1.1\r\n\r\n".encode(),
        )
        assert received[-1] == (
            f"POST /c HTTP/1.1\r\nHost: {where}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n".encode()
        )
        count = len(received)
        for request, reason in (
            (f"POST http://{where}/ HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", b"both Content-Length and Transfer-Encoding"),
            (f"POST http://{where}/ HTTP/1.1\r\nContent-Length: 4, 5\r\n\r\n", b"an invalid Content-Length"),
            (f"POST http://{where}/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", b"last transfer coding must be chunked"),
            (f"GET http://{where}/ HTTP/1.1\r\nX: a\r\n Host: evil\r\n\r\n", b"malformed header line"),
            (f"GET http://{where}/ HTTP/1.1\r\nHost : evil\r\n\r\n", b"malformed header line"),
            (f"GET http://{where}/ HTTP/1.1\r\nX: a\nHost: evil\r\n\r\n", b"control characters"),
            (f"GET http://{where}/ HTTP/1.1\nX: y\r\n\r\n", b"control characters"),
            (f"GET http://{where}/ HTTP/9\r\n\r\n", b"malformed request line"),
        ):
            answer = ask_and_close(egress, request.encode())
            assert answer.startswith(b"HTTP/1.1 400 Bad Request") and reason in answer, (request, answer)
        # A chunked body the proxy cannot frame ends the connection before anything more of it.
        answer = ask_and_close(egress, f"POST http://{where}/bad HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 400 Bad Request") or not answer, answer
        # (Nothing, or the head alone: the bad chunk line may arrive with the head or after it.)
        assert all(not data or data.endswith(b"Connection: close\r\n\r\n") for data in received[count:]), received[count:]
    finally:
        egress.close()


# -- real sandboxes -----------------------------------------------------------------------------


CURL = shutil.which("curl")
GET = "import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().strip())"
DIRECT = (
    "import socket,sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    "    print('connected')\n"
    "except OSError as exc:\n"
    "    print('refused', type(exc).__name__)\n"
)


@needs_bwrap
async def test_allowed_name_is_reached_others_refused_direct_impossible(
    tmp_path: Path, host_server: tuple[str, int]
) -> None:
    name, port = host_server
    (tmp_path / "get.py").write_text(GET)
    (tmp_path / "direct.py").write_text(DIRECT)
    box = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap", native_sandbox={"allowed_hosts": [name]})
    try:
        # Python's urllib honours the proxy variables.
        allowed = await box.execute_command(f"{sys.executable} get.py http://{name}:{port}/py")
        assert (allowed.exit_code, allowed.stdout) == (0, "hello from the host /py\n"), allowed
        refused = await box.execute_command(f"{sys.executable} get.py http://localhost.localdomain:{port}/")
        assert refused.exit_code != 0 and "403" in refused.stderr, refused
        # No route anywhere but the sandbox's own loopback.
        direct = await box.execute_command(f"{sys.executable} direct.py 127.0.0.1 {port}; {sys.executable} direct.py {name} {port}")
        assert direct.stdout.split("\n")[:2] == ["refused ConnectionRefusedError", "refused ConnectionRefusedError"], direct
        if CURL is not None:
            tunnel = await box.execute_command(f"curl -sS --proxytunnel http://{name}:{port}/curl")
            assert tunnel.stdout == "hello from the host /curl\n", tunnel
            blocked = await box.execute_command("curl -sS https://example.com/ ; echo rc=$?")
            assert "rc=56" in blocked.stdout and "403" in blocked.stderr, blocked
            body = await box.execute_command("curl -sS http://example.com/")
            assert "connections to example.com:80 are not allowed" in body.stdout
    finally:
        await box.destroy()
    # The proxy and its socket are gone with the sandbox.
    assert box._launcher.proxy is None


@needs_bwrap
async def test_an_empty_allow_list_refuses_everything(tmp_path: Path, host_server: tuple[str, int]) -> None:
    name, port = host_server
    (tmp_path / "get.py").write_text(GET)
    box = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap", native_sandbox={"allowed_hosts": []})
    try:
        result = await box.execute_command(f"{sys.executable} get.py http://{name}:{port}/")
    finally:
        await box.destroy()
    assert result.exit_code != 0 and "403" in result.stderr
    assert os.path.exists(str(tmp_path))


# -- nothing of the proxy on a path --------------------------------------------------------------


def test_the_proxy_serves_only_unix_stream_sockets_handed_over(raw_upstream: tuple[int, list[bytes]]) -> None:
    port, _received = raw_upstream
    patterns = parse_host_patterns(["127.0.0.1"])
    assert patterns is not None
    egress = EgressProxy(patterns, name="test")
    with pytest.raises(RuntimeError, match="not started"):
        _ = egress.descriptor
    egress.start()
    request = f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode()
    try:
        sandbox_end = socket.socket(fileno=os.dup(egress.descriptor))
        # What a command holding its end may send instead of a connection: an empty message,
        # a pipe, a datagram socket. The proxy serves none of them and goes on.
        sandbox_end.send(b"")
        read_end, write_end = os.pipe()
        datagram, datagram_peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        socket.send_fds(sandbox_end, [b"c"], [read_end, write_end, datagram.fileno()])
        for fd in (read_end, write_end):
            os.close(fd)
        datagram.close()
        datagram_peer.settimeout(1)
        with pytest.raises(TimeoutError):
            datagram_peer.recv(100)
        datagram_peer.close()
        sandbox_end.close()
        assert ask_and_close(egress, request).endswith(b"\r\n\r\nok")
    finally:
        egress.close()
    with pytest.raises(OSError, match="not started"):
        egress.connect()


_HIJACKER = r"""
import os, socket, stat, sys, threading, time
# Look for unix sockets of the other sandbox (its name is in the path), take each over and
# also try to use it: an allow-list that is not this sandbox's.
name, marker, tops = sys.argv[1], sys.argv[2], sys.argv[3:]
found = []
for top in tops:
    for directory, subdirectories, files in os.walk(top):
        if directory.count("/") - top.count("/") >= 4:
            subdirectories[:] = []
        for entry in subdirectories + files:
            path = os.path.join(directory, entry)
            try:
                if name in path and stat.S_ISSOCK(os.lstat(path).st_mode):
                    found.append(path)
            except OSError:
                pass
answer = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nhijacked\n"
servers = []
for path in found:
    try:
        probe = socket.socket(socket.AF_UNIX)
        probe.settimeout(3)
        probe.connect(path)
        probe.sendall(b"CONNECT " + sys.argv[2].encode() + b" HTTP/1.1\r\n\r\n")
        print("used", path, probe.recv(100)[:30])
    except OSError as exc:
        print("could not use", path, exc.errno)
    try:
        os.unlink(path)
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen(8)
        servers.append(server)
        print("took over", path)
    except OSError as exc:
        print("could not take over", path, exc.errno)
def serve(server):
    while True:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(answer)
        conn.close()
for server in servers:
    threading.Thread(target=serve, args=(server,), daemon=True).start()
print("found", len(found), flush=True)
open("ready", "w").close()
time.sleep(60)
"""


@needs_bwrap
@pytest.mark.parametrize("shared", ["read_write_paths", "working_directory"])
async def test_another_sandbox_cannot_reach_the_egress_proxy(
    tmp_path: Path, host_server: tuple[str, int], shared: str
) -> None:
    name, port = host_server
    temporary = tempfile.gettempdir()
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    (victim_dir / "get.py").write_text(GET)
    victim = LocalSandbox(
        id=f"egress-victim-{os.getpid()}-{secrets.token_hex(4)}",
        working_directory=str(victim_dir),
        isolation="bwrap",
        native_sandbox={"allowed_hosts": [name]},
    )
    # The attacker writes the temporary directory, given as a writable path or as its own
    # working directory, where the victim's state used to be kept.
    if shared == "read_write_paths":
        attacker_dir = tmp_path / "attacker"
        attacker_dir.mkdir()
        attacker = LocalSandbox(
            working_directory=str(attacker_dir), isolation="bwrap", native_sandbox={"read_write_paths": [temporary]}
        )
    else:
        attacker_dir = Path(tempfile.mkdtemp(prefix="agentvfs-attacker-"))
        attacker = LocalSandbox(working_directory=temporary, isolation="bwrap")
    (attacker_dir / "hijack.py").write_text(_HIJACKER)
    try:
        first = await victim.execute_command("true")
        assert first.exit_code == 0, first
        hijack = await attacker.processes.spawn(
            f"cd {attacker_dir} && {sys.executable} hijack.py {victim.id} {name}:{port} {temporary} /run /var/tmp"
        )
        for _ in range(600):
            if (attacker_dir / "ready").exists():
                break
            await anyio.sleep(0.05)
        assert (attacker_dir / "ready").exists(), await hijack.wait()
        result = await victim.execute_command(f"{sys.executable} get.py http://{name}:{port}/victim")
        await hijack.kill()
        report = (await hijack.wait()).stdout
    finally:
        await attacker.destroy()
        await victim.destroy()
        if shared == "working_directory":
            shutil.rmtree(attacker_dir, ignore_errors=True)
    assert "found 0" in report, report
    assert (result.exit_code, result.stdout) == (0, "hello from the host /victim\n"), (result, report)


# -- the forwarder's interpreter ---------------------------------------------------------------

_FORWARDED = r"""
import sys
import anyio
from agentvfs.sandbox import LocalSandbox

async def main() -> None:
    box = LocalSandbox(working_directory=sys.argv[1], isolation="bwrap", native_sandbox={"allowed_hosts": ["example.invalid"]})
    try:
        result = await box.execute_command(sys.executable + " -c 'print(6 * 7)'")
    finally:
        await box.destroy()
    print("exit", result.exit_code, "out", result.stdout.strip(), "err", result.stderr.strip()[-300:])

anyio.run(main)
"""


@needs_bwrap
@pytest.mark.parametrize("how", ["linked-venv", "linked-python", "shim"])
def test_egress_works_whatever_names_the_interpreter(tmp_path: Path, how: str) -> None:
    # Each way names the interpreter by a path in a directory the sandbox does not bind (the
    # temporary directory is not the sandbox's /tmp): a virtualenv reached through a
    # symlinked directory, a symlinked python, a shim found on PATH that runs the real one.
    outside = Path(tempfile.mkdtemp(prefix="agentvfs-python-"))
    real = os.path.realpath(sys.executable)
    # The same modules whichever interpreter starts (a shim runs the base one, outside any
    # virtualenv).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(agentvfs.__file__).parent.parent), *filter(None, sys.path)])}
    try:
        if how == "linked-venv":
            (outside / "venv").symlink_to(os.path.realpath(sys.prefix))
            argv = [str(outside / "venv" / os.path.relpath(sys.executable, sys.prefix))]
        elif how == "linked-python":
            (outside / "python").symlink_to(sys.executable)
            argv = [str(outside / "python")]
        else:
            bash = shutil.which("bash")
            if bash is None:
                pytest.skip("the shim needs bash (exec -a)")
            (outside / "python").write_text(f'#!{bash}\nexec -a python {real} "$@"\n')
            (outside / "python").chmod(0o755)
            env["PATH"] = f"{outside}:{env.get('PATH', os.defpath)}"
            argv = ["python"]
        (tmp_path / "run.py").write_text(_FORWARDED)
        shown = subprocess.run(
            [*argv, "-c", "import sys; print(sys.executable)"], env=env, capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
        assert shown.startswith(str(outside)), shown  # the interpreter is named from outside
        done = subprocess.run(
            [*argv, str(tmp_path / "run.py"), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        shutil.rmtree(outside, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("exit 0 out 42"), (done.stdout, done.stderr)
