"""The command line's basics: --version, ``python -m agentvfs``, logging options, the mount
option table in ``mount --help``, ``mount --daemon`` and ``agentvfs unmount``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _mounted import wait_until
from _mountproc import cli_env
from agentvfs import __version__
from agentvfs.mounts import MountOptions, fuse_available, is_mounted, serving_process

needs_fuse = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")


def _agentvfs(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentvfs", *args],
        capture_output=True, text=True, env=cli_env(), cwd=cwd, timeout=timeout, check=False,
    )  # fmt: skip


def test_version_and_python_dash_m() -> None:
    done = _agentvfs("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"agentvfs {__version__}")


def test_mount_help_lists_every_option_with_its_default_and_the_credentials() -> None:
    text = _agentvfs("mount", "--help").stdout
    for name in MountOptions.__dataclass_fields__:
        assert f"\n  {name} (default " in text, name
    assert "part_size (default 16MiB)" in text and "metadata (default on)" in text and "dir_mode (default 0o755)" in text
    assert "AWS_ACCESS_KEY_ID" in text and "endpoint_url" in text and "GOOGLE_APPLICATION_CREDENTIALS" in text
    assert "…" not in text and "``" not in text


def test_sizes_in_mount_options_take_binary_units() -> None:
    options = MountOptions.from_value({"part_size": "8MiB", "staging_limit": "2G", "random_read_size": "512k"})
    assert (options.part_size, options.staging_limit, options.random_read_size) == (8 << 20, 2 << 30, 512 << 10)


def test_a_mistyped_mount_option_in_python_names_the_one_meant() -> None:
    from agentvfs.errors import WorkspaceError

    with pytest.raises(WorkspaceError, match=r"Unknown mount option 'metdata_ttl' \(did you mean 'metadata_ttl'\?\)"):
        MountOptions.from_value({"metdata_ttl": 1})


def test_a_log_file_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    done = _agentvfs("--log-file", os.fspath(tmp_path / "no/such/dir/log"), "recover")
    assert done.returncode == 2 and done.stderr.startswith("agentvfs: --log-file") and "Traceback" not in done.stderr


@needs_fuse
def test_daemon_mount_then_unmount_publishes_and_logs(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "mnt").mkdir()
    state, log = tmp_path / "state", tmp_path / "mount.log"
    secret = tmp_path / "opt"
    secret.write_text("false")
    started = time.monotonic()
    done = _agentvfs(
        "-v", "--log-file", os.fspath(log), "mount", "--daemon", "src", "mnt",
        "-o", f"state_dir={state}", "-o", "stop_timeout=5", "-o", f"auto_mkdir=@{secret}",
        cwd=tmp_path,
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started < 30
        point = os.fspath(tmp_path / "mnt")
        assert is_mounted(point)
        assert f"mounted at {point} by process" in done.stderr and "agentvfs unmount" in done.stderr
        pid = serving_process(point, os.fspath(state))
        assert pid is not None and pid != os.getpid()
        # The value read from a file is not on the daemon's command line.
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert f"@{secret}".encode() in f.read()
        with open(tmp_path / "mnt/made.txt", "w") as f:
            f.write("through the daemon\n")
        # The process is found through its session, in the state directory it was given.
        assert serving_process(point, os.fspath(tmp_path / "elsewhere")) is None
        done = _agentvfs("unmount", "mnt", "--state-dir", os.fspath(state), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert not is_mounted(point)
        assert wait_until(lambda: serving_process(point, os.fspath(state)) is None, timeout=10)
    finally:
        if is_mounted(os.fspath(tmp_path / "mnt")):
            subprocess.run(["fusermount3", "-uz", os.fspath(tmp_path / "mnt")], check=False)
    assert (tmp_path / "src/made.txt").read_text() == "through the daemon\n"
    text = log.read_text()
    assert "INFO agentvfs.mounts: serving" in text and "INFO agentvfs.mounts: unmounted" in text
    assert _agentvfs("unmount", os.fspath(tmp_path / "mnt")).returncode == 1  # no longer a mount point


@needs_fuse
def test_a_daemon_that_fails_reports_why(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    (tmp_path / "mnt/in-the-way").write_text("x")
    done = _agentvfs("mount", "--daemon", "memory://x", "mnt", "--log-file", "l.log", cwd=tmp_path)
    assert done.returncode == 1 and "is not empty" in done.stderr, done.stderr


@needs_fuse
def test_unmount_of_another_fuse_mount(tmp_path: Path) -> None:
    point = tmp_path / "mnt"
    point.mkdir()
    # A mount served in another process that has no session in the default state directory
    # (an in-process Mount of a test): unmount falls back to fusermount3, and a busy mount
    # is reported.
    code = (
        "import sys, time; from fsspec.implementations.memory import MemoryFileSystem\n"
        "from agentvfs import FsspecFilesystem; from agentvfs.mounts import Mount\n"
        "m = Mount(FsspecFilesystem(MemoryFileSystem(skip_instance_cache=True), root='/u'), sys.argv[1],"
        " options={'state_dir': sys.argv[2]}).start(); print('up', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, os.fspath(point), os.fspath(tmp_path / "state")],
        stdout=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        with open(point / "held", "w") as held:
            done = _agentvfs("unmount", os.fspath(point), "--state-dir", os.fspath(tmp_path / "other"))
            assert done.returncode == 1 and "busy" in done.stderr.lower() and "--lazy" in done.stderr
            held.write("x")
        done = _agentvfs("unmount", os.fspath(point), "--state-dir", os.fspath(tmp_path / "other"))
        assert done.returncode == 0, done.stderr
        assert not is_mounted(os.fspath(point))
    finally:
        child.kill()
        child.wait()
        if is_mounted(os.fspath(point)):
            subprocess.run(["fusermount3", "-uz", os.fspath(point)], check=False)


def _complete(shell: str, words: list[str]) -> list[str]:
    script = _agentvfs("completion", shell).stdout
    line = " ".join(words)
    code = f"""{'autoload() { :; }; bashcompinit() { :; }; ' if shell == 'zsh' else ''}
{script}
COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}
_agentvfs
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_shell_completion(shell: str) -> None:
    assert _complete(shell, ["agentvfs", "mo"]) == ["mount"]
    assert _complete(shell, ["agentvfs", "un"]) == ["unmount"]
    assert "--daemon" in _complete(shell, ["agentvfs", "mount", "--d"])
    assert _complete(shell, ["agentvfs", "mount", "s3://b", "/mnt", "-o", "metadata_t"]) == ["metadata_ttl="]
    assert _complete(shell, ["agentvfs", "-v", "mcp", "--ro"]) == ["--root"]
    assert _complete(shell, ["agentvfs", "--log-level", "D"]) == ["DEBUG"]


def test_named_remotes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "reports").mkdir(parents=True)
    (store / "reports/q1.txt").write_text("first quarter\n")
    (tmp_path / "ttl").write_text("0.5\n")
    remotes = tmp_path / "remotes.toml"
    remotes.write_text(
        f'[docs]\nurl = "file://{store}"\nmetadata_ttl_file = "ttl"\nstop_timeout = 3\n'
        '[broken]\nurl = "s3://bucket"\nsecret_file = "missing"\n'
    )
    remotes.chmod(0o600)
    (tmp_path / "mnt").mkdir()
    # Unknown names and unreadable *_file values are one line each, before anything runs.
    done = _agentvfs("mount", "--remotes", os.fspath(remotes), "nope:", os.fspath(tmp_path / "mnt"))
    assert done.returncode == 2 and f"no remote 'nope' with a url in {remotes} (defined: broken, docs)" in done.stderr
    done = _agentvfs("mount", "--remotes", os.fspath(remotes), "broken:", os.fspath(tmp_path / "mnt"))
    assert done.returncode == 2 and "remote 'broken': secret_file = 'missing': No such file or directory" in done.stderr
    if fuse_available() is not None:
        return
    state = tmp_path / "state"
    done = _agentvfs(
        "mount", "--daemon", "--remotes", os.fspath(remotes), "docs:reports", os.fspath(tmp_path / "mnt"),
        "-o", f"state_dir={state}",
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "mnt/q1.txt").read_text() == "first quarter\n"  # PATH is below the remote's url
        pid = serving_process(os.fspath(tmp_path / "mnt"), os.fspath(state))
        assert pid is not None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"docs:reports" in f.read()  # the daemon resolves the name itself
    finally:
        _agentvfs("unmount", os.fspath(tmp_path / "mnt"), "--state-dir", os.fspath(state))
    assert not is_mounted(os.fspath(tmp_path / "mnt"))


def test_a_readable_remotes_file_with_credentials_is_warned_about(tmp_path: Path) -> None:
    remotes = tmp_path / "remotes.toml"
    remotes.write_text('[s3]\nurl = "s3://bucket"\nsecret = "inline"\n')
    remotes.chmod(0o644)
    done = _agentvfs("mount", "--remotes", os.fspath(remotes), "s3:", os.fspath(tmp_path), "-o", "bogus=1")
    assert f"holds credentials and others may read it; chmod 600 {remotes}" in done.stderr
    assert "Unknown storage option 'bogus'" in done.stderr  # the remote's options are checked with the others


_SIGNAL_STORM = """
import signal, sys
from agentvfs.cli import _SignalStop

stop = _SignalStop()
quit = False
seen = 0

def on_quit(signum, frame):
    global quit
    quit = True

signal.signal(signal.SIGTERM, lambda signum, frame: stop.request())
signal.signal(signal.SIGUSR1, on_quit)
print("ready", flush=True)
while not quit:
    # A zero timeout keeps the waiter inside wait() nearly all the time: the window where a
    # handler that takes the waiter's lock (threading.Event.set) blocks for good.
    if stop.wait(0):
        seen += 1
        stop.clear()
print(seen, flush=True)
"""


def test_a_stop_requested_by_signals_never_deadlocks_its_waiter() -> None:
    """The mount command waits for SIGTERM with ``_SignalStop``; with a ``threading.Event``
    a signal landing while the main thread was inside ``Event.wait`` hung the mount for good
    (seen in CI as a mount that did not exit within 60 s of SIGTERM)."""
    import signal

    child = subprocess.Popen(
        [sys.executable, "-c", _SIGNAL_STORM], stdout=subprocess.PIPE, text=True, env=cli_env()
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            time.sleep(0.0005)
        child.send_signal(signal.SIGUSR1)
        out, _ = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0 and int(out) > 0, (child.returncode, out)


def test_a_waiter_wakes_at_once_when_a_stop_is_requested() -> None:
    from agentvfs.cli import _SignalStop

    stop = _SignalStop()
    try:
        started = time.monotonic()
        assert not stop.wait(0.05) and time.monotonic() - started >= 0.04
        stop.request()
        started = time.monotonic()
        assert stop.wait(30) and time.monotonic() - started < 1
        stop.clear()
        assert not stop.wait(0)
    finally:
        stop.close()
