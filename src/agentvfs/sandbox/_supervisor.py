"""A child subreaper for commands that run without isolation and without cgroups.

With ``isolation="none"`` and no cgroup this process may create, nothing but the process
group ties a command's processes together, and ``setsid`` or a double fork leaves it: the
orphan is adopted by init and outlives ``stop()``. So each command then runs under a small
supervisor (this Python with ``-I -S``, about 10 ms to start) that

* makes itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so every orphan among its
  descendants is adopted by it rather than by init, and can always be found;
* takes the command's resource limits (rlimits, inherited by everything it starts);
* runs ``/bin/sh -c <command>`` and, when that process ends, kills every descendant left
  (as bubblewrap's PID namespace does), then exits with the command's status (a command
  killed by a signal makes the supervisor die of the same signal);
* forwards ``SIGTERM`` (a timeout) to every descendant, session leaders included;
* on ``SIGUSR1`` (the sandbox's kill, and this process's death through
  ``PR_SET_PDEATHSIG``) kills every descendant and then itself with ``SIGKILL``.

The supervisor must not be killed with ``SIGKILL`` itself while descendants live (they would
go to init): the process manager sends it ``SIGUSR1`` instead.

Unlike the other ways of running a command, background children of a foreground command end
with it here (they would otherwise have to outlive their supervisor).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

__all__ = ["KILL_SIGNAL", "supervisor_argv"]

#: What the process manager sends a supervisor to kill its command's processes.
KILL_SIGNAL = 10  # SIGUSR1 on Linux (x86-64 and arm64)

# Run as ``python -I -S -c SCRIPT <parent pid> <rlimits> <keep LC_CTYPE> -- argv...``; the
# rlimits are ``resource:soft:hard`` items separated by commas. Standard library only: the
# interpreter runs isolated from site-packages and the environment.
_SCRIPT = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)                 # PR_SET_CHILD_SUBREAPER
libc.prctl(1, signal.SIGUSR1, 0, 0, 0)     # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(125)                           # the parent died before the line above
import resource
for item in filter(None, sys.argv[2].split(",")):
    which, soft, hard = map(int, item.split(":"))
    resource.setrlimit(which, (soft, hard))
if sys.argv[3] != "1" and os.environ.get("LC_CTYPE") == "C.UTF-8":
    del os.environ["LC_CTYPE"]              # set by the interpreter's locale coercion
argv = sys.argv[5:]
me = os.getpid()

def descendants():
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        children.setdefault(int(raw[raw.rfind(b")") + 2:].split()[1]), []).append(int(name))
    found, todo = [], [me]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found

def send(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass

def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return

def kill_all():
    while True:
        pids = descendants()
        if not pids:
            reap()
            return
        send(pids, signal.SIGKILL)
        reap()

def on_term(signum, frame):
    send(descendants(), signal.SIGTERM)

def on_kill(signum, frame):
    kill_all()
    os.kill(me, signal.SIGKILL)

signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGUSR1, on_kill)
try:
    child = os.posix_spawn(argv[0], argv, os.environ, setsigdef=(signal.SIGTERM, signal.SIGUSR1))
except OSError as exc:
    sys.stderr.write("Cannot run command: %s\n" % (exc.strerror or exc))
    os._exit(127)
status = 0
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    if pid == child:
        break
kill_all()
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    if sig != signal.SIGKILL:
        signal.signal(sig, signal.SIG_DFL)
    os.kill(me, sig)
os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
"""


def supervisor_argv(
    command: Sequence[str],
    *,
    parent: int,
    rlimits: Iterable[tuple[int, tuple[int, int]]] = (),
    keep_lc_ctype: bool = False,
    python: str | None = None,
) -> list[str]:
    """The argument vector that runs ``command`` (e.g. ``["/bin/sh", "-c", line]``) under a
    supervisor.

    Parameters
    ----------
    command : sequence of str
        What the supervisor runs (its first item is an absolute path).
    parent : int
        This process's pid: a supervisor whose parent is already gone does not start.
    rlimits : iterable
        ``(RLIMIT_*, (soft, hard))`` pairs the supervisor sets on itself first.
    keep_lc_ctype : bool
        Whether the command's environment has ``LC_CTYPE`` of its own (the interpreter adds
        ``LC_CTYPE=C.UTF-8`` to a C locale, which the supervisor removes otherwise).
    python : str, optional
        The interpreter; this one by default.
    """
    spec = ",".join(f"{which}:{soft}:{hard}" for which, (soft, hard) in rlimits)
    return [
        python or sys.executable,
        "-I",
        "-S",
        "-c",
        _SCRIPT,
        str(parent),
        spec,
        "1" if keep_lc_ctype else "0",
        "--",
        *command,
    ]
