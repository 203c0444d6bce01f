"""Attacks from inside the sandbox: privilege, kernel interfaces, processes and secrets.

Each attack works as an agent would: it writes a program or script with ``write_file`` and
runs it with ``execute_command``; the host side only sets the stage (a file bound nowhere, a
unix socket outside the root, a crashed earlier sandbox) and then checks that nothing outside
the root changed and no secret appeared.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio

from ._adversary import Arena, attack

__all__: list[str] = []


@attack(
    "bwrap_capabilities",
    finding="a command in the bwrap sandbox keeps root's capabilities",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_capabilities(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    out = await arena.sh("grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status")
    values = {line.split(":")[0]: line.split(":")[1].strip() for line in out.splitlines() if line.startswith("Cap")}
    for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        arena.record(values.get(name) == "0000000000000000", f"{name} is {values.get(name)!r} in: {out!r}")


# -- kernel interfaces --------------------------------------------------------------------------

_HANDLE_READER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
handle_type, blob = sys.argv[1], bytes.fromhex(sys.argv[2])

class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * 128)]

fh = FileHandle(len(blob), int(handle_type))
ctypes.memmove(fh.f_handle, blob, len(blob))
mount_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
fd = libc.open_by_handle_at(mount_fd, ctypes.byref(fh), os.O_RDONLY)
if fd < 0:
    print("refused", os.strerror(ctypes.get_errno()))
else:
    print("read:", os.read(fd, 200).decode(errors="replace"))
"""

# Opens a host directory by handle, then works relative to it: a file made there, its unix
# socket reached through /proc/self/fd (what a descriptor of a directory bound nowhere gives).
_HANDLE_DIRECTORY = r"""
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
handle_type, blob = sys.argv[1], bytes.fromhex(sys.argv[2])

class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * 128)]

fh = FileHandle(len(blob), int(handle_type))
ctypes.memmove(fh.f_handle, blob, len(blob))
mount_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
fd = libc.open_by_handle_at(mount_fd, ctypes.byref(fh), os.O_RDONLY | os.O_DIRECTORY)
if fd < 0:
    print("refused", os.strerror(ctypes.get_errno()))
    sys.exit(0)
try:
    made = os.open("made-by-handle.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(made, b"pwned")
    print("created a host file")
except OSError as exc:
    print("create refused", exc.errno)
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    s.connect("/proc/self/fd/%d/agent.sock" % fd)
    print("socket answered", s.recv(200).decode(errors="replace"))
except OSError as exc:
    print("socket refused", exc.errno)
"""

_HANDLE_READER_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct { unsigned int bytes; int type; unsigned char h[128]; } fh;
    size_t n = strlen(argv[2]) / 2;
    fh.bytes = n; fh.type = atoi(argv[1]);
    for (size_t i = 0; i < n; i++) sscanf(argv[2] + 2 * i, "%2hhx", &fh.h[i]);
    int mount_fd = open(".", O_RDONLY | O_DIRECTORY);
    int fd = open_by_handle_at(mount_fd, (struct file_handle *)&fh, O_RDONLY);
    if (fd < 0) { printf("refused %s\n", strerror(errno)); return 0; }
    char buf[200] = {0};
    read(fd, buf, sizeof buf - 1);
    printf("read: %s\n", buf);
    return 0;
}
"""


def _file_handle(path: Path) -> tuple[int, bytes] | None:
    """``name_to_handle_at`` of a host file, as the host sees it (what an attacker would
    guess by brute force): ``(handle type, handle bytes)``, or None where unsupported."""
    libc = ctypes.CDLL(None, use_errno=True)

    class FileHandle(ctypes.Structure):
        _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * 128)]

    fh = FileHandle(128, 0)
    mount_id = ctypes.c_int()
    if libc.name_to_handle_at(-100, os.fsencode(path), ctypes.byref(fh), ctypes.byref(mount_id), 0) != 0:
        return None
    return fh.handle_type, bytes(fh.f_handle[: fh.handle_bytes])


@attack(
    "bwrap_open_by_handle",
    finding="open_by_handle_at from the sandbox reads a host file bound nowhere (Python and C)",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_open_by_handle(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    handle = _file_handle(arena.host / "secret.txt")
    if handle is None:
        # The filesystem has no handles: the call cannot work anywhere on it.
        arena.record(True)
        return
    kind, blob = handle
    await arena.tool("write_file", path="handle.py", content=_HANDLE_READER)
    out = await arena.sh(f"{sys.executable} handle.py {kind} {blob.hex()}")
    arena.check_secret(out, "open_by_handle_at through ctypes")
    arena.record("refused" in out, f"open_by_handle_at was not refused: {out[:200]!r}")
    if shutil.which("gcc") is not None:
        await arena.tool("write_file", path="handle.c", content=_HANDLE_READER_C)
        out = await arena.sh(f"gcc -o handle handle.c && ./handle {kind} {blob.hex()}")
        arena.check_secret(out, "open_by_handle_at from C")
    arena.check_outside("open_by_handle_at")


@attack(
    "bwrap_remount_read_only_path",
    finding="mount -o remount,bind,rw makes a read-only path writable",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_remount_read_only_path(arena: Arena) -> None:
    tree = arena.host / "tree"
    await arena.open(isolation="bwrap", native_sandbox={"read_only_paths": [str(tree)]})
    for command in (
        f"mount -o remount,bind,rw {tree}",
        f"mount -o remount,rw {tree}",
        f"mount --bind {arena.root} {tree}",
        f"umount {tree}",
        f"mount -t tmpfs none {tree}",
    ):
        out = await arena.sh(f"{command}; echo pwned > {tree}/a.txt; echo pwned > {tree}/new.txt; cat {tree}/a.txt")
        arena.record("pwned" not in out, f"{command} made {tree} writable: {out[:200]!r}")
        arena.check_outside(command)


@attack(
    "bwrap_device_nodes",
    finding="mknod makes a device node (a /dev/zero that read_file then reads forever)",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_device_nodes(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    for name, spec in (("zero", "c 1 5"), ("mem", "c 1 1"), ("disk", "b 8 0"), ("kmsg", "c 1 11")):
        out = await arena.sh(f"mknod {name} {spec} && echo made")
        made = (arena.root / name).is_char_device() or (arena.root / name).is_block_device()
        arena.record("made" not in out and not made, f"mknod {name} {spec} worked: {out[:200]!r}")
    # Also from a program, past the shell's own mknod.
    script = "import os, stat\ntry:\n    os.mknod('pynode', stat.S_IFCHR | 0o666, os.makedev(1, 5))\n    print('made')\nexcept OSError as exc:\n    print('refused', exc.errno)\n"
    await arena.tool("write_file", path="node.py", content=script)
    out = await arena.sh(f"{sys.executable} node.py")
    arena.record("made" not in out, f"os.mknod made a device: {out[:200]!r}")
    arena.check_outside("mknod")


_NAMESPACES = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name, flag in (("user", 0x10000000), ("mount", 0x00020000), ("net", 0x40000000), ("pid", 0x20000000)):
    pid = os.fork()
    if pid == 0:
        ok = libc.unshare(flag) == 0
        os._exit(0 if ok else 1)
    made = os.waitpid(pid, 0)[1] == 0
    print(name, "made" if made else "refused")
"""


@attack(
    "bwrap_nested_namespaces",
    finding="unshare -U/-m or a nested user namespace gives the sandbox root again",
    severity="high",
    requires=("bwrap",),
)
async def bwrap_nested_namespaces(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    for command in ("unshare -U true", "unshare -m true", "unshare -r id -u", "unshare -Urm sh -c 'mount -t tmpfs none /tmp'"):
        out = await arena.sh(f"{command} && echo made")
        arena.record("made" not in out.split(), f"{command} worked: {out[:200]!r}")
    await arena.tool("write_file", path="ns.py", content=_NAMESPACES)
    out = await arena.sh(f"{sys.executable} ns.py")
    for line in out.splitlines():
        if line.endswith(("made", "refused")):
            arena.record(line.endswith("refused"), f"unshare from a program: {line}")


# -- the host's files and sockets ---------------------------------------------------------------


@attack(
    "bwrap_host_file_outside_binds",
    finding="a command creates or changes a host file outside every bind",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_host_file_outside_binds(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    host = arena.host
    for command in (
        f"echo pwned > {host}/new.txt",
        f"echo pwned >> {host}/secret.txt",
        f"mkdir {host}/made",
        f"ln -s /etc {host}/link",
        f"touch {arena.base}/beside-root",
        "touch /agentvfs-pwned; touch /etc/agentvfs-pwned; touch /usr/agentvfs-pwned",
        f"cd /proc/1/root && echo pwned > .{host}/new.txt",
        f"echo pwned > /proc/self/root{host}/new.txt",
    ):
        out = await arena.sh(command)
        arena.check_outside(command)
        arena.check_secret(out, command)
    for path in ("/agentvfs-pwned", "/etc/agentvfs-pwned", "/usr/agentvfs-pwned"):
        arena.record(not _exists(path), f"{path} was created on the host")
        with contextlib.suppress(OSError):
            os.unlink(path)
    # The directory by handle (no bind covers it), then a file made relative to it.
    handle = _file_handle(host)
    if handle is not None:
        await arena.tool("write_file", path="handle_dir.py", content=_HANDLE_DIRECTORY)
        out = await arena.sh(f"{sys.executable} handle_dir.py {handle[0]} {handle[1].hex()}")
        arena.record("created a host file" not in out, f"made a file through a handle: {out[:200]!r}")
        arena.check_outside("a file made through a directory handle")


@contextlib.contextmanager
def _host_socket(path: Path, answer: bytes) -> Iterator[None]:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
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
            with conn, contextlib.suppress(OSError):
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        server.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


_SOCKET_CLIENT = r"""
import socket, sys
for where in sys.argv[1:]:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(where if not where.startswith("@") else "\0" + where[1:])
        print(where, "answered", s.recv(200).decode(errors="replace"))
    except OSError as exc:
        print(where, "refused", exc.errno)
"""


@attack(
    "bwrap_host_unix_socket",
    finding="a command reaches a unix socket of the host (a path outside the root, or abstract)",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_host_unix_socket(arena: Arena) -> None:
    path = arena.host / "agent.sock"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"agentvfs-arena-{secrets.token_hex(6)}"
    abstract.bind("\0" + name)
    abstract.listen()
    abstract.settimeout(0.2)

    def serve_abstract() -> None:
        with contextlib.suppress(OSError):
            while True:
                try:
                    conn, _ = abstract.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.sendall(arena.secret.encode())

    thread = threading.Thread(target=serve_abstract, daemon=True)
    thread.start()
    try:
        with _host_socket(path, arena.secret.encode()):
            arena.snapshot()
            await arena.open(isolation="bwrap")
            await arena.tool("write_file", path="client.py", content=_SOCKET_CLIENT)
            targets = [str(path), f"/proc/1/root{path}", f"/proc/self/root{path}", f"@{name}"]
            out = await arena.sh(f"{sys.executable} client.py {' '.join(targets)}")
            for target in targets:
                line = next((line for line in out.splitlines() if line.startswith(target + " ")), "")
                arena.record("answered" not in line, f"reached {target}: {line[:200]!r}")
            arena.check_secret(out, "host unix sockets")
            # Through a descriptor of the socket's directory, opened by handle.
            handle = _file_handle(arena.host)
            if handle is not None:
                await arena.tool("write_file", path="handle_dir.py", content=_HANDLE_DIRECTORY)
                out = await arena.sh(f"{sys.executable} handle_dir.py {handle[0]} {handle[1].hex()}")
                arena.record("socket answered" not in out, f"reached the socket through a handle: {out[:200]!r}")
                arena.check_secret(out, "a host unix socket through a directory handle")
                with contextlib.suppress(OSError):
                    (arena.host / "made-by-handle.txt").unlink()
    finally:
        abstract.close()
        thread.join(timeout=2)
    arena.snapshot()


@attack(
    "bwrap_host_environment",
    finding="the host's secrets show in the sandbox (/proc/$PPID/environ, env)",
    severity="high",
    requires=("bwrap",),
)
async def bwrap_host_environment(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    for command in (
        "env",
        "cat /proc/$PPID/environ",
        "cat /proc/1/environ",
        "for f in /proc/[0-9]*/environ; do cat $f; done",
        "cat /proc/self/root/proc/1/environ",
        f"grep -r {arena.secret[:12]} /proc/*/environ",
    ):
        out = await arena.sh(command)
        arena.check_secret(out, command)


# -- the mount manager's state ------------------------------------------------------------------

_CRASHING_SANDBOX = r"""
import anyio, os, signal, sys
from agentvfs import LocalFilesystem
from agentvfs.sandbox import LocalSandbox

async def main():
    sandbox = LocalSandbox(working_directory=sys.argv[1])
    result = await sandbox.mount(LocalFilesystem(sys.argv[2]), sys.argv[3])
    print("mounted" if result["success"] else result, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)   # a crash: the marker and the link stay

anyio.run(main)
"""


@contextlib.contextmanager
def _configured_directory() -> Iterator[Path]:
    """A directory the configuration mounts: outside the arena (whose base is watched), as a
    user's data directory would be."""
    path = Path(tempfile.mkdtemp(prefix="agentvfs-arena-data-"))
    (path / "configured.txt").write_text("configured\n")
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _crash_a_sandbox(arena: Arena, data: Path, mount_path: str) -> str:
    """Mount ``data`` at ``mount_path`` of the arena's root in another process that then dies
    with SIGKILL, as a crashed agent would (its marker and link stay behind)."""
    script = data.parent / f"{data.name}-crashing_sandbox.py"
    script.write_text(_CRASHING_SANDBOX)
    done = subprocess.run(
        [sys.executable, str(script), str(arena.root), str(data), mount_path],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    script.unlink()
    return done.stdout + done.stderr


@attack(
    "mount_marker_repointed_link",
    finding="the agent re-points a read-write mount's link; after a crash the next sandbox binds its target",
    severity="high",
)
async def mount_marker_repointed_link(arena: Arena) -> None:
    from ..vfs import LocalFilesystem

    with _configured_directory() as data:
        for isolation in ("none", "bwrap") if _bwrap_works() else ("none",):
            # A first sandbox mounted /data and crashed; the agent then re-points the link.
            out = _crash_a_sandbox(arena, data, "/data")
            arena.record("mounted" in out, f"the crashing sandbox did not mount: {out[-300:]!r}")
            await arena.open(isolation=isolation)
            await arena.sh(f"rm -f data && ln -s {arena.host} data")
            arena.snapshot()
            # The next sandbox on the same working directory mounts /data again.
            await arena.open(isolation=isolation, mounts={"/data": LocalFilesystem(str(data))})
            out = await arena.sh("cat data/secret.txt; echo pwned > data/pwned.txt; ls data")
            arena.check_secret(out, f"{isolation}: read through the re-pointed link")
            arena.check_outside(f"{isolation}: wrote through the re-pointed link")
            arena.record("configured.txt" in out, f"{isolation}: /data is not the configured directory: {out[:200]!r}")
            await arena.close()
            arena.snapshot()


@attack(
    "mount_parent_symlink",
    finding="the agent replaces a mount point's parent with a symlink; the host creates or mounts outside",
    severity="medium",
)
async def mount_parent_symlink(arena: Arena) -> None:
    from ..vfs import LocalFilesystem

    with _configured_directory() as data:
        mounts = {"/deep/data": LocalFilesystem(str(data)), "/deep/ro": LocalFilesystem(str(data), read_only=True)}
        await arena.open(mounts=mounts)
        await arena.close()
        # Between two starts the agent replaces the mount points' parent with a link out.
        await arena.open()
        await arena.sh(f"rm -rf deep && ln -s {arena.host} deep")
        arena.snapshot()
        for _ in arena.iterations(3, seconds=30):
            await arena.open(mounts=mounts)
            arena.check_outside("a mount below a symlinked parent")
            out = await arena.sh("ls deep/; ls deep/data deep/ro")
            arena.check_secret(out, "a listing below a symlinked parent")
            await arena.close()
            arena.check_outside("the unmount below a symlinked parent")


def _bwrap_works() -> bool:
    from ..sandbox import detect_isolation

    return bool(detect_isolation()["available"])


# -- processes ----------------------------------------------------------------------------------


def _tagged_sleepers(tag: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if argv and argv[0].endswith(b"sleep") and any(tag.encode() in a for a in argv) and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


_ESCAPES = (
    "setsid sleep {t}1 &",
    "(sleep {t}2 &)",
    "nohup setsid sh -c 'sleep {t}3' >/dev/null 2>&1 &",
    "sh -c 'setsid sh -c \"sleep {t}4 & exit\" &'",
)


@attack(
    "setsid_outlives_stop",
    finding="setsid sleep or a double fork outlives the sandbox's stop() and destroy()",
    severity="low",
)
async def setsid_outlives_stop(arena: Arena) -> None:
    for isolation in ("none", "bwrap") if _bwrap_works() else ("none",):
        for how in ("stop", "destroy"):
            tag = "6" + "".join(str(secrets.randbelow(10)) for _ in range(7))
            await arena.open(isolation=isolation)
            for index, escape in enumerate(_ESCAPES):
                await arena.sh(escape.format(t=f"{tag}{index}") + " echo started")
                await arena.sh(escape.format(t=f"{tag}b{index}") + " sleep 60", background=True)
            await anyio.sleep(0.3)
            sandbox = arena.workspace.sandbox
            assert sandbox is not None
            if how == "stop":
                await sandbox.stop()
            else:
                await sandbox.destroy()
            with anyio.move_on_after(10):
                while _tagged_sleepers(tag):  # noqa: ASYNC110 (other processes)
                    await anyio.sleep(0.05)
            left = _tagged_sleepers(tag)
            arena.record(not left, f"{isolation}: {len(left)} processes outlived {how}()")
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            await arena.close()


# -- resources ----------------------------------------------------------------------------------

_LIMITS = {"max_processes": 64, "max_memory_bytes": 256 << 20, "max_cpu_seconds": 2, "max_file_size_bytes": 16 << 20}


@attack(
    "resource_exhaustion",
    finding="a fork bomb, a memory hog, a CPU burner or a disk filler takes the host down",
    severity="medium",
)
async def resource_exhaustion(arena: Arena) -> None:
    from ..sandbox._limits import detect_cgroups

    support, _reason = detect_cgroups()
    # Root is exempt from RLIMIT_NPROC: without a pids cgroup a fork bomb would be real.
    bomb_contained = (support is not None and support.pids) or os.getuid() != 0
    filler = arena.root / "filler.bin"
    for isolation in ("none", "bwrap") if _bwrap_works() else ("none",):
        await arena.open(isolation=isolation, native_sandbox=dict(_LIMITS))
        if bomb_contained:
            started = time.monotonic()
            out = await arena.sh("bomb() { bomb | bomb & }; bomb; sleep 2; echo bomb-over", timeout_ms=30_000)
            alive = await arena.sh("echo alive")
            arena.record(
                alive.strip() == "alive" and time.monotonic() - started < 40,
                f"{isolation}: after a fork bomb: {out[-200:]!r}",
            )
        hog = "import sys; chunks = [bytearray(64 << 20) for _ in range(64)]; print('allocated')"
        await arena.tool("write_file", path="hog.py", content=hog)
        out = await arena.sh(f"{sys.executable} hog.py", timeout_ms=60_000)
        # A traceback quotes the line, so only the printed word on a line of its own counts.
        allocated = any(line.strip() == "allocated" for line in out.splitlines())
        arena.record(not allocated, f"{isolation}: 4 GiB allocated past a 256 MiB limit")
        started = time.monotonic()
        out = await arena.sh("while :; do :; done", timeout_ms=60_000)
        arena.record(
            "timed out" not in out and time.monotonic() - started < 30,
            f"{isolation}: CPU burner not stopped: {out[-200:]!r}",
        )
        await arena.sh("head -c 200000000 /dev/zero > filler.bin; ls -l filler.bin", timeout_ms=60_000)
        size = _size(filler)
        arena.record(size <= 16 << 20, f"{isolation}: a {size}-byte file past a 16 MiB limit")
        with contextlib.suppress(OSError):
            filler.unlink()
        await arena.close()


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
