"""bubblewrap without privilege: what a command inside has (no capability, an ordinary uid, the
seccomp filter, bwrap's minimal /dev) and what it cannot do (remount, mknod, new namespaces,
host files outside every bind, host unix sockets); and detection that refuses a bwrap that
would leave capabilities."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvfs.errors import IsolationUnavailableError
from agentvfs.sandbox import LocalSandbox, _isolation
from agentvfs.sandbox._isolation import SANDBOX_UID, bwrap_support, detect_isolation

pytestmark = pytest.mark.anyio

BWRAP = detect_isolation()
needs_bwrap = pytest.mark.skipif(not BWRAP["available"], reason=f"bubblewrap unusable here: {BWRAP['message']}")
ZERO = "0000000000000000"


@pytest.fixture
def wd(tmp_path: Path) -> str:
    path = tmp_path / "wd"
    path.mkdir()
    path.chmod(0o777)
    return str(path)


async def run(wd: str, command: str, **options: object) -> tuple[int, str, str]:
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap", native_sandbox=dict(options) or None)
    try:
        result = await sandbox.execute_command(command)
    finally:
        await sandbox.destroy()
    return result.exit_code, result.stdout, result.stderr


def status(text: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if _}


@needs_bwrap
async def test_no_capability_an_ordinary_user_and_the_filter(wd: str) -> None:
    code, out, err = await run(wd, "cat /proc/self/status; echo uid=$(id -u) gid=$(id -g)")
    assert code == 0, err
    fields = status(out)
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert fields[name] == ZERO, (name, fields[name])
    assert fields["NoNewPrivs"] == "1"
    assert fields["Seccomp"] == "2"
    expected = SANDBOX_UID if os.getuid() == 0 else os.getuid()
    assert f"uid={expected} " in out
    # Files this process creates through the sandbox are still this process's user's.
    code, _out, err = await run(wd, "echo x > mine.txt")
    assert code == 0, err
    assert os.stat(os.path.join(wd, "mine.txt")).st_uid == os.getuid()


@needs_bwrap
async def test_root_inside_only_when_asked_and_still_without_capabilities(wd: str) -> None:
    code, out, err = await run(wd, "id -u; grep -E '^Cap(Eff|Bnd):' /proc/self/status", run_as_root=True)
    assert code == 0, err
    lines = out.split()
    assert lines[0] == "0"
    assert lines[2] == ZERO and lines[4] == ZERO


@needs_bwrap
async def test_nested_user_and_mount_namespaces_are_refused(wd: str) -> None:
    _code, out, err = await run(
        wd,
        "unshare -U true && echo userns-made; unshare -m true && echo mountns-made; "
        "unshare -r true && echo rootns-made; echo done",
    )
    assert out.splitlines() == ["done"], (out, err)


@needs_bwrap
async def test_remount_mount_and_mknod_fail(wd: str, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "f.txt").write_text("original\n")
    script = (
        f"mount -o remount,bind,rw {ro} && echo remounted; "
        f"mount -t tmpfs none {wd} && echo mounted; "
        "mknod zero c 1 5 && echo made-char; mknod disk b 8 0 && echo made-block; "
        "mkfifo fifo && echo made-fifo; "
        f"echo pwned > {ro}/f.txt && echo wrote-ro; echo done"
    )
    _code, out, err = await run(wd, script, read_only_paths=[str(ro)])
    assert out.splitlines() == ["made-fifo", "done"], (out, err)
    assert (ro / "f.txt").read_text() == "original\n"
    assert not os.path.lexists(os.path.join(wd, "zero"))


@needs_bwrap
async def test_dev_is_minimal(wd: str) -> None:
    code, out, err = await run(wd, "ls /dev")
    assert code == 0, err
    names = set(out.split())
    assert names <= {"console", "core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr",
                     "stdin", "stdout", "tty", "urandom", "zero"}, names  # fmt: skip
    assert not any(name.startswith(("sd", "nvme", "vd", "loop", "mem", "kmsg", "fuse")) for name in names)


@pytest.fixture
def host_socket(tmp_path: Path) -> Iterator[str]:
    """A unix socket in a host directory no bind covers, answering "host secret"."""
    directory = tmp_path / "hostside"
    directory.mkdir()
    directory.chmod(0o755)
    path = str(directory / "agent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
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
                conn.sendall(b"host secret\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    thread.join()
    server.close()


@needs_bwrap
async def test_host_files_and_sockets_outside_the_binds_are_out_of_reach(wd: str, tmp_path: Path, host_socket: str) -> None:
    secret = tmp_path / "hostside" / "secret.txt"
    secret.write_text("host secret\n")
    secret.chmod(0o644)
    connect = (
        "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print(s.recv(99).decode())"
    )
    script = (
        f"cat {secret}; echo made > {tmp_path}/hostside/new.txt; touch /new-at-root; "
        f"{sys.executable} -c '{connect}' {host_socket}; echo done"
    )
    _code, out, _err = await run(wd, script)
    assert "host secret" not in out
    assert out.strip().endswith("done")
    assert not (tmp_path / "hostside" / "new.txt").exists()
    assert not os.path.exists("/new-at-root")


@needs_bwrap
async def test_host_environment_and_parent_are_invisible(wd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTVFS_TEST_SECRET", "hunter2-secret")
    _code, out, err = await run(wd, "env; cat /proc/$PPID/environ; cat /proc/1/environ; ls /proc")
    assert "hunter2-secret" not in out + err


def test_detection_refuses_a_bwrap_that_leaves_capabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = "CapInh:\t0000000000000000\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\n"
    monkeypatch.setattr(_isolation, "bwrap_path", lambda: "/usr/bin/bwrap")
    monkeypatch.setattr(_isolation, "_probe_once", lambda path, support: (kept, None))
    monkeypatch.setattr(_isolation, "_platform", lambda: "linux")
    _isolation.bwrap_support.cache_clear()
    try:
        found = detect_isolation()
        assert found["available"] is False
        assert "leaves capabilities to the sandbox (CapPrm 000001fffeffffff, CapEff 000001fffeffffff" in found["message"]
        with pytest.raises(IsolationUnavailableError, match="leaves capabilities"):
            LocalSandbox(isolation="bwrap")
        # Without the filter in place it is refused too.
        status_text = "".join(f"{n}:\t{ZERO}\n" for n in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
        monkeypatch.setattr(_isolation, "_probe_once", lambda path, support: (status_text + "NoNewPrivs:\t1\nSeccomp:\t0\n", None))
        _isolation.bwrap_support.cache_clear()
        assert "did not apply the seccomp filter" in detect_isolation()["message"]
        # A sandbox that may write kernel.core_pattern (or whose probe did not say) is refused.
        for line in ("AgentvfsCorePattern: writable\n", ""):
            leaky = status_text + "NoNewPrivs:\t1\nSeccomp:\t2\n" + line
            monkeypatch.setattr(_isolation, "_probe_once", lambda path, support, text=leaky: (text, None))
            _isolation.bwrap_support.cache_clear()
            assert "leaves /proc/sys writable to the sandbox (kernel.core_pattern: " in detect_isolation()["message"]
        # A kernel without user namespaces: bwrap without one of ours (capabilities dropped).
        good = status_text + "NoNewPrivs:\t1\nSeccomp:\t2\nAgentvfsCorePattern: read-only\n"

        def probe(path: str, support: _isolation.BwrapSupport) -> tuple[str | None, str | None]:
            if support.user_namespace:
                return None, "No permissions to create a new namespace"
            return good, None

        monkeypatch.setattr(_isolation, "_probe_once", probe)
        _isolation.bwrap_support.cache_clear()
        support = bwrap_support()
        assert (support.available, support.user_namespace) == (True, False)
        assert "no user namespace" in detect_isolation()["message"]
    finally:
        _isolation.bwrap_support.cache_clear()


@needs_bwrap
def test_detection_says_what_hardening_is_in_effect() -> None:
    message = detect_isolation()["message"]
    assert "no capabilities" in message and "seccomp filter" in message


# A sysctl written back with the value it has (a no-op even where it gets through), a chmod of
# global /proc entries and of /dev nodes to the modes they have, the root-only /proc files,
# and what ordinary commands need of /proc and /dev.
_KERNEL_STATE = r"""
v=$(cat /proc/sys/fs/lease-break-time); printf '%s\n' "$v" > /proc/sys/fs/lease-break-time && echo sysctl-written
chmod 444 /proc/meminfo && echo proc-chmod
chmod 666 /dev/null && echo dev-chmod
test -w /proc/sys/kernel/core_pattern && echo core-pattern-writable
for f in /proc/kpageflags /proc/slabinfo; do test -e $f && head -c 1 $f >/dev/null 2>&1 && echo read-$f; done
echo x > /dev/null && echo null-ok && head -c 4 /dev/urandom | wc -c && head -c 3 /dev/zero | wc -c
echo via-fd > /proc/self/fd/1; echo via-dev-stdout > /dev/stdout
grep -c . /proc/self/status >/dev/null && ps -o pid= | wc -l | grep -q . && echo procfs-readable
python3 -c 'import os; print("python", os.cpu_count() > 0)' 2>/dev/null || echo python True
echo done
"""


@needs_bwrap
async def test_kernel_state_is_out_of_reach_and_ordinary_commands_work(wd: str) -> None:
    before = os.stat("/dev/null")
    code, out, err = await run(wd, _KERNEL_STATE)
    assert code == 0, err
    assert out.splitlines() == ["null-ok", "4", "3", "via-fd", "via-dev-stdout", "procfs-readable", "python True", "done"], (out, err)
    assert "Read-only file system" in err  # the sysctl and the chmod of /proc/meminfo
    after = os.stat("/dev/null")
    assert (after.st_mode, after.st_ctime_ns) == (before.st_mode, before.st_ctime_ns)


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="private device nodes are made when this process is root")
async def test_devices_of_its_own_when_root(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    try:
        result = await sandbox.execute_command("ls -ln /dev/null /dev/tty | cut -c1-30; stat -c '%t:%T' /dev/null")
        devices = sandbox._launcher.devices
        assert devices is not None and set(devices.paths) == {"null", "zero", "full", "random", "urandom", "tty"}
        state = devices.directory
        assert all(os.path.dirname(path) == state for path in devices.paths.values())
    finally:
        await sandbox.destroy()
    assert result.exit_code == 0, result.stderr
    # Owned by nobody (an id the sandbox's namespace does not map), the host's numbers.
    assert result.stdout.splitlines()[0].split()[2:4] == ["65534", "65534"], result.stdout
    host = os.stat("/dev/null").st_rdev
    assert result.stdout.splitlines()[-1] == f"{os.major(host):x}:{os.minor(host):x}"
    assert sandbox._launcher.devices is None and not os.path.exists(state)


# -- device nodes out of every other sandbox's reach --------------------------------------------

_TAMPER = r"""
import os, sys
# Given the victim's device nodes (as its own commands would tell), change them every way
# there is: a FIFO or a file in a node's place, a chmod, and each directory on the way moved
# aside for one of this sandbox's own with a FIFO in it.
stop, nodes = sys.argv[1], sys.argv[2:]
def attempt(label, fn):
    try:
        fn()
        print("done", label)
    except OSError as exc:
        print("refused", label, exc.errno)
def fifo(node):
    os.unlink(node)
    os.mkfifo(node)
def plain(node):
    with open(node + ".new", "w"):
        pass
    os.replace(node + ".new", node)
for node in nodes:
    attempt("fifo " + node, lambda: fifo(node))
    attempt("chmod " + node, lambda: os.chmod(node, 0))
    attempt("file " + node, lambda: plain(node))
directory = os.path.dirname(nodes[0])
while directory != stop and len(directory) > len(stop):
    def swap(directory=directory):
        os.rename(directory, directory + ".moved")
        os.makedirs(os.path.dirname(nodes[0]), exist_ok=True)
        for node in nodes:
            os.mkfifo(node)
    attempt("move " + directory, swap)
    directory = os.path.dirname(directory)
print("listing", sorted(os.listdir(os.path.dirname(nodes[0]))) if os.path.isdir(os.path.dirname(nodes[0])) else None)
"""


async def _device_sources(sandbox: LocalSandbox, names: tuple[str, ...]) -> list[str]:
    """Where the nodes bound at ``/dev/<name>`` in ``sandbox`` come from on the host, as a
    command of that sandbox can tell (the root of each bind in its mount table)."""
    result = await sandbox.execute_command("cat /proc/self/mountinfo")
    roots = {fields[4]: fields[3] for fields in (line.split() for line in result.stdout.splitlines())}
    sources = [roots[f"/dev/{name}"] for name in names]
    for source in sources:
        if not os.path.exists(source) or not stat.S_ISCHR(os.lstat(source).st_mode):
            pytest.skip(f"{source} is named within a filesystem of its own, not as the host names it")
    return sources


def _moved_aside(paths: list[str], stop: str) -> list[str]:
    """The ``.moved`` directories a tampering sandbox may have left beside ``paths``' parents."""
    found = []
    directory = os.path.dirname(paths[0])
    while directory != stop and len(directory) > len(stop):
        if os.path.lexists(directory + ".moved"):
            found.append(directory + ".moved")
        directory = os.path.dirname(directory)
    return found


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="private device nodes are made when this process is root")
@pytest.mark.parametrize("shared", ["read_write_paths", "working_directory"])
async def test_another_sandbox_cannot_change_the_device_nodes(wd: str, tmp_path: Path, shared: str) -> None:
    temporary = tempfile.gettempdir()
    victim = LocalSandbox(working_directory=wd, isolation="bwrap")
    script = tmp_path / "tamper.py"
    script.write_text(_TAMPER)
    script.chmod(0o644)
    if shared == "read_write_paths":
        attacker = LocalSandbox(
            working_directory=str(tmp_path), isolation="bwrap", native_sandbox={"read_write_paths": [temporary]}
        )
    else:
        attacker = LocalSandbox(working_directory=temporary, isolation="bwrap", native_sandbox={"read_only_paths": [str(tmp_path)]})
    nodes: list[str] = []
    try:
        nodes = await _device_sources(victim, ("null", "zero", "urandom"))
        tamper = await attacker.execute_command(f"{sys.executable} {script} {temporary} {' '.join(nodes)}", timeout=60_000)
        assert tamper.exit_code == 0, tamper
        # Whatever happened there, the victim's next command has its own, working nodes.
        result = await victim.execute_command(
            "echo x > /dev/null && head -c 4 /dev/zero | od -An -tx1 && head -c 4 /dev/urandom | wc -c && "
            "stat -c '%F %u' /dev/null",
            timeout=20_000,
        )
    finally:
        await attacker.destroy()
        await victim.destroy()
        for left in _moved_aside(nodes, temporary) if nodes else []:
            shutil.rmtree(left, ignore_errors=True)
    assert "done" not in tamper.stdout.split(), tamper.stdout
    assert (result.exit_code, result.stdout) == (0, " 00 00 00 00\n4\ncharacter special file 65534\n"), (result, tamper.stdout)


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="private device nodes are made when this process is root")
async def test_device_nodes_are_kept_where_no_sandbox_can_list_change_or_move_them(wd: str, tmp_path: Path) -> None:
    from agentvfs.sandbox._devices import NOBODY, devices_root

    victim = LocalSandbox(working_directory=wd, isolation="bwrap")
    attacker = LocalSandbox(
        working_directory=str(tmp_path), isolation="bwrap", native_sandbox={"read_write_paths": [tempfile.gettempdir()]}
    )
    try:
        assert (await victim.execute_command("true")).exit_code == 0
        devices = victim._launcher.devices
        assert devices is not None
        root = devices_root()
        for directory in (root, devices.directory):
            info = os.lstat(directory)
            assert stat.S_ISDIR(info.st_mode) and (info.st_uid, info.st_gid) == (NOBODY, NOBODY), directory
            assert stat.S_IMODE(info.st_mode) == 0o711
        seen = await attacker.execute_command(
            f"ls -a {root}; touch {root}/x || echo refused-touch; mv {root} {root}.moved || echo refused-move"
        )
        assert devices.verify() is None
    finally:
        await attacker.destroy()
        await victim.destroy()
    # An empty read-only directory in its place: nothing to list, nothing to make, no moving it.
    assert seen.stdout == ".\n..\nrefused-touch\nrefused-move\n", seen
    assert "Read-only file system" in seen.stderr and "busy" in seen.stderr, seen.stderr
    assert os.path.isdir(root) and not os.path.exists(f"{root}.moved")


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="private device nodes are made when this process is root")
async def test_device_nodes_changed_from_outside_are_made_anew(wd: str, caplog: pytest.LogCaptureFixture) -> None:
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    try:
        assert (await sandbox.execute_command("true")).exit_code == 0
        before = sandbox._launcher.devices
        assert before is not None
        # What no sandbox can do, a process of the host's root can: a FIFO for /dev/null.
        null = before.paths["null"]
        os.unlink(null)
        os.mkfifo(null)
        with caplog.at_level(logging.WARNING, logger="agentvfs.sandbox"):
            result = await sandbox.execute_command("echo x > /dev/null && echo ok", timeout=20_000)
        after = sandbox._launcher.devices
    finally:
        await sandbox.destroy()
    assert (result.exit_code, result.stdout) == (0, "ok\n"), result
    assert f"its device nodes were changed ({null} was replaced); making them anew" in caplog.text
    assert after is not None and after.directory != before.directory
    assert not os.path.exists(before.directory)


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="private device nodes are made when this process is root")
async def test_a_node_changed_after_the_check_stops_the_command(wd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentvfs.sandbox._devices import NOBODY

    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    try:
        assert (await sandbox.execute_command("true")).exit_code == 0
        devices = sandbox._launcher.devices
        assert devices is not None
        # What a race between the launcher's check and bubblewrap's bind could leave: a node
        # every attribute of which passes (nobody's, 0666, the host's numbers), another inode.
        null = devices.paths["null"]
        os.rename(null, f"{null}.old")
        os.mknod(null, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
        os.chown(null, NOBODY, NOBODY)
        os.chmod(null, 0o666)
        monkeypatch.setattr(devices, "verify", lambda: None)  # the check ran before the change
        result = await sandbox.execute_command("echo ran")
    finally:
        await sandbox.destroy()
    assert (result.exit_code, result.stdout) == (126, ""), result
    assert "the device nodes bound into this sandbox are not the ones made for it" in result.stderr


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="private device nodes are made when this process is root")
async def test_a_devices_directory_someone_else_made_is_not_used(
    wd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from agentvfs.sandbox import _devices, _launch

    # Another user got there first (or a sandbox: the same uid, but it cannot make it nobody's).
    taken = tmp_path / ".agentvfs-devices-0"
    taken.mkdir()
    (taken / "planted").mkdir()
    os.chown(taken, 12345, 12345)
    monkeypatch.setattr(_devices, "devices_root", lambda: str(taken))
    monkeypatch.setattr(_launch, "devices_root", lambda: str(taken))
    sandbox = LocalSandbox(working_directory=wd, isolation="bwrap")
    try:
        with caplog.at_level(logging.WARNING, logger="agentvfs.sandbox"):
            result = await sandbox.execute_command("echo x > /dev/null && stat -c %u /dev/null")
        devices = sandbox._launcher.devices
        assert devices is not None
        own = devices.root
        hidden = sandbox._launcher.hidden_paths()
    finally:
        await sandbox.destroy()
    assert (result.exit_code, result.stdout) == (0, "65534\n"), result
    assert f"cannot keep device nodes in {taken} ({taken} is owned by 12345:12345, not by nobody" in caplog.text
    assert own != str(taken) and os.path.dirname(own) == tempfile.gettempdir() and own in hidden
    assert not os.path.exists(own)  # removed with the sandbox
    assert sorted(os.listdir(taken)) == ["planted"]  # and the other directory left as it was


_KERNEL_INTERFACES = (
    "test -w /proc/sys/kernel/core_pattern && echo core-pattern-writable; "
    "test -w /proc/sysrq-trigger && echo sysrq-writable; "
    "echo sys $(ls -A /sys | wc -l); echo x > /dev/null && echo null-usable; stat -c %u /dev/null; "
    "echo keys $(ls -A /etc/ssl/private 2>/dev/null | wc -l)"
)


@needs_bwrap
@pytest.mark.parametrize("given", ["read_write_paths", "read_only_paths", "working_directory"])
async def test_binding_the_whole_host_brings_none_of_its_kernel_interfaces(wd: str, given: str) -> None:
    # "/" as a writable or read-only path, or as the working directory: the host's /proc (a
    # writable kernel.core_pattern runs a program as root), /dev and /sys come with it.
    if given == "working_directory":
        sandbox = LocalSandbox(working_directory="/", isolation="bwrap")
    else:
        sandbox = LocalSandbox(working_directory=wd, isolation="bwrap", native_sandbox={given: ["/"]})
    try:
        result = await sandbox.execute_command(_KERNEL_INTERFACES)
    finally:
        await sandbox.destroy()
    assert (result.exit_code, result.stdout) == (0, "sys 0\nnull-usable\n65534\nkeys 0\n"), result
