"""The seccomp filter of isolated commands: its numbers, its shape, and what it refuses in a
real bubblewrap sandbox (each call made through ctypes by a Python inside)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import sys
from pathlib import Path

import pytest

from agentvfs.sandbox import LocalSandbox
from agentvfs.sandbox._isolation import detect_isolation
from agentvfs.sandbox._seccomp import (
    ARCHITECTURES,
    DENIED_SYSCALLS,
    SeccompArchitecture,
    build_filter,
    native_architecture,
)

pytestmark = pytest.mark.anyio

BWRAP = detect_isolation()
needs_bwrap = pytest.mark.skipif(not BWRAP["available"], reason=f"bubblewrap unusable here: {BWRAP['message']}")


def _header_numbers(path: str, pattern: str) -> dict[str, int]:
    text = Path(path).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(pattern, text)}


@pytest.mark.parametrize(
    ("arch", "header", "pattern"),
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"#define __NR_(\w+) (\d+)"),
        ("aarch64", "/usr/include/asm-generic/unistd.h", r"#define __NR(?:3264)?_(\w+) (\d+)"),
    ],
)
def test_numbers_match_the_kernel_headers(arch: str, header: str, pattern: str) -> None:
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed")
    numbers = _header_numbers(header, pattern)
    for name, number in ARCHITECTURES[arch].numbers.items():
        if name in numbers:  # headers older than the call lack it
            assert numbers[name] == number, f"{arch} {name}: header says {numbers[name]}, filter {number}"


def test_program_shape() -> None:
    program = build_filter()
    assert len(program) % 8 == 0
    instructions = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    # Load the architecture, compare, kill on a mismatch; then load the number.
    arch = native_architecture()
    assert arch is not None
    assert instructions[0] == (0x20, 0, 0, 4)
    assert instructions[1] == (0x15, 1, 0, arch.audit_arch)
    assert instructions[2] == (0x06, 0, 0, 0x80000000)
    assert instructions[3] == (0x20, 0, 0, 0)
    # Every jump lands inside the program; it ends with return instructions.
    for index, (op, jt, jf, _k) in enumerate(instructions):
        if op & 0x07 == 0x05:
            assert index + 1 + max(jt, jf) < len(instructions)
    assert instructions[-1][0] == 0x06
    # Both architectures assemble (the jumps fit in 8 bits).
    for known in ARCHITECTURES.values():
        assert build_filter(known)


def test_unknown_architecture_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("platform.machine", lambda: "riscv64")
    assert native_architecture() is None
    with pytest.raises(ValueError, match="no seccomp filter for the riscv64 architecture"):
        build_filter()
    # A table of its own assembles (the caller vouches for its numbers).
    assert build_filter(SeccompArchitecture("riscv64", 0xC00000F3, {"mount": 40}))


def test_the_denied_list_covers_the_issue() -> None:
    for name in (
        "open_by_handle_at", "name_to_handle_at", "mount", "umount2", "pivot_root", "move_mount",
        "fsopen", "fsmount", "fsconfig", "open_tree", "mount_setattr", "setns", "keyctl", "add_key",
        "request_key", "bpf", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev",
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "iopl",
        "ioperm", "swapon", "swapoff", "reboot", "acct", "quotactl", "userfaultfd", "chroot",
        "syslog", "settimeofday", "clock_settime", "adjtimex", "lookup_dcookie", "clone3",
    ):  # fmt: skip
        assert name in DENIED_SYSCALLS, name


# Each line: a label, then what the call returned (0 or more) or the errno name.
_PROBE = r"""
import ctypes, errno, os, sys
nr = {nr}
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    ctypes.set_errno(0)
    res = libc.syscall(nr[name], *[ctypes.c_long(a) for a in args])
    print(name, errno.errorcode.get(ctypes.get_errno(), "ok") if res < 0 else "ok")
def buf(text):
    return ctypes.cast(ctypes.c_char_p(text.encode()), ctypes.c_void_p).value
call("mount", buf("none"), buf("/tmp"), buf("tmpfs"), 0, 0)
call("umount2", buf("/tmp"), 0)
call("pivot_root", buf("/tmp"), buf("/tmp"))
call("open_by_handle_at", 3, 0, 0)
call("name_to_handle_at", -100, buf("/"), 0, 0, 0)
call("fsopen", buf("tmpfs"), 0)
call("open_tree", -100, buf("/"), 0)
call("keyctl", 0, 0, 0, 0, 0)
call("bpf", 0, 0, 0)
call("perf_event_open", 0, 0, -1, -1, 0)
call("ptrace", 0, 0, 0, 0)
call("process_vm_readv", 1, 0, 0, 0, 0, 0)
call("setns", 0, 0)
call("unshare", 0x10000000)
call("unshare", 0x00020000)
call("unshare", 0x00000400)
call("clone", 0x10000000 | 17, 0, 0, 0, 0)
call("clone3", 0, 0)
call("mknodat", -100, buf("/tmp/chr"), 0o020644, 0x0103)
call("mknodat", -100, buf("/tmp/blk"), 0o060644, 0x0801)
call("mknodat", -100, buf("/tmp/fifo"), 0o010644, 0)
call("personality", 0xFFFFFFFF)
call("personality", 0x0040000)
call("ioctl", 0, 0x5412, 0)
call("syslog", 3, 0, 0)
call("settimeofday", 0, 0)
call("chroot", buf("/tmp"))
call("reboot", 0, 0, 0, 0)
call("init_module", 0, 0, 0)
call("userfaultfd", 0)
call("io_uring_setup", 1, 0)
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.WEXITSTATUS(os.waitpid(pid, 0)[1]))
"""

_EXPECTED = {
    "mount": "EPERM", "umount2": "EPERM", "pivot_root": "EPERM", "open_by_handle_at": "EPERM",
    "name_to_handle_at": "EPERM", "fsopen": "EPERM", "open_tree": "EPERM", "keyctl": "EPERM",
    "bpf": "EPERM", "perf_event_open": "EPERM", "ptrace": "EPERM", "process_vm_readv": "EPERM",
    "setns": "EPERM", "clone": "EPERM", "clone3": "ENOSYS", "syslog": "EPERM",
    "settimeofday": "EPERM", "chroot": "EPERM", "reboot": "EPERM", "init_module": "EPERM",
    "userfaultfd": "EPERM", "io_uring_setup": "ENOSYS", "ioctl": "EPERM",
}  # fmt: skip


@needs_bwrap
async def test_dangerous_calls_are_refused_and_ordinary_ones_work(tmp_path: Path) -> None:
    arch = native_architecture()
    assert arch is not None
    probe = _PROBE.format(nr=dict(arch.numbers))
    (tmp_path / "probe.py").write_text(probe)
    sandbox = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap")
    try:
        result = await sandbox.execute_command(f"{sys.executable} probe.py")
    finally:
        await sandbox.destroy()
    assert result.exit_code == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    seen: dict[str, list[str]] = {}
    for name, outcome in lines:
        seen.setdefault(name, []).append(outcome)
    for name, errno_name in _EXPECTED.items():
        assert seen[name] == [errno_name], (name, seen[name])
    # unshare: a user or mount namespace refused; CLONE_FILES (no namespace) allowed.
    assert seen["unshare"] == ["EPERM", "EPERM", "ok"]
    # mknod: character and block devices refused, a FIFO made.
    assert seen["mknodat"] == ["EPERM", "EPERM", "ok"]
    # personality: a query works, a change is refused.
    assert seen["personality"] == ["ok", "EPERM"]
    assert seen["fork"] == ["7"]


_X32_AND_I386 = r"""
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    if (argv[1][0] == 'x') {
        long r = syscall(39 | 0x40000000);   /* getpid through the x32 ABI */
        printf("x32 %ld\n", r);
        return 0;
    }
    long r;
    __asm__ volatile ("int $0x80" : "=a"(r) : "a"(20) : "memory");   /* i386 getpid */
    printf("i386 %ld\n", r);
    return 0;
}
"""


@needs_bwrap
@pytest.mark.skipif(native_architecture() is None or native_architecture().name != "x86_64", reason="x86-64 ABIs")  # type: ignore[union-attr]
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the probe")
async def test_other_abis_on_x86_64_are_refused(tmp_path: Path) -> None:
    (tmp_path / "abi.c").write_text(_X32_AND_I386)
    sandbox = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap")
    try:
        built = await sandbox.execute_command("gcc -O0 -o abi abi.c")
        assert built.exit_code == 0, built.stderr
        x32 = await sandbox.execute_command("./abi x")
        i386 = await sandbox.execute_command("./abi i; echo status=$?")
    finally:
        await sandbox.destroy()
    assert x32.stdout == "x32 -1\n"  # EPERM, not a pid
    # An int 0x80 call kills the process (SIGSYS): no line printed, status 128 + 31.
    assert "i386" not in i386.stdout and "status=159" in i386.stdout


# -- the program run by an interpreter of classic BPF -------------------------------------------

_ALLOW, _EPERM, _ENOSYS, _KILL = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000
_O_CREAT, _O_TMPFILE = 0o100, 0o20200000


def _run(program: bytes, arch: SeccompArchitecture, name: str, *args: int) -> int:
    """What the filter answers to ``name(*args)``: a little interpreter of the instructions
    the filter uses (loads of seccomp_data words, jumps, AND, returns)."""
    data = struct.pack("<IIQ6Q", arch.numbers[name], arch.audit_arch, 0, *(list(args) + [0] * (6 - len(args))))
    code: list[tuple[int, int, int, int]] = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:  # ld [k]
            (acc,) = struct.unpack_from("<I", data, k)
        elif op == 0x54:  # and #k
            acc &= k
        elif op == 0x15:  # jeq #k
            pc += jt if acc == k else jf
        elif op == 0x35:  # jge #k
            pc += jt if acc >= k else jf
        elif op == 0x45:  # jset #k
            pc += jt if acc & k else jf
        elif op == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"instruction {op:#x} not known to the interpreter")


@pytest.mark.parametrize("arch", list(ARCHITECTURES.values()), ids=list(ARCHITECTURES))
def test_set_id_modes_are_refused_by_the_program(arch: SeccompArchitecture) -> None:
    program = build_filter(arch)

    def run(name: str, *args: int) -> int:
        return _run(program, arch, name, *args)

    high = 0xFFFFFFFF << 32  # the kernel reads an int or umode_t: the high half never counts
    for name, at in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2), ("creat", 1)):
        if name not in arch.numbers:
            continue
        for mode, expected in (
            (0o4755, _EPERM), (0o2755, _EPERM), (0o6755, _EPERM), (0o4000, _EPERM),
            (0o755, _ALLOW), (0o1777, _ALLOW), (0o777, _ALLOW), (0, _ALLOW),
            (high | 0o755, _ALLOW), (high | 0o4755, _EPERM),
        ):  # fmt: skip
            args = [3, 0, 0]
            args[at] = mode
            assert run(name, *args) == expected, (name, oct(mode))
    for name, flags_at in (("open", 1), ("openat", 2)):
        if name not in arch.numbers:
            continue

        def call(flags: int, mode: int, name: str = name, flags_at: int = flags_at) -> int:
            args = [-100 & 0xFFFFFFFF, 0, 0, 0]
            args[flags_at], args[flags_at + 1] = flags, mode
            return run(name, *args)

        assert call(_O_CREAT | 1, 0o4755) == _EPERM
        assert call(_O_CREAT | 1, 0o2644) == _EPERM
        assert call(_O_TMPFILE | 2, 0o4755) == _EPERM
        assert call(_O_CREAT | 1, 0o1777) == _ALLOW
        assert call(_O_CREAT | 1, 0o644) == _ALLOW
        # Without O_CREAT or O_TMPFILE the mode register is whatever the caller left there.
        assert call(0, 0o4755) == _ALLOW
        assert call(high | 2, high | 0o6777) == _ALLOW
    for name, at in (("mknod", 1), ("mknodat", 2)):
        if name not in arch.numbers:
            continue

        def node(mode: int, name: str = name, at: int = at) -> int:
            args = [3, 0, 0, 0]
            args[at] = mode
            return run(name, *args)

        assert node(0o100000 | 0o4755) == _EPERM  # a set-user-ID regular file
        assert node(0o010000 | 0o2644) == _EPERM
        assert node(0o020000 | 0o644) == _EPERM  # a character device, as before
        assert node(0o010000 | 0o644) == _ALLOW  # a FIFO
        assert node(0o100000 | 0o1755) == _ALLOW
    # openat2's mode is in memory: not there, so the C library falls back to openat.
    assert run("openat2", 0, 0, 0, 24) == _ENOSYS
    # Unrelated calls are untouched.
    assert run("ioctl", 0, 0x5413, 0) == _ALLOW
    assert run("mount", 0, 0, 0, 0, 0) == _EPERM


_SET_ID = r"""
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
def attempt(label, fn):
    try:
        fn()
        print(label, "ok")
    except OSError as exc:
        print(label, "errno", exc.errno)
def make(name, mode):
    os.close(os.open(name, os.O_WRONLY | os.O_CREAT, mode))
attempt("open-4755", lambda: make("a", 0o4755))
attempt("open-1755", lambda: make("b", 0o1755))
attempt("chmod-2755", lambda: os.chmod("b", 0o2755))
attempt("chmod-0700", lambda: os.chmod("b", 0o700))
attempt("open-plain", lambda: os.close(os.open("b", os.O_RDONLY, 0o6777)))
attempt("tmpfile-4755", lambda: os.close(os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o4755)))
def openat2():
    how = struct.pack("QQQ", os.O_WRONLY | os.O_CREAT, 0o4755, 0)
    if libc.syscall(437, -100, b"c", how, len(how)) < 0:
        raise OSError(ctypes.get_errno(), "openat2")
attempt("openat2", openat2)
"""


@needs_bwrap
async def test_set_id_modes_are_refused_in_a_sandbox(tmp_path: Path) -> None:
    (tmp_path / "setid.py").write_text(_SET_ID)
    sandbox = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap")
    try:
        result = await sandbox.execute_command(f"{sys.executable} setid.py; cp /bin/sh sh && chmod u+s sh; ls -l sh")
    finally:
        await sandbox.destroy()
    seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.split(" ", 1)[0] in _SET_ID)
    assert seen == {
        "open-4755": "errno 1", "open-1755": "ok", "chmod-2755": "errno 1", "chmod-0700": "ok",
        "open-plain": "ok", "tmpfile-4755": "errno 1", "openat2": "errno 38",
    }, result  # fmt: skip
    assert "chmod: changing permissions of 'sh': Operation not permitted" in result.stderr
    for path in tmp_path.iterdir():
        assert not path.lstat().st_mode & 0o6000, path
    assert (tmp_path / "b").stat().st_mode & 0o7777 == 0o700
