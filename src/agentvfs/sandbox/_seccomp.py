"""The seccomp filter of isolated commands: a classic-BPF program built here, no dependency.

bubblewrap loads the program given with ``--seccomp FD`` right before it executes the command,
so bwrap's own setup (mounts, namespaces) is not affected and every process of the command
inherits the filter. The filter refuses what a command never needs and what turns a kernel
bug or a leftover privilege into an escape:

* handles to files anywhere on the disk (``open_by_handle_at``, ``name_to_handle_at``);
* the mount API old and new (``mount``, ``umount2``, ``pivot_root``, ``open_tree``,
  ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``mount_setattr``) and
  ``chroot``;
* new namespaces (``unshare`` and ``clone`` with a namespace flag, ``setns``); ``clone3``
  answers ENOSYS, because its flags are in memory where a BPF program cannot read them, and
  the C library then falls back to ``clone``, whose flags are checked;
* the kernel keyring, eBPF, perf events, ``userfaultfd``, io_uring (it runs system calls the
  filter never sees; ENOSYS, so programs fall back to ordinary I/O);
* other processes' memory (``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``,
  ``pidfd_getfd``, ``process_madvise``);
* device nodes: ``mknod``/``mknodat`` with ``S_IFCHR`` or ``S_IFBLK`` in the mode (FIFOs,
  sockets and regular files stay allowed);
* set-user-ID and set-group-ID files: ``chmod``, ``fchmod``, ``fchmodat``, ``fchmodat2``,
  ``creat``, ``mknod``/``mknodat``, and ``open``/``openat`` that create a file (``O_CREAT`` or
  ``O_TMPFILE``), each with ``S_ISUID`` or ``S_ISGID`` in the mode. Such a file would be owned
  on the host by the sandbox's user, which is the host's root when this process is root
  (bubblewrap's user namespace maps the sandbox's uid to the uid that started it): any local
  user could then run it as root. The mounts of the sandbox are ``nosuid``, so inside it the
  bits never mattered. ``S_ISVTX`` and every other mode stay allowed; ``openat2`` answers
  ENOSYS, because its mode is in memory where a BPF program cannot read it, and the C library
  then falls back to ``openat``, whose mode is checked;
* the machine itself: modules, ``kexec``, ``reboot``, swap, ``acct``, quotas, ``iopl`` and
  ``ioperm``, the clock (``settimeofday``, ``clock_settime``, ``adjtimex``,
  ``clock_adjtime``), ``syslog``, ``lookup_dcookie``, ``fanotify_init``, ``uselib``;
* typing into a terminal (``ioctl`` ``TIOCSTI``, and ``TIOCLINUX``);
* ``personality`` other than the default (``PER_LINUX``) or a query.

Refused calls fail with EPERM, so a program sees an ordinary "operation not permitted". A
system call of another architecture (a 32-bit ``int 0x80`` on x86-64) kills the process: its
numbers mean other calls, and the x32 ABI on x86-64 (numbers with bit 30 set) is refused.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "ARCHITECTURES",
    "DENIED_SYSCALLS",
    "SeccompArchitecture",
    "build_filter",
    "native_architecture",
    "native_filter",
]

# Offsets into ``struct seccomp_data``: nr (u32), arch (u32), instruction pointer (u64),
# args[6] (u64 each; both supported architectures are little-endian, so the low half of
# argument i is at 16 + 8 * i).
_NR = 0
_ARCH = 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


# Classic BPF opcodes (linux/filter.h).
_LD_W_ABS = 0x20
_JMP_JEQ_K = 0x15
_JMP_JGE_K = 0x35
_JMP_JSET_K = 0x45
_ALU_AND_K = 0x54
_RET_K = 0x06

# Return values (linux/seccomp.h).
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000

_X32_SYSCALL_BIT = 0x40000000

# Namespace flags of clone(2) and unshare(2). CLONE_NEWTIME (0x80) exists only for unshare
# and clone3: in clone's flags that bit belongs to the exit signal.
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_CLONE_NEWTIME = 0x00000080

_S_IFMT = 0o170000
_S_IFCHR = 0o020000
_S_IFBLK = 0o060000
_S_SETID = 0o4000 | 0o2000  # S_ISUID | S_ISGID

# open(2) flags under which the mode argument is used (the kernel's WILL_CREATE): O_CREAT and
# __O_TMPFILE (O_TMPFILE without O_DIRECTORY), the same on x86-64 and the generic ABI of arm64.
_O_CREAT = 0o100
_O_TMPFILE_BIT = 0o20000000

_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C

_PER_LINUX = 0x0
_PER_QUERY = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class SeccompArchitecture:
    """The system-call numbers of one architecture.

    Attributes
    ----------
    name : str
        ``platform.machine()`` spelling (``x86_64``, ``aarch64``).
    audit_arch : int
        ``AUDIT_ARCH_*``: what the kernel reports in ``seccomp_data.arch``.
    numbers : mapping
        System-call name -> number, for every call the filter names.
    x32 : bool
        Whether numbers with bit 30 set (the x32 ABI) must be refused.
    """

    name: str
    audit_arch: int
    numbers: Mapping[str, int]
    x32: bool = False


# From the kernel's arch/x86/entry/syscalls/syscall_64.tbl (checked against this machine's
# <asm/unistd_64.h> by the tests).
_X86_64 = {
    "open": 2, "ioctl": 16, "clone": 56, "creat": 85, "chmod": 90, "fchmod": 91,
    "ptrace": 101, "syslog": 103, "mknod": 133, "uselib": 134, "personality": 135,
    "pivot_root": 155, "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164,
    "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172,
    "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246, "add_key": 248,
    "request_key": 249, "keyctl": 250, "openat": 257, "mknodat": 259, "fchmodat": 268,
    "unshare": 272, "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "openat2": 437,
    "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
    "fchmodat2": 452,
}  # fmt: skip

# From the kernel's include/uapi/asm-generic/unistd.h (arm64 has no mknod, iopl, ioperm or
# uselib, nor open, creat or chmod: only their *at forms).
_AARCH64 = {
    "lookup_dcookie": 18, "ioctl": 29, "mknodat": 33, "umount2": 39, "mount": 40,
    "pivot_root": 41, "chroot": 51, "fchmod": 52, "fchmodat": 53, "openat": 56,
    "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97, "kexec_load": 104,
    "init_module": 105, "delete_module": 106, "clock_settime": 112, "syslog": 116,
    "ptrace": 117, "reboot": 142, "settimeofday": 170, "adjtimex": 171, "add_key": 217,
    "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224, "swapoff": 225,
    "perf_event_open": 241, "fanotify_init": 262, "name_to_handle_at": 264,
    "open_by_handle_at": 265, "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270,
    "process_vm_writev": 271, "kcmp": 272, "finit_module": 273, "bpf": 280,
    "userfaultfd": 282, "kexec_file_load": 294, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
    "openat2": 437, "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
    "quotactl_fd": 443, "fchmodat2": 452,
}  # fmt: skip

#: The architectures the filter knows, by ``platform.machine()`` name.
ARCHITECTURES: Mapping[str, SeccompArchitecture] = {
    "x86_64": SeccompArchitecture("x86_64", 0xC000003E, _X86_64, x32=True),
    "aarch64": SeccompArchitecture("aarch64", 0xC00000B7, _AARCH64),
}
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

#: Calls refused whatever their arguments, with the errno they fail with.
DENIED_SYSCALLS: Mapping[str, int] = {
    **dict.fromkeys(
        (
            "open_by_handle_at", "name_to_handle_at", "mount", "umount2", "pivot_root",
            "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
            "mount_setattr", "chroot", "setns", "keyctl", "add_key", "request_key", "bpf",
            "perf_event_open", "userfaultfd", "ptrace", "process_vm_readv",
            "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise", "kexec_load",
            "kexec_file_load", "init_module", "finit_module", "delete_module", "iopl",
            "ioperm", "swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd",
            "syslog", "settimeofday", "clock_settime", "adjtimex", "clock_adjtime",
            "lookup_dcookie", "fanotify_init", "uselib",
        ),
        errno.EPERM,
    ),
    # Not there, rather than refused: callers fall back (clone3 -> clone, io_uring -> read,
    # openat2 -> openat).
    **dict.fromkeys(
        ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register", "openat2"), errno.ENOSYS
    ),
}  # fmt: skip


def native_architecture() -> SeccompArchitecture | None:
    """The architecture of this machine, or None when the filter does not know it."""
    machine = platform.machine().lower()
    return ARCHITECTURES.get(_ALIASES.get(machine, machine))


class _Program:
    """Classic-BPF instructions, with jumps to the refusals at the end resolved at the end."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int | str, int | str, int]] = []

    def emit(self, op: int, k: int = 0, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((op, jt, jf, k))

    def assemble(self, labels: Mapping[str, int]) -> bytes:
        out = bytearray()
        for index, (op, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                if isinstance(target, str):
                    # Jump offsets count from the next instruction and hold 8 bits.
                    target = labels[target] - index - 1
                if not 0 <= target <= 255:
                    raise ValueError(f"seccomp filter jump out of range at instruction {index}")
                offsets.append(target)
            out += struct.pack("<HBBI", op, offsets[0], offsets[1], k & 0xFFFFFFFF)
        return bytes(out)


def build_filter(arch: SeccompArchitecture | None = None) -> bytes:
    """The filter as the bytes bubblewrap reads from ``--seccomp FD``: an array of
    ``struct sock_filter`` (8 bytes each) in this machine's byte order.

    Parameters
    ----------
    arch : SeccompArchitecture, optional
        This machine's (:func:`native_architecture`) by default.

    Raises
    ------
    ValueError
        The architecture is unknown here (the filter's numbers would be wrong): only
        x86_64 and aarch64 are supported.
    """
    arch = arch or native_architecture()
    if arch is None:
        known = ", ".join(ARCHITECTURES)
        raise ValueError(
            f"no seccomp filter for the {platform.machine()} architecture (known: {known}); "
            "commands cannot be isolated here"
        )
    numbers = arch.numbers
    program = _Program()
    emit = program.emit
    # Anything but this architecture's calling convention dies: its numbers mean other calls.
    emit(_LD_W_ABS, _ARCH)
    emit(_JMP_JEQ_K, arch.audit_arch, jt=1, jf=0)
    emit(_RET_K, _RET_KILL_PROCESS)
    emit(_LD_W_ABS, _NR)
    if arch.x32:
        emit(_JMP_JGE_K, _X32_SYSCALL_BIT, jt="eperm", jf=0)
    # Calls refused outright, each one compare: the accumulator keeps the number throughout.
    for name, code in DENIED_SYSCALLS.items():
        if name in numbers:
            emit(_JMP_JEQ_K, numbers[name], jt=f"errno{code}", jf=0)
    # Calls judged by their arguments: a block is skipped unless the number matches.
    for name, check in _argument_checks(numbers):
        if name not in numbers:
            continue
        emit(_JMP_JEQ_K, numbers[name], jt=0, jf=len(check))
        program.code.extend(check)
    emit(_RET_K, _RET_ALLOW)
    labels: dict[str, int] = {}
    for code in sorted({errno.EPERM, *DENIED_SYSCALLS.values()}):
        labels[f"errno{code}"] = len(program.code)
        emit(_RET_K, _RET_ERRNO | code)
    labels["eperm"] = labels[f"errno{errno.EPERM}"]
    return program.assemble(labels)


@functools.cache
def native_filter() -> bytes:
    """:func:`build_filter` for this machine, built once per process.

    Raises
    ------
    ValueError
        As :func:`build_filter`.
    """
    return build_filter()


def _argument_checks(numbers: Mapping[str, int]) -> Iterable[tuple[str, list[tuple[int, int | str, int | str, int]]]]:
    """``(call, instructions)`` for the calls judged by an argument. Each block decides:
    it allows the call or jumps to ``eperm`` (no later rule could match the same call)."""

    def block(*instructions: tuple[int, int, int | str, int | str]) -> list[tuple[int, int | str, int | str, int]]:
        return [(op, jt, jf, k) for op, k, jt, jf in instructions]

    allow = (_RET_K, _RET_ALLOW, 0, 0)
    # clone(flags, ...) and unshare(flags): no namespace flag.
    yield "clone", block(
        (_LD_W_ABS, _arg_low(0), 0, 0),
        (_JMP_JSET_K, _CLONE_NAMESPACES, "eperm", 0),
        allow,
    )
    yield "unshare", block(
        (_LD_W_ABS, _arg_low(0), 0, 0),
        (_JMP_JSET_K, _CLONE_NAMESPACES | _CLONE_NEWTIME, "eperm", 0),
        allow,
    )
    # Every argument checked below is an int or a umode_t: the kernel truncates the register
    # to 32 (or 16) bits, so the low half is all of it and the high half is never looked at.
    #
    # mknod(path, mode, dev) and mknodat(dirfd, path, mode, dev): no device nodes, and no
    # set-ID regular file (mknod makes one with the mode as given).
    for name, index in (("mknod", 1), ("mknodat", 2)):
        if name in numbers:
            yield name, block(
                (_LD_W_ABS, _arg_low(index), 0, 0),
                (_JMP_JSET_K, _S_SETID, "eperm", 0),
                (_ALU_AND_K, _S_IFMT, 0, 0),
                (_JMP_JEQ_K, _S_IFCHR, "eperm", 0),
                (_JMP_JEQ_K, _S_IFBLK, "eperm", 0),
                allow,
            )
    # chmod(path, mode), fchmod(fd, mode), fchmodat(dirfd, path, mode[, flags]) and
    # creat(path, mode): no S_ISUID or S_ISGID in the mode.
    for name, index in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2), ("creat", 1)):
        if name in numbers:
            yield name, block(
                (_LD_W_ABS, _arg_low(index), 0, 0),
                (_JMP_JSET_K, _S_SETID, "eperm", 0),
                allow,
            )
    # open(path, flags, mode) and openat(dirfd, path, flags, mode): the mode counts only when
    # the call creates a file; otherwise the register holds whatever the caller left there.
    for name, flags, mode in (("open", 1, 2), ("openat", 2, 3)):
        if name in numbers:
            yield name, block(
                (_LD_W_ABS, _arg_low(flags), 0, 0),
                (_JMP_JSET_K, _O_CREAT | _O_TMPFILE_BIT, 0, 2),
                (_LD_W_ABS, _arg_low(mode), 0, 0),
                (_JMP_JSET_K, _S_SETID, "eperm", 0),
                allow,
            )
    # ioctl(fd, request, ...): the request is an unsigned int, so its low half is all of it.
    yield "ioctl", block(
        (_LD_W_ABS, _arg_low(1), 0, 0),
        (_JMP_JEQ_K, _TIOCSTI, "eperm", 0),
        (_JMP_JEQ_K, _TIOCLINUX, "eperm", 0),
        allow,
    )
    # personality(persona): only the default, or the query that changes nothing.
    yield "personality", block(
        (_LD_W_ABS, _arg_low(0), 0, 0),
        (_JMP_JEQ_K, _PER_LINUX, 1, 0),
        (_JMP_JEQ_K, _PER_QUERY, 0, "eperm"),
        allow,
    )
