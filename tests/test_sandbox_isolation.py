"""Bubblewrap isolation: the command line, option checks, detection, and real isolated commands
(no writes outside the working directory, no network, no host environment or processes)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from _procs import live_members, read, write
from agentvfs import LocalFilesystem
from agentvfs.errors import IsolationUnavailableError
from agentvfs.sandbox import _isolation
from agentvfs.sandbox._egress import FORWARDER_SCRIPT
from agentvfs.sandbox._isolation import (
    build_bwrap_args,
    check_isolation,
    detect_isolation,
    device_args,
    normalize_native_sandbox,
)
from agentvfs.sandbox._local import LocalSandbox

pytestmark = pytest.mark.anyio

BWRAP = detect_isolation()
needs_bwrap = pytest.mark.skipif(
    not BWRAP["available"], reason=f"bubblewrap unusable here: {BWRAP['message']}"
)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def wd(tmp_path: Any) -> str:
    path = os.path.join(str(tmp_path), "wd")
    os.makedirs(path)
    return path





# -- the command line ---------------------------------------------------------------------------


def pairs(args: list[str], flag: str) -> list[str]:
    """The first argument after every ``flag``."""
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_default_command_line() -> None:
    config = normalize_native_sandbox(None)
    args = build_bwrap_args(
        "echo hi", working_directory="/w", config=config, bwrap="/usr/bin/bwrap"
    )
    assert args[0] == "/usr/bin/bwrap"
    assert args[-4:] == ["--", "sh", "-c", "echo hi"]
    # Privilege goes first: an unprivileged user of its own, no capabilities, no nested
    # user namespaces, a session of its own, death with this process.
    uid, gid = (1000, 1000) if os.getuid() == 0 else (os.getuid(), os.getgid())
    assert args[1:7] == ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--disable-userns"]
    assert args[7:11] == ["--cap-drop", "ALL", "--new-session", "--die-with-parent"]
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try"):
        assert flag in args
    for flag, value in (
        ("--proc", "/proc"),
        ("--dev", "/dev"),
        ("--chdir", "/w"),
    ):
        assert pairs(args, flag) == [value]
    assert {"/usr", "/lib", "/bin", "/etc/resolv.conf", "/etc/passwd", "/opt", "/snap"} <= set(
        pairs(args, "--ro-bind-try")
    )
    assert pairs(args, "--bind") == ["/w"]
    assert "--die-with-parent" in args
    assert "--seccomp" not in args  # only with a descriptor
    assert "--dev-bind" not in args  # /dev is bubblewrap's minimal one (no nodes of our own given)
    # /proc: the machine's parts bound read-only from the host's /proc right after it is
    # mounted, then the whole of it read-only.
    proc = args.index("--proc")
    covers = [args[i + 1 : i + 3] for i, a in enumerate(args) if a == "--ro-bind-try" and args[i + 2].startswith("/proc/")]
    assert covers[:5] == [[f"/proc/{n}", f"/proc/{n}"] for n in ("sys", "sysrq-trigger", "irq", "bus", "fs")]
    assert all(args.index(cover[0]) > proc for cover in covers)
    tls_keys = os.path.isdir("/etc/ssl/private")
    assert pairs(args, "--remount-ro") == ["/proc", *(["/etc/ssl/private"] if tls_keys else []), "/"]
    assert args.index("--remount-ro") < args.index("--dev")
    # The host's TLS keys (bound with /etc/ssl) under an empty read-only directory.
    assert pairs(args, "--tmpfs") == ["/tmp", *(["/etc/ssl/private"] if tls_keys else [])]
    # The root is made read-only after every bind, just before the command.
    assert len(args) - 1 - args[::-1].index("--remount-ro") > max(
        i for i, a in enumerate(args) if a in ("--bind", "--ro-bind", "--ro-bind-try")
    )
    # This Python's install is visible (like the reference binds Node's directory).
    ro = pairs(args, "--ro-bind")
    assert os.path.realpath(sys.base_prefix) in ro or os.path.realpath(sys.base_prefix).startswith(
        "/usr"
    )


def test_proc_covers_and_devices_of_our_own() -> None:
    config = normalize_native_sandbox(None)
    devices = {"null": "/state/dev/null", "tty": "/state/dev/tty"}
    args = build_bwrap_args("x", working_directory="/w", config=config, devices=devices)
    # Bound over bubblewrap's binds of the host's nodes, right after --dev.
    dev = args.index("--dev")
    assert args[dev + 2 : dev + 8] == ["--dev-bind", "/state/dev/null", "/dev/null", "--dev-bind", "/state/dev/tty", "/dev/tty"]
    # Root-only files of /proc are covered when the sandbox's user is the host's root.
    root = _isolation.proc_args("/proc", host_root=True)
    masked = [root[i + 2] for i, a in enumerate(root) if a == "--ro-bind" and root[i + 1] == "/dev/null"]
    for path in masked:
        info = os.lstat(path)
        assert info.st_uid == 0 and not info.st_mode & 0o044, path
    assert "--ro-bind" not in _isolation.proc_args("/proc", host_root=False)
    # A custom layout's --proc and --dev get the same covers, after its own arguments.
    custom = normalize_native_sandbox({"bwrap_args": ["--ro-bind", "/", "/", "--proc", "/p", "--dev", "/d"]})
    args = build_bwrap_args("x", working_directory="/w", config=custom, devices=devices)
    tail = args[args.index("/d") + 1 : args.index("--")]
    assert tail[:3] == ["--ro-bind-try", "/proc/sys", "/p/sys"]
    assert tail[-8:] == ["--remount-ro", "/p", *device_args(devices, "/d")]


def test_command_line_options() -> None:
    config = normalize_native_sandbox(
        {
            "allow_network": True,
            "read_only": True,
            "read_only_paths": ["/data/ro"],
            "read_write_paths": ["/data/rw"],
            "allow_system_binaries": False,
        }
    )
    args = build_bwrap_args(
        "x",
        working_directory="/w",
        config=config,
        cwd="/w/sub",
        binds=[("/m/rw", True), ("/m/ro", False)],
    )
    assert "--unshare-net" not in args
    # (/dev/null covers the root-only files of /proc when this process is root.)
    assert [p for p in pairs(args, "--ro-bind") if p != "/dev/null"] == ["/data/ro", "/w", "/m/ro"]
    assert pairs(args, "--bind") == ["/data/rw", "/m/rw"]
    assert pairs(args, "--chdir") == ["/w/sub"]
    assert "/opt" not in pairs(args, "--ro-bind-try")


def test_custom_bwrap_args_replace_the_layout_but_not_the_hardening() -> None:
    config = normalize_native_sandbox({"bwrap_args": ["--ro-bind", "/", "/"]})
    args = build_bwrap_args("echo hi", working_directory="/w", config=config, seccomp_fd=7)
    assert args == [
        "bwrap", "--cap-drop", "ALL", "--new-session", "--die-with-parent", "--seccomp", "7",
        "--ro-bind", "/", "/", "--", "sh", "-c", "echo hi",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="--add-seccomp-fd"):
        normalize_native_sandbox({"bwrap_args": ["--seccomp", "3"]})


def test_hardening_descriptors_root_inside_and_protected_paths() -> None:
    config = normalize_native_sandbox({"run_as_root": True, "read_write_paths": ["/tmp"]})
    args = build_bwrap_args(
        "x", working_directory="/w", config=config, seccomp_fd=5, info_fd=6, block_fd=7,
        protect=["/tmp/.state"],
    )  # fmt: skip
    assert args[1:6] == ["--unshare-user", "--uid", "0", "--gid", "0"]
    assert pairs(args, "--seccomp") == ["5"]
    assert (pairs(args, "--info-fd"), pairs(args, "--block-fd")) == (["6"], ["7"])
    # The protected state is bound read-only after the writable binds that cover it.
    assert args.index("/tmp/.state") > args.index("/tmp")
    assert pairs(args, "--ro-bind-try")[-1] == "/tmp/.state"


def _at(args: list[str], part: list[str]) -> int:
    """Where ``part`` starts in ``args`` (-1 when it is not there)."""
    return next((i for i in range(len(args)) if args[i : i + len(part)] == part), -1)


def test_hidden_state_is_covered_wherever_a_bind_shows_it(tmp_path: Any) -> None:
    state = os.path.join(str(tmp_path), "state")
    os.makedirs(os.path.join(state, "inner"))
    cover = ["--tmpfs", state, "--remount-ro", state]
    # Below a writable path, the working directory, a read-only path, or the whole host: an
    # empty read-only directory over it, after every bind.
    for options, workdir in (
        ({"read_write_paths": [str(tmp_path)]}, "/w"),
        ({}, str(tmp_path)),
        ({"read_only_paths": [str(tmp_path)]}, "/w"),
        ({"read_write_paths": ["/"]}, "/w"),
    ):
        args = build_bwrap_args("x", working_directory=workdir, config=normalize_native_sandbox(options), hidden=[state])
        where = _at(args, cover)
        assert where > max(i for i, a in enumerate(args) if a in ("--bind", "--ro-bind", "--ro-bind-try")), options
    # Seen nowhere, or not there at all: nothing to cover.
    assert _at(build_bwrap_args("x", working_directory="/w", config=normalize_native_sandbox(None), hidden=[state]), cover) < 0
    gone = os.path.join(str(tmp_path), "gone")
    args = build_bwrap_args("x", working_directory=str(tmp_path), config=normalize_native_sandbox(None), hidden=[gone])
    assert gone not in args
    # Custom binds too, where they show it (also under another name).
    custom = normalize_native_sandbox({"bwrap_args": ["--bind", "/", "/", "--ro-bind", str(tmp_path), "/elsewhere"]})
    args = build_bwrap_args("x", working_directory="/w", config=custom, hidden=[state])
    assert _at(args, cover) > args.index("/elsewhere")
    assert _at(args, ["--tmpfs", "/elsewhere/state", "--remount-ro", "/elsewhere/state"]) > 0
    # A path inside it cannot be bound at all: the cover would hide it.
    inner = os.path.join(state, "inner")
    for options in ({"read_write_paths": [inner]}, {"read_only_paths": [state]}):
        with pytest.raises(PermissionError, match="where agentvfs keeps its sandboxes' own state on the host"):
            build_bwrap_args("x", working_directory="/w", config=normalize_native_sandbox(options), hidden=[state])


def test_a_bind_of_the_whole_host_gets_the_kernel_interfaces_again() -> None:
    devices = {"null": "/state/null"}
    for options in ({"read_write_paths": ["/"]}, {"read_only_paths": ["/"]}):
        args = build_bwrap_args("x", working_directory="/w", config=normalize_native_sandbox(options), devices=devices)
        whole = _at(args, ["--bind" if "read_write_paths" in options else "--ro-bind", "/", "/"])
        assert whole > 0, options
        again = args[whole:]
        assert _at(again, ["--proc", "/proc"]) > 0 and _at(again, ["--remount-ro", "/proc"]) > 0, options
        assert _at(again, ["--dev", "/dev", "--dev-bind", "/state/null", "/dev/null"]) > 0, options
        assert _at(again, ["--tmpfs", "/sys", "--remount-ro", "/sys"]) > 0, options
    # Nothing covers them otherwise: mounted once, and no /sys at all.
    args = build_bwrap_args("x", working_directory="/w", config=normalize_native_sandbox({"read_write_paths": ["/data"]}))
    assert pairs(args, "--proc") == ["/proc"] and pairs(args, "--dev") == ["/dev"] and "/sys" not in args


def test_forwarder_descriptor_and_device_check() -> None:
    config = normalize_native_sandbox({"allowed_hosts": ["example.org"]})
    devices = {"null": "/state/null", "zero": "/state/zero"}
    args = build_bwrap_args(
        "echo hi", working_directory="/w", config=config, proxy_fd=9, devices=devices, device_fds={"null": 11, "zero": 12}
    )
    tail = args[args.index("--") + 1 :]
    # The forwarder gets the command's end of the proxy's socket pair, not a path.
    assert tail[:2] == ["sh", "-c"] and tail[-4:] == [FORWARDER_SCRIPT, "9", "3128", "echo hi"]
    assert not any("proxy" in a for a in args[: args.index("--")])
    # Before anything else, the nodes in /dev must be the ones the launcher holds.
    assert tail[2].startswith("[ /dev/null -ef /proc/self/fd/11 ] && [ /dev/zero -ef /proc/self/fd/12 ] || {")
    assert "exit 126; }; " in tail[2] and tail[2].endswith('exec sh -c "$4"')
    plain = build_bwrap_args("echo hi", working_directory="/w", config=normalize_native_sandbox(None))
    assert plain[-1] == "echo hi"


def test_the_forwarder_runs_the_interpreter_binary() -> None:
    config = normalize_native_sandbox({"allowed_hosts": ["example.org"]})
    args = build_bwrap_args("echo hi", working_directory="/w", config=config, proxy_fd=9)
    interpreter = args[args.index("--") + 4]
    assert interpreter == _isolation.forwarder_python()
    assert os.path.isfile(interpreter) and not os.path.islink(interpreter)


def test_max_disk_bytes_sizes_the_scratch_spaces() -> None:
    args = build_bwrap_args("x", working_directory="/w", config=normalize_native_sandbox({"max_disk_bytes": 1 << 20}))
    # Every scratch space holds at most max_disk_bytes; /dev is read-only once all is bound.
    assert _at(args, ["--size", str(1 << 20), "--tmpfs", "/tmp"]) > 0
    assert _at(args, ["--size", str(1 << 20), "--tmpfs", "/dev/shm"]) > args.index("--dev")
    last_bind = max(i for i, a in enumerate(args) if a in ("--bind", "--ro-bind", "--ro-bind-try"))
    assert _at(args, ["--remount-ro", "/dev"]) > last_bind
    plain = build_bwrap_args("x", working_directory="/w", config=normalize_native_sandbox(None))
    assert "--size" not in plain and "/dev/shm" not in plain and _at(plain, ["--remount-ro", "/dev"]) < 0


def test_python_is_bound_where_this_process_names_it(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    inside = os.path.relpath(sys.executable, sys.prefix)
    if inside.startswith(".."):
        pytest.skip(f"{sys.executable} is not in its prefix {sys.prefix}")
    # A symlink to python in a virtualenv reached through a symlinked directory: each step
    # of the way resolves inside the sandbox as it does here.
    linked = os.path.join(str(tmp_path), "linked-venv")
    os.symlink(os.path.realpath(sys.prefix), linked)
    named = os.path.join(str(tmp_path), "bin", "python")
    os.makedirs(os.path.dirname(named))
    os.symlink(os.path.join(linked, inside), named)
    monkeypatch.setattr(sys, "executable", named)
    binds = _isolation.python_binds()
    shown = [destination for _source, destination in binds] + list(_isolation._SYSTEM_PATHS)
    assert (os.path.dirname(named), os.path.dirname(named)) in binds
    assert _isolation._covered(os.path.dirname(os.path.join(linked, inside)), shown), binds
    # What is bound is the real directory; the forwarder's interpreter is among it.
    assert all(source == os.path.realpath(source) for source, _destination in binds)
    interpreter = _isolation.forwarder_python()
    assert interpreter is not None and _isolation._covered(interpreter, shown), (interpreter, binds)


def test_without_user_namespaces_capabilities_are_still_dropped() -> None:
    support = _isolation.BwrapSupport("/usr/bin/bwrap", user_namespace=False, disable_userns=False)
    args = build_bwrap_args("x", working_directory="/w", config=normalize_native_sandbox(None), support=support)
    assert "--unshare-user" not in args and "--disable-userns" not in args
    assert args[1:5] == ["--cap-drop", "ALL", "--new-session", "--die-with-parent"]


def test_native_sandbox_validation(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config = normalize_native_sandbox(
        {"read_write_paths": ["~/x", "rel"], "read_only_paths": "/single"}
    )
    assert config["read_write_paths"] == (os.path.join(str(tmp_path), "x"), os.path.abspath("rel"))
    assert config["read_only_paths"] == ("/single",)
    with pytest.raises(
        ValueError,
        match=r"Unknown native_sandbox option 'allowNetwork' \(did you mean 'allow_network'\?\)",
    ):
        normalize_native_sandbox({"allowNetwork": True})
    with pytest.raises(ValueError, match="Unknown native_sandbox option 'nope'"):
        normalize_native_sandbox({"nope": 1})
    with pytest.raises(ValueError, match="allow_network"):
        normalize_native_sandbox({"allow_network": "yes"})
    with pytest.raises(ValueError, match="bwrap_args"):
        normalize_native_sandbox({"bwrap_args": "--ro-bind / /"})
    with pytest.raises(ValueError, match="read_write_paths"):
        normalize_native_sandbox({"read_write_paths": [1]})
    with pytest.raises(ValueError, match="allowNetwork"):
        LocalSandbox(native_sandbox={"allowNetwork": True})
    with pytest.raises(ValueError, match=r"'max_memory_bytes'\] must be a positive integer number of bytes"):
        normalize_native_sandbox({"max_memory_bytes": "1G"})
    with pytest.raises(ValueError, match="max_processes"):
        normalize_native_sandbox({"max_processes": 0})
    with pytest.raises(ValueError, match="run_as_root"):
        normalize_native_sandbox({"run_as_root": "yes"})
    assert normalize_native_sandbox({"max_cpu_seconds": None})["max_cpu_seconds"] is None
    defaults = normalize_native_sandbox(None)
    assert (defaults["max_memory_bytes"], defaults["max_processes"]) == (4 << 30, 1024)
    assert (defaults["max_cpu_seconds"], defaults["max_file_size_bytes"]) == (3600, 8 << 30)


# -- availability -------------------------------------------------------------------------------


def test_unknown_and_unsupported_backends() -> None:
    with pytest.raises(
        IsolationUnavailableError,
        match=r"^Isolation backend 'firejail' is not available: unknown isolation backend 'firejail'",
    ):
        LocalSandbox(isolation="firejail")
    with pytest.raises(IsolationUnavailableError) as info:
        LocalSandbox(isolation="seatbelt")
    assert info.value.code == "ISOLATION_UNAVAILABLE"
    assert str(info.value).startswith(
        "Isolation backend 'seatbelt' is not available: seatbelt (sandbox-exec)"
    )
    assert check_isolation("none") == "none"


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "Linux bubblewrap (bwrap) not found. Install with: apt install bubblewrap (Debian/Ubuntu) or dnf install bubblewrap (Fedora)"
    monkeypatch.setattr(_isolation, "bwrap_support", lambda: _isolation.BwrapSupport(None, reason))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux detection")
def test_detection_without_bwrap(no_bwrap: None) -> None:
    assert LocalSandbox.detect_isolation() == {
        "backend": "none",
        "available": False,
        "message": "Linux bubblewrap (bwrap) not found. Install with: apt install bubblewrap (Debian/Ubuntu) "
        "or dnf install bubblewrap (Fedora). Commands will run without isolation.",
    }
    with pytest.raises(
        IsolationUnavailableError,
        match=r"^Isolation backend 'bwrap' is not available: Linux bubblewrap \(bwrap\) not found",
    ):
        LocalSandbox(isolation="bwrap")


@pytest.mark.skipif(sys.platform.startswith("linux"), reason="non-Linux wording")
def test_detection_elsewhere() -> None:  # pragma: no cover - runs off Linux
    assert (
        detect_isolation()["message"]
        == f"Native sandboxing is not supported on {sys.platform}. Commands will run without isolation."
    )


@needs_bwrap
def test_detection_with_bwrap() -> None:
    found = LocalSandbox.detect_isolation()
    assert (found["backend"], found["available"]) == ("bwrap", True)
    assert LocalSandbox(isolation="bwrap").isolation == "bwrap"


# -- real isolated commands ---------------------------------------------------------------------


@needs_bwrap
async def test_writes_only_inside_the_working_directory(wd: str, tmp_path: Any) -> None:
    outside = os.path.join(str(tmp_path), "outside")
    os.makedirs(outside)
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    targets = [
        "/etc/agentvfs-test",
        "/root/agentvfs-test",
        "/agentvfs-test",
        "/usr/agentvfs-test",
        f"{outside}/x",
    ]
    script = "; ".join(f"if echo x > {t}; then echo wrote {t}; fi" for t in targets)
    result = await sandbox.execute_command(
        script + "; echo inside > made.txt; echo private > /tmp/p.txt; cat /tmp/p.txt"
    )
    assert "wrote" not in result.stdout
    assert result.stdout == "private\n"
    for target in targets:
        assert not os.path.exists(target), target
    assert read(os.path.join(wd, "made.txt")) == "inside\n"
    assert not os.path.exists("/tmp/p.txt")
    assert "Read-only file system" in result.stderr
    await sandbox.destroy()


@needs_bwrap
async def test_read_write_and_read_only_paths(wd: str, tmp_path: Any) -> None:
    rw = os.path.join(str(tmp_path), "rw")
    ro = os.path.join(str(tmp_path), "ro")
    os.makedirs(rw)
    os.makedirs(ro)
    write(os.path.join(ro, "in.txt"), "readable\n")
    sandbox = LocalSandbox(
        working_directory=wd,
        isolation="bwrap",
        native_sandbox={"read_write_paths": [rw], "read_only_paths": [ro]},
    )
    result = await sandbox.execute_command(
        f"echo ok > {rw}/out.txt; cat {ro}/in.txt; echo no > {ro}/w.txt || echo refused"
    )
    assert result.stdout == "readable\nrefused\n"
    assert read(os.path.join(rw, "out.txt")) == "ok\n"
    assert not os.path.exists(os.path.join(ro, "w.txt"))
    await sandbox.destroy()


@needs_bwrap
async def test_read_only_working_directory(wd: str) -> None:
    write(os.path.join(wd, "seen.txt"), "seen\n")
    sandbox = LocalSandbox(
        working_directory=wd, isolation="bwrap", native_sandbox={"read_only": True}
    )
    result = await sandbox.execute_command("cat seen.txt; echo x > new.txt || echo refused")
    assert result.stdout == "seen\nrefused\n"
    assert not os.path.exists(os.path.join(wd, "new.txt"))
    await sandbox.destroy()


@pytest.fixture
def tcp_server() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello from the host\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


CONNECT = "import socket,sys; s=socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3); print(s.recv(100).decode().strip())"


@needs_bwrap
async def test_network_is_unshared_unless_allowed(wd: str, tmp_path: Any, tcp_server: int) -> None:
    # The host side can reach it; an isolated command cannot.
    plain = LocalSandbox(working_directory=wd)
    assert (
        await plain.execute_command(sys.executable, ["-c", CONNECT, str(tcp_server)])
    ).stdout == "hello from the host\n"
    isolated = LocalSandbox(working_directory=wd, isolation="bwrap")
    blocked = await isolated.execute_command(sys.executable, ["-c", CONNECT, str(tcp_server)])
    assert blocked.exit_code != 0 and "hello" not in blocked.stdout
    assert "ConnectionRefusedError" in blocked.stderr or "unreachable" in blocked.stderr
    allowed = LocalSandbox(
        working_directory=wd, isolation="bwrap", native_sandbox={"allow_network": True}
    )
    result = await allowed.execute_command(sys.executable, ["-c", CONNECT, str(tcp_server)])
    assert (result.exit_code, result.stdout) == (0, "hello from the host\n")
    for sandbox in (plain, isolated, allowed):
        await sandbox.destroy()


@needs_bwrap
async def test_no_host_environment_or_processes(wd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap", env={"VISIBLE": "yes"})
    result = await sandbox.execute_command(
        f"env; ls /proc/{os.getpid()} >/dev/null 2>&1 && echo host-visible; ls /proc | grep -c '^[0-9]'"
    )
    lines = result.stdout.splitlines()
    names = {line.split("=", 1)[0] for line in lines if "=" in line}
    assert "SECRET_TOKEN" not in names and "hunter2" not in result.stdout
    assert {"PATH", "VISIBLE"} <= names <= {"PATH", "VISIBLE", "PWD", "SHLVL", "_"}
    assert "host-visible" not in lines
    assert int(lines[-1]) <= 5  # only the sandbox's own few processes
    await sandbox.destroy()


@needs_bwrap
async def test_timeout_and_kill_reach_the_isolated_processes(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    result = await sandbox.execute_command("sleep 30 & sleep 30", timeout=300)
    assert (result.exit_code, result.timed_out, result.stderr) == (
        124,
        True,
        "\nProcess timed out after 300ms",
    )
    handle = await sandbox.processes.spawn("echo up; sleep 30")
    with anyio.fail_after(5):
        while "up" not in handle.stdout:  # noqa: ASYNC110 (output arrives from another thread)
            await anyio.sleep(0.01)
    assert await sandbox.processes.kill(handle.pid)
    assert handle.exit_code == 128
    with anyio.fail_after(3):
        while live_members(int(handle.pid)):  # noqa: ASYNC110
            await anyio.sleep(0.02)
    await sandbox.destroy()


@needs_bwrap
async def test_python_and_cwd_inside(wd: str) -> None:
    os.makedirs(os.path.join(wd, "sub"))
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    result = await sandbox.execute_command(
        f"{sys.executable} -c 'import os; print(os.getcwd())'", cwd="sub"
    )
    assert (result.exit_code, result.stdout) == (0, os.path.join(wd, "sub") + "\n")
    await sandbox.destroy()


@needs_bwrap
async def test_mounts_are_bound_into_the_sandbox(wd: str, tmp_path: Any) -> None:
    base = os.path.join(str(tmp_path), "data")
    os.makedirs(base)
    write(os.path.join(base, "hello.txt"), "hi\n")
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    sandbox.mounts.add({"/data": LocalFilesystem(base)})
    result = await sandbox.execute_command("cat data/hello.txt && echo new > data/new.txt")
    assert (result.exit_code, result.stdout) == (0, "hi\n")
    assert read(os.path.join(base, "new.txt")) == "new\n"
    await sandbox.destroy()


@needs_bwrap
async def test_info_reports_isolation(wd: str) -> None:
    sandbox = LocalSandbox(
        working_directory=wd, isolation="bwrap", native_sandbox={"read_write_paths": ["/tmp"]}
    )
    metadata = (await sandbox.get_info())["metadata"]
    assert metadata["isolation"] == "bwrap"
    assert metadata["isolation_config"]["allow_network"] is False
    assert metadata["isolation_config"]["read_write_paths"] == ["/tmp"]


PRELOAD_SOURCE = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    const char *where = getenv("AGENTVFS_TEST_MARK");
    if (where) { int fd = open(where, O_WRONLY | O_CREAT | O_APPEND, 0644); if (fd >= 0) { write(fd, "loaded\n", 7); close(fd); } }
}
"""


def _build_preload(wd: str) -> None:
    """``evil.so`` in ``wd``, built from :data:`PRELOAD_SOURCE` (as an agent could)."""
    source = os.path.join(wd, "evil.c")
    with open(source, "w") as f:
        f.write(PRELOAD_SOURCE)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(wd, "evil.so"), source], check=True)


@needs_bwrap
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the library")
async def test_loader_variables_act_inside_the_sandbox_only(wd: str, tmp_path: Any) -> None:
    """A command's ``LD_PRELOAD`` naming a library the agent wrote must not load into
    bubblewrap, which runs on the host as this user (root here): the command still gets it."""
    _build_preload(wd)
    outside = os.path.join(str(tmp_path), "outside")
    os.makedirs(outside)
    host_mark = os.path.join(outside, "mark")  # not bound into the sandbox
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    try:
        env = {"LD_PRELOAD": os.path.join(wd, "evil.so"), "LD_LIBRARY_PATH": ".", "AGENTVFS_TEST_MARK": host_mark, "PLAIN": "x"}
        result = await sandbox.execute_command('echo "$LD_PRELOAD|$LD_LIBRARY_PATH|$PLAIN"', env=env)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == f"{os.path.join(wd, 'evil.so')}|.|x\n"  # the command has them all
        assert not os.path.exists(host_mark), "the library ran on the host"
        inside = await sandbox.execute_command("cat mark", env={**env, "AGENTVFS_TEST_MARK": os.path.join(wd, "mark")})
        assert "loaded" in inside.stdout  # and it does act inside, where it was meant to
    finally:
        await sandbox.destroy()
