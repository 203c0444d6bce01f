"""Suite ``sandbox``: what running an agent's commands through `LocalSandbox` costs.

Backend-independent (recorded under backend ``local``). Layers: ``direct`` (plain
``subprocess`` in this process, the baseline every ratio is computed against),
``LocalSandbox``, and ``LocalSandbox+bwrap`` where bubblewrap works. Rounds are
interleaved: round i runs every case on every layer. Cases:

``start``
    a new sandbox until its first command (``true``) returned, ms;
``exec``
    ``execute_command("true")`` on a running sandbox, ms per command (every latency kept);
``output``
    a command writing 16 MiB to stdout, streamed through a callback, MiB/s;
``spawn_kill``
    a background process (``sleep``) spawned and killed, ms per pair;
``ops``
    ``size.commands`` mixed short commands (echo, ls, cat, wc, grep), four at a time, ops/s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._context import Context, Timeout
from ._model import DIRECT, Measurement

__all__ = ["BWRAP", "CASES", "SANDBOX", "run"]

SUITE = "sandbox"
BACKEND = "local"
SANDBOX = "LocalSandbox"
BWRAP = "LocalSandbox+bwrap"
CASES = ("start", "exec", "output", "spawn_kill", "ops")
STARTS_PER_ROUND = 5
CONCURRENCY = 4
#: 63 characters and a newline: ``yes`` repeats it, ``head -c`` cuts the stream.
_LINE = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_NOTES = "".join(f"line {i} of the notes\n" for i in range(200))
_OPS = ("echo hello", "ls -la", "cat notes.txt", "wc -l notes.txt", "grep -c line notes.txt", "pwd")
_ERRORS = (OSError, RuntimeError, ValueError, TimeoutError, Timeout)
_LIMIT_S = 60.0


def _output_bytes(ctx: Context) -> int:
    return (2 if ctx.size.name == "tiny" else 16) << 20


def _ops_expect(command: str) -> str | None:
    return {"echo hello": "hello\n", "wc -l notes.txt": "200 notes.txt\n", "grep -c line notes.txt": "200\n"}.get(command)


def _check_op(command: str, exit_code: int, stdout: str) -> None:
    if exit_code != 0:
        raise RuntimeError(f"{command!r} exited {exit_code}")
    want = _ops_expect(command)
    if want is not None and stdout != want:
        raise RuntimeError(f"{command!r} printed {stdout[:80]!r}, expected {want!r}")


# -- the baseline: subprocess in this process -------------------------------------------------


class Plain:
    """The cases with ``subprocess`` directly: what the sandbox adds its cost to."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.env = {"PATH": os.environ.get("PATH", os.defpath)}

    def _run(self, command: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", command], cwd=cwd or self.workdir, env=self.env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=_LIMIT_S, check=False)  # fmt: skip

    def start(self, n: int, scratch: str) -> list[float]:
        out: list[float] = []
        for i in range(n):
            wd = os.path.join(scratch, f"start-{i}")
            t0 = time.perf_counter()
            os.makedirs(wd, exist_ok=True)
            done = self._run("true", cwd=wd)
            out.append(time.perf_counter() - t0)
            _check_op("true", done.returncode, done.stdout)
            shutil.rmtree(wd, ignore_errors=True)
        return out

    def exec(self, n: int) -> list[float]:
        out: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            done = self._run("true")
            out.append(time.perf_counter() - t0)
            _check_op("true", done.returncode, done.stdout)
        return out

    def output(self, nbytes: int) -> float:
        t0 = time.perf_counter()
        proc = subprocess.Popen(["sh", "-c", f"yes {_LINE} | head -c {nbytes}"], cwd=self.workdir, env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)  # fmt: skip
        total = 0
        assert proc.stdout is not None
        try:
            while chunk := os.read(proc.stdout.fileno(), 1 << 16):
                total += len(chunk)
        finally:
            proc.stdout.close()
            proc.wait(_LIMIT_S)
        dt = time.perf_counter() - t0
        if total != nbytes or proc.returncode != 0:
            raise RuntimeError(f"read {total} bytes (exit {proc.returncode}), expected {nbytes}")
        return dt

    def spawn_kill(self, n: int) -> list[float]:
        out: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            proc = subprocess.Popen(["sh", "-c", "sleep 60"], cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            finally:
                proc.wait(_LIMIT_S)
            out.append(time.perf_counter() - t0)
        return out

    def ops(self, n: int) -> float:
        commands = [_OPS[i % len(_OPS)] for i in range(n)]

        def one(command: str) -> None:
            done = self._run(command)
            _check_op(command, done.returncode, done.stdout)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(one, commands))
        return time.perf_counter() - t0


# -- LocalSandbox -----------------------------------------------------------------------------


class Sandboxed:
    """The cases through a `LocalSandbox` (plain or bwrap), on the portal's event loop.

    Every coroutine times itself, so the hop from this thread to the loop is not counted.
    """

    def __init__(self, portal: Any, workdir: str, isolation: str) -> None:
        from ..sandbox import LocalSandbox

        self.portal, self.workdir, self.isolation = portal, workdir, isolation
        self.sandbox = LocalSandbox(working_directory=workdir, isolation=isolation)
        self._make = LocalSandbox

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return self.portal.call(fn, *args)
        except _ERRORS:
            raise
        except Exception as exc:  # SandboxError and the like: an error of the case
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc

    async def _destroy(self, sandbox: Any) -> None:
        import anyio

        with anyio.move_on_after(15, shield=True):
            await sandbox.destroy()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.portal.call(self._destroy, self.sandbox)

    async def _start(self, n: int, scratch: str) -> list[float]:
        out: list[float] = []
        for i in range(n):
            wd = os.path.join(scratch, f"start-{i}")
            sandbox = self._make(working_directory=wd, isolation=self.isolation)
            try:
                t0 = time.perf_counter()
                done = await sandbox.execute_command("true")
                out.append(time.perf_counter() - t0)
            finally:
                await self._destroy(sandbox)
                shutil.rmtree(wd, ignore_errors=True)
            _check_op("true", done.exit_code, done.stdout)
        return out

    def start(self, n: int, scratch: str) -> list[float]:
        return list(self.call(self._start, n, scratch))

    async def _exec(self, n: int) -> list[float]:
        out: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            done = await self.sandbox.execute_command("true", timeout=_LIMIT_S * 1e3)
            out.append(time.perf_counter() - t0)
            _check_op("true", done.exit_code, done.stdout)
        return out

    def exec(self, n: int) -> list[float]:
        return list(self.call(self._exec, n))

    async def _output(self, nbytes: int) -> float:
        total = 0

        def count(chunk: str) -> None:
            nonlocal total
            total += len(chunk)  # ASCII: characters are bytes

        t0 = time.perf_counter()
        done = await self.sandbox.execute_command(f"yes {_LINE} | head -c {nbytes}", on_stdout=count,
                                                  max_retained_bytes=0, timeout=_LIMIT_S * 1e3)  # fmt: skip
        dt = time.perf_counter() - t0
        if total != nbytes or done.exit_code != 0:
            raise RuntimeError(f"streamed {total} bytes (exit {done.exit_code}), expected {nbytes}")
        return dt

    def output(self, nbytes: int) -> float:
        return float(self.call(self._output, nbytes))

    async def _spawn_kill(self, n: int) -> list[float]:
        procs = self.sandbox.processes
        out: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            handle = await procs.spawn("sleep 60", stdin_mode="ignore")
            killed = await procs.kill(handle.pid)
            out.append(time.perf_counter() - t0)
            if not killed:
                raise RuntimeError(f"background process {handle.pid} was not running to be killed")
        return out

    def spawn_kill(self, n: int) -> list[float]:
        return list(self.call(self._spawn_kill, n))

    async def _ops(self, n: int) -> float:
        import anyio

        commands = [_OPS[i % len(_OPS)] for i in range(n)]
        limiter = anyio.CapacityLimiter(CONCURRENCY)

        async def one(command: str) -> None:
            async with limiter:
                done = await self.sandbox.execute_command(command, timeout=_LIMIT_S * 1e3)
            _check_op(command, done.exit_code, done.stdout)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for command in commands:
                tg.start_soon(one, command)
        return time.perf_counter() - t0

    def ops(self, n: int) -> float:
        return float(self.call(self._ops, n))


# -- the suite --------------------------------------------------------------------------------

Runner = Plain | Sandboxed


def _measurements(ctx: Context, layer: str, nbytes: int) -> dict[str, Measurement]:
    n = ctx.size.commands
    ms = {
        "start": ctx.measurement(SUITE, "start", BACKEND, layer, "start until the first command returned", "ms"),
        "exec": ctx.measurement(SUITE, "exec", BACKEND, layer, "run `true` (per command)", "ms", commands=n),
        "output": ctx.measurement(SUITE, "output", BACKEND, layer, f"stream {nbytes >> 20} MiB of stdout", "MiB/s",
                                  nbytes, bytes=nbytes),
        "spawn_kill": ctx.measurement(SUITE, "spawn_kill", BACKEND, layer, "spawn and kill a background process",
                                      "ms", commands=n),
        "ops": ctx.measurement(SUITE, "ops", BACKEND, layer, f"{n} mixed commands, {CONCURRENCY} at a time", "ops/s",
                               n, commands=n),
    }  # fmt: skip
    if layer == DIRECT:
        for m in ms.values():
            note = "baseline: subprocess.run(['sh', '-c', ...]) in the measuring process"
            if note not in m.notes:
                m.notes.append(note)
    return ms


def _per_op(m: Measurement | None, latencies: list[float]) -> float:
    """Mean seconds per operation of one round; every latency kept on ``m``."""
    if not latencies:
        raise RuntimeError("no operations ran")
    if m is not None:
        m.latencies.extend(latencies)
    return sum(latencies) / len(latencies)


def _as_case_error(fn: Callable[[Measurement | None], float], m: Measurement | None) -> float:
    """``fn(m)``, any exception but the ones `Context.record` keeps turned into RuntimeError."""
    try:
        return fn(m)
    except _ERRORS:
        raise
    except Exception as exc:
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc


def _round(ctx: Context, runner: Runner, ms: dict[str, Measurement], scratch: str, timed: bool) -> None:
    n, nbytes = ctx.size.commands, _output_bytes(ctx)
    starts = min(STARTS_PER_ROUND, n)
    cases: dict[str, Callable[[Measurement | None], float]] = {
        "start": lambda m: _per_op(m, runner.start(starts, scratch)),
        "exec": lambda m: _per_op(m, runner.exec(n)),
        "output": lambda m: runner.output(nbytes),
        "spawn_kill": lambda m: _per_op(m, runner.spawn_kill(n)),
        "ops": lambda m: runner.ops(n),
    }
    for case, fn in cases.items():
        m = ms[case]
        if timed:
            ctx.record(m, functools.partial(_as_case_error, fn, m))
            continue
        try:
            _as_case_error(fn, None)
        except _ERRORS as exc:
            ctx.progress.log(f"  warm-up error: {BACKEND} / {m.layer} / {case}: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _portal() -> Iterator[Any]:
    from anyio.from_thread import start_blocking_portal

    with start_blocking_portal() as portal:
        yield portal


def run(ctx: Context) -> None:
    """Run the sandbox suite (once, whatever the backends)."""
    from ..sandbox import LocalSandbox

    nbytes = _output_bytes(ctx)
    layers = [DIRECT, SANDBOX]
    isolation = LocalSandbox.detect_isolation()
    if isolation.get("available"):
        layers.append(BWRAP)
    else:
        ctx.run.skip_once(f"sandbox {BWRAP}: {isolation.get('message', 'bubblewrap is not usable here')}")
    for layer, how in ((SANDBOX, "`LocalSandbox().execute_command(...)` on an event loop of the measuring process"),
                       (BWRAP, "`LocalSandbox(isolation='bwrap')`: every command inside bubblewrap")):
        if layer in layers:
            ctx.run.layers.setdefault(f"{BACKEND} {layer}", how)
    rounds = ctx.warmup + ctx.repeat
    ctx.progress.start(f"sandbox · {', '.join(layers)}", rounds * len(layers))
    scratch = ctx.harness.scratch("sandbox")
    runners: dict[str, Runner] = {}
    failed: dict[str, str] = {}
    try:
        with _portal() as portal:
            try:
                for layer in layers:
                    wd = os.path.join(scratch, layer.replace("+", "-"))
                    os.makedirs(wd, exist_ok=True)
                    with open(os.path.join(wd, "notes.txt"), "w") as f:
                        f.write(_NOTES)
                    try:
                        runners[layer] = (Plain(wd) if layer == DIRECT
                                          else Sandboxed(portal, wd, "bwrap" if layer == BWRAP else "none"))  # fmt: skip
                    except Exception as exc:  # IsolationUnavailableError and the like
                        failed[layer] = f"{type(exc).__name__}: {exc}"
                for r in range(rounds):
                    timed = r >= ctx.warmup
                    for layer in layers:
                        ms = _measurements(ctx, layer, nbytes)
                        if layer in failed:
                            if timed:
                                for m in ms.values():
                                    m.errors.append(failed[layer])
                        else:
                            starts = os.path.join(scratch, f"starts-{layer.replace('+', '-')}")
                            os.makedirs(starts, exist_ok=True)
                            _round(ctx, runners[layer], ms, starts, timed)
                        ctx.progress.advance(f"{'round ' + str(r - ctx.warmup + 1) if timed else 'warm-up'}: {layer}")
            finally:
                for runner in runners.values():
                    if isinstance(runner, Sandboxed):
                        runner.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
