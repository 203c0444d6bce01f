"""The ``agent`` and ``sandbox`` suites of ``agentvfs bench`` at the tiny size."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvfs.bench import _suite_agent as agent
from agentvfs.bench import _suite_sandbox as sandbox
from agentvfs.bench._backends import BackendSet
from agentvfs.bench._context import SIZES, Context, Progress
from agentvfs.bench._layers import Harness, LayerSpec, MountFailed, layers_for
from agentvfs.bench._model import DIRECT, Measurement, RunResult
from agentvfs.bench._targets import Target
from agentvfs.mounts import fuse_available, is_mounted
from agentvfs.sandbox import LocalSandbox

REPEAT = 2


def needs_fuse() -> None:
    reason = fuse_available()
    if reason is not None:
        pytest.skip(f"FUSE mounts do not work here: {reason}")


def make_ctx(tmp_path: Path, names: tuple[str, ...] = ("memory", "local"), *, mounts: bool = True) -> Context:
    backends = [BackendSet(tmp_path / "backends").open(name) for name in names]
    layers: dict[str, list[LayerSpec]] = {}
    for b in backends:
        specs = layers_for(b, peers=False)[0]
        layers[b.name] = specs if mounts else [s for s in specs if s.name == DIRECT]
    workdir = tmp_path / "work"
    return Context(RunResult(command="test", started="now", machine={}, config={}), backends, layers,
                   SIZES["tiny"], REPEAT, 1, Harness(workdir), Progress(enabled=False), workdir, 60.0)  # fmt: skip


@contextlib.contextmanager
def running(ctx: Context) -> Iterator[Context]:
    try:
        yield ctx
    finally:
        ctx.harness.close()


def files_left(root: Path) -> list[str]:
    return [os.path.join(d, f) for d, _, names in os.walk(root) for f in names]


def mounts_left(root: Path) -> list[str]:
    return [d for d, _, _ in os.walk(root) if is_mounted(d)]


def find(ctx: Context, suite: str, case: str, backend: str, layer: str) -> Measurement:
    found = [m for m in ctx.run.measurements if (m.suite, m.case, m.backend, m.layer) == (suite, case, backend, layer)]
    assert len(found) == 1, (suite, case, backend, layer, found)
    return found[0]


# -- the repository and the checks ------------------------------------------------------------


def test_repo_is_deterministic_and_counts_what_it_holds() -> None:
    repo = agent.build_repo(60)
    assert repo.files == agent.build_repo(60).files and repo.files != agent.build_repo(60, seed=1).files
    assert len(repo.files) == 60 and {p.rsplit(".", 1)[1] for p in repo.files} == {"py", "md", "json"}
    texts = [b.decode() for b in repo.files.values()]
    assert repo.needle_lines == sum(t.count(agent.NEEDLE) for t in texts) > repo.needle_files > 0
    assert repo.needle_files == sum(agent.NEEDLE in t for t in texts)
    assert all(1024 <= len(b) <= 8192 for b in repo.files.values())
    assert len(repo.edits) == agent.EDITS and all(t.count("REVISION = 0\n") == 1 for t in
                                                  (repo.files[p].decode() for p in repo.edits))  # fmt: skip
    assert len(repo.reads) == 50 and not {r.path for r in repo.reads} & set(repo.edits)
    big = agent.build_repo(2000)
    assert len(big.files) == 2000 and 2 << 10 < big.size // 2000 < 4 << 10 and big.needle_lines < 1000


def test_checks_raise_on_mismatch() -> None:
    repo = agent.build_repo(60)
    grep_rn = "".join(f"./{p}:{i}:{line}\n" for p, b in repo.files.items()
                      for i, line in enumerate(b.decode().split("\n"), 1) if agent.NEEDLE in line)  # fmt: skip
    agent.check_grep_rn(grep_rn, repo)
    with pytest.raises(OSError, match=f"found {repo.needle_lines - 1} lines"):
        agent.check_grep_rn(grep_rn.split("\n", 1)[1], repo)
    summary = f"{repo.needle_lines} matches across {repo.needle_files} files\n---\n..."
    agent.check_grep_tool(summary, repo)
    with pytest.raises(OSError, match="expected"):
        agent.check_grep_tool(f"{repo.needle_lines + 1} matches across {repo.needle_files} files\n---", repo)
    agent.check_list_files(f".\n...\n\n{repo.dirs} directories, {len(repo.files)} files", repo)
    with pytest.raises(OSError, match="61 files"):
        agent.check_list_files(f".\n\n{repo.dirs} directories, 61 files", repo)
    listing = "".join(f"./{p}\n" for p in repo.files)
    agent.check_find(listing, repo)
    with pytest.raises(OSError, match="1 unexpected, such as \\['stray'\\]"):
        agent.check_find(listing + "./stray\n", repo)
    text = repo.files[repo.edits[0]].decode()
    old, new, after = agent.bump(text, "f.py")
    assert (old, new) == ("REVISION = 0\n", "REVISION = 1\n") and agent.bump(after, "f.py")[0] == new
    with pytest.raises(OSError, match="REVISION line bumped"):
        agent.check_edit(text, after, "f.py")


# -- the agent suite --------------------------------------------------------------------------


def test_agent_suite_measures_every_step_on_every_layer(tmp_path: Path) -> None:
    needs_fuse()
    with running(make_ctx(tmp_path)) as ctx:
        agent.run(ctx)
    assert not mounts_left(tmp_path) and not ctx.harness.mounts
    assert files_left(tmp_path) == []  # the trees, mount points and state directories are gone
    assert ctx.run.problems == [] and ctx.harness.problems == []
    for backend in ("memory", "local"):
        for layer in (DIRECT, "agentvfs"):
            for step in agent.STEPS:
                m = find(ctx, "agent", step, backend, layer)
                assert m.errors == [] and m.unit == "s" and m.params == {"files": 60}, m
                if layer == DIRECT and step == "command":
                    assert m.skipped == agent.NO_SHELL and m.samples == []
                else:
                    assert m.skipped is None and len(m.samples) == REPEAT and all(s > 0 for s in m.samples), m
            total = find(ctx, "agent", "total", backend, layer)
            parts = [find(ctx, "agent", s, backend, layer).samples for s in agent.TOTAL_OF]
            assert total.samples == pytest.approx([sum(p[i] for p in parts) for i in range(REPEAT)])


def test_agent_suite_records_a_wrong_grep_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needs_fuse()
    real = agent.build_repo

    def off_by_one(files: int, seed: int = agent.SEED) -> agent.Repo:
        repo = real(files, seed)
        repo.needle_lines += 1  # what the layers find is now one line short of the expectation
        return repo

    monkeypatch.setattr(agent, "build_repo", off_by_one)
    with running(make_ctx(tmp_path, ("memory",))) as ctx:
        agent.run(ctx)
    assert not mounts_left(tmp_path) and files_left(tmp_path) == []
    for layer in (DIRECT, "agentvfs"):
        grep = find(ctx, "agent", "grep", "memory", layer)
        assert grep.samples == [] and len(grep.errors) == REPEAT, grep
        assert all("expected" in e and agent.NEEDLE in e for e in grep.errors)
        assert len(find(ctx, "agent", "list", "memory", layer).samples) == REPEAT
        total = find(ctx, "agent", "total", "memory", layer)
        assert total.samples == [] and total.notes == ["rounds where grep failed have no total"]


def test_agent_suite_goes_on_after_a_layer_fails(tmp_path: Path) -> None:
    def broken(h: Harness) -> contextlib.AbstractContextManager[Target]:
        raise MountFailed("broken exited with 1 before mounting")

    ctx = make_ctx(tmp_path, ("memory",), mounts=False)
    ctx.layers["memory"].append(LayerSpec("broken", "never mounts", broken))
    with running(ctx):
        agent.run(ctx)
    for step in agent.STEPS:
        assert len(find(ctx, "agent", step, "memory", DIRECT).errors) == 0
        bad = find(ctx, "agent", step, "memory", "broken")
        assert bad.samples == [] and bad.errors == ["MountFailed: broken exited with 1 before mounting"] * REPEAT
    assert len(find(ctx, "agent", "grep", "memory", DIRECT).samples) == REPEAT


# -- the sandbox suite ------------------------------------------------------------------------


def _our_sleepers() -> list[int]:
    out: list[int] = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"sleep\x0060" in cmd:
                out.append(int(pid))
    return out


def test_sandbox_suite(tmp_path: Path) -> None:
    before = set(_our_sleepers())
    with running(make_ctx(tmp_path, ("memory",), mounts=False)) as ctx:
        sandbox.run(ctx)
    bwrap = LocalSandbox.detect_isolation()["available"]
    layers = [DIRECT, sandbox.SANDBOX] + ([sandbox.BWRAP] if bwrap else [])
    if not bwrap:
        assert any(s.startswith(f"sandbox {sandbox.BWRAP}: ") for s in ctx.run.skipped)
    assert {m.layer for m in ctx.run.measurements} == set(layers)
    assert {m.backend for m in ctx.run.measurements} == {"local"}
    n = SIZES["tiny"].commands
    for layer in layers:
        for case in sandbox.CASES:
            m = find(ctx, "sandbox", case, "local", layer)
            assert m.errors == [] and len(m.samples) == REPEAT and all(v > 0 for v in m.values()), m
        for case, per_round in (("exec", n), ("spawn_kill", n), ("start", min(n, sandbox.STARTS_PER_ROUND))):
            m = find(ctx, "sandbox", case, "local", layer)
            assert m.unit == "ms" and len(m.latencies) == REPEAT * per_round and min(m.latencies) > 0
        output = find(ctx, "sandbox", "output", "local", layer)
        assert output.unit == "MiB/s" and output.amount == 2 << 20
        assert find(ctx, "sandbox", "ops", "local", layer).unit == "ops/s"
    assert files_left(tmp_path) == []
    assert set(_our_sleepers()) <= before  # every background process was killed
