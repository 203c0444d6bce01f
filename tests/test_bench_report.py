"""The benchmark report: Markdown tables, plots, results.json and the RESULTS.md block."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from agentvfs.bench._model import Measurement, RunResult
from agentvfs.bench._report import (
    BEGIN_MARKER,
    END_MARKER,
    regenerate_results_md,
    render_markdown,
    render_plots,
    write_report,
)

MiB = 1 << 20
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ERROR = "OSError: [Errno 5] Input/output error"
SKIP_REASON = "rclone cannot mount the memory backend"


def rate_samples(amount: float, values: list[float]) -> list[float]:
    """Seconds per round that give these MiB/s (or ops/s, with amount in operations)."""
    return [amount / v for v in values]


# Sequential read of 64 MiB on memory: 128, 256 and 64 MiB/s direct; agentvfs at 0.8, 0.9 and
# 0.7 of direct in the same rounds, so its ratio is the median 0.8.
DIRECT_READ = [128.0, 256.0, 64.0]
AGENTVFS_READ = [128.0 * 0.8, 256.0 * 0.9, 64.0 * 0.7]
# Directory listing (agent suite, seconds): direct/agentvfs per round is 0.5, 0.5 and 1.0.
DIRECT_GREP = [0.2, 0.25, 0.3]
AGENTVFS_GREP = [0.4, 0.5, 0.3]
LATENCIES = [i / 1000 for i in range(101)]  # 0..100 ms: p50 = 50, p95 = 95, p99 = 99


def seq_read(backend: str, layer: str, **fields: Any) -> Measurement:
    return Measurement("io", "seq_read", backend, layer, "Sequential read (64 MiB)", "MiB/s", amount=64 * MiB, **fields)


#: What the module-scoped `report_dir` fixture yields: the run, its directory and its files.
Written = tuple[RunResult, Path, dict[str, Path]]


def make_run(*, partial: bool = False) -> RunResult:
    run = RunResult(
        command="agentvfs bench --size tiny --repeat 3",
        started="2026-01-02T03:04:05+00:00",
        finished="2026-01-02T03:14:05+00:00",
        machine={"cores": "2", "cpu": "AMD EPYC", "python": "CPython 3.11.7"},
        config={"size": "tiny", "repeat": 3, "warmup": 1, "backends": ["memory", "local"], "peers": True},
        partial=partial,
        partial_reason="interrupted during metadata" if partial else None,
        layers={"memory agentvfs": "agentvfs mount memory:// /mnt/x", "local local disk": "plain paths"},
        skipped=["s3fs-fuse: not installed"],
        problems=["rclone: did not exit within 30 s of SIGTERM"],
    )
    run.add(seq_read("memory", "direct", samples=rate_samples(64, DIRECT_READ)))
    run.add(seq_read("memory", "agentvfs", samples=rate_samples(64, AGENTVFS_READ)))
    run.add(seq_read("memory", "fsspec.fuse", errors=[ERROR, ERROR]))
    run.add(seq_read("memory", "rclone", skipped=SKIP_REASON))
    # 1 GiB in 0.5 s, one round: 2,048 MiB/s without a spread.
    run.add(Measurement("io", "seq_write", "memory", "direct", "Sequential write (1 GiB)", "MiB/s", amount=1024 * MiB,
                        samples=[0.5]))  # fmt: skip
    # 1,000 random reads in 0.08, 0.1, 0.125 s: 12,500, 10,000 and 8,000 ops/s.
    run.add(Measurement("io", "rand_read", "memory", "agentvfs", "Random reads", "ops/s", amount=1000,
                        samples=[0.08, 0.1, 0.125], latencies=LATENCIES))  # fmt: skip
    run.add(seq_read("local", "direct", samples=rate_samples(64, [500.0, 520.0])))
    run.add(seq_read("local", "local disk", samples=rate_samples(64, [1500.0, 1600.0])))
    for entries in (10, 100, 1000):
        for case, label in (("create", "Create"), ("stat", "Stat")):
            for layer, rate in (("direct", 20_000.0), ("agentvfs", 5_000.0)):
                run.add(Measurement("metadata", case, "memory", layer, label, "ops/s", amount=entries,
                                    params={"entries": entries},
                                    samples=rate_samples(entries, [rate, rate * 1.1])))  # fmt: skip
    run.add(Measurement("agent", "grep", "memory", "direct", "grep -r", "s", samples=DIRECT_GREP))
    run.add(Measurement("agent", "grep", "memory", "agentvfs", "grep -r", "s", samples=AGENTVFS_GREP))
    run.add(Measurement("agent", "stat_one", "memory", "agentvfs", "One stat", "ms", samples=[0.00123]))
    run.add(Measurement("search", "ndcg", "local", "agentvfs BM25", "nDCG@10", "score", samples=[0.369]))
    run.add(Measurement("search", "ndcg", "local", "SQLite FTS5", "nDCG@10", "score", samples=[0.3125]))
    run.add(Measurement("search", "query", "local", "agentvfs BM25", "Query", "ms", samples=[0.002],
                        latencies=[0.001, 0.002, 0.004]))  # fmt: skip
    run.add(Measurement("custom", "thing", "memory", "direct", "Something else", "score", samples=[1.0]))
    return run


def table_after(markdown: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table after ``heading``, header included."""
    lines = markdown.split("\n")
    start = lines.index(heading)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif rows:
            break
    return rows


def fmt3(value: float) -> str:
    """The expected three-significant-digit rendering for the values used here."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def test_rate_cells_spread_and_ratio() -> None:
    md = render_markdown(make_run())
    rows = table_after(md, "### io on memory")
    assert rows[0] == ["case", "direct", "agentvfs", "fsspec.fuse", "rclone"]
    read = rows[1]
    assert read[0] == "Sequential read (64 MiB)"
    median = statistics.median(DIRECT_READ)
    assert median == 128.0
    assert read[1] == f"{fmt3(median)} MiB/s [{fmt3(min(DIRECT_READ))}–{fmt3(max(DIRECT_READ))}]"
    assert read[1] == "128 MiB/s [64.0–256]"
    ratio = statistics.median(a / b for a, b in zip(AGENTVFS_READ, DIRECT_READ, strict=True))
    assert round(ratio, 6) == 0.8
    expected = (f"{fmt3(statistics.median(AGENTVFS_READ))} MiB/s "
                f"[{fmt3(min(AGENTVFS_READ))}–{fmt3(max(AGENTVFS_READ))}] ×{ratio:.2f}")  # fmt: skip
    assert read[2] == expected == "102 MiB/s [44.8–230] ×0.80"
    # Thousands separators, no spread from one round, no ratio without a direct counterpart.
    assert rows[2] == ["Sequential write (1 GiB)", "2,048 MiB/s", "—", "—", "—"]
    assert rows[3] == ["Random reads", "—", "10,000 ops/s [8,000–12,500]", "—", "—"]
    assert "above 1 is faster than direct" in md


def test_error_and_skip_footnotes() -> None:
    md = render_markdown(make_run())
    read = table_after(md, "### io on memory")[1]
    err = re.fullmatch(r"error \((\d+)\)", read[3])
    skip = re.fullmatch(r"skipped \((\d+)\)", read[4])
    assert err and skip and err.group(1) != skip.group(1)
    assert f"- ({err.group(1)}) Error: {ERROR} (×2)" in md
    assert f"- ({skip.group(1)}) Skipped: {SKIP_REASON}" in md
    # Footnote numbers are unique in the whole report.
    numbers = re.findall(r"^- \((\d+)\)", md, re.MULTILINE)
    assert len(numbers) == len(set(numbers)) == 2


def test_time_ratio_is_inverted() -> None:
    md = render_markdown(make_run())
    rows = table_after(md, "### agent on memory")
    assert rows[0] == ["case", "direct", "agentvfs"]
    ratio = statistics.median(d / a for d, a in zip(DIRECT_GREP, AGENTVFS_GREP, strict=True))
    assert ratio == 0.5  # slower than direct: below 1, as for rates
    assert rows[1] == ["grep -r", "0.250 s [0.200–0.300]", f"0.400 s [0.300–0.500] ×{ratio:.2f}"]
    assert rows[2] == ["One stat", "—", "1.23 ms"]


def test_metadata_rows_per_directory_size() -> None:
    md = render_markdown(make_run())
    rows = table_after(md, "### metadata on memory")
    labels = [r[0] for r in rows[1:]]
    assert labels == [
        "Create (10 entries)", "Create (100 entries)", "Create (1,000 entries)",
        "Stat (10 entries)", "Stat (100 entries)", "Stat (1,000 entries)",
    ]  # fmt: skip
    # 20,000 and 22,000 ops/s direct, 5,000 and 5,500 agentvfs: ratio 0.25 in both rounds.
    assert rows[3][1:] == ["21,000 ops/s [20,000–22,000]", "5,250 ops/s [5,000–5,500] ×0.25"]


def test_scores_layers_and_sections() -> None:
    md = render_markdown(make_run())
    rows = table_after(md, "### search on local")
    assert rows[0] == ["case", "agentvfs BM25", "SQLite FTS5"]
    assert rows[1] == ["nDCG@10", "0.369", "0.312"]
    # Suites in the fixed order, then the others.
    headings = [line for line in md.split("\n") if line.startswith("## ")]
    assert headings == ["## Which layer to use", "## Configuration", "## Machine", "## I/O", "## Metadata",
                        "## Agent workloads", "## Search", "## custom", "## Layers", "## Skipped",
                        "## Problems"]  # fmt: skip
    assert md.index("### io on memory") < md.index("### io on local")
    assert table_after(md, "### io on local")[1] == ["Sequential read (64 MiB)", "510 MiB/s [500–520]",
                                                     "1,550 MiB/s [1,500–1,600] ×3.04"]  # fmt: skip
    assert "- **memory agentvfs**: `agentvfs mount memory:// /mnt/x`" in md
    assert "- s3fs-fuse: not installed" in md
    assert "- rclone: did not exit within 30 s of SIGTERM" in md
    assert "Command: `agentvfs bench --size tiny --repeat 3`" in md
    assert "Started 2026-01-02T03:04:05+00:00, finished 2026-01-02T03:14:05+00:00." in md
    assert table_after(md, "## Configuration")[1:] == [["size", "tiny"], ["repeat", "3"], ["warmup", "1"],
                                                       ["backends", "memory, local"], ["peers", "yes"]]  # fmt: skip
    assert table_after(md, "## Machine")[2] == ["cpu", "AMD EPYC"]
    assert "PARTIAL" not in md
    assert md == render_markdown(make_run())  # deterministic


def test_latency_percentiles() -> None:
    md = render_markdown(make_run())
    rows = table_after(md, "### io: per-operation latency")
    assert rows[0] == ["backend", "case", "layer", "operations", "p50 (ms)", "p95 (ms)", "p99 (ms)"]
    assert rows[1] == ["memory", "Random reads", "agentvfs", "101", "50.0", "95.0", "99.0"]
    search = table_after(md, "### search: per-operation latency")
    # 1, 2, 4 ms: p95 interpolates between 2 and 4 at 0.9 of the way.
    assert search[1][4:] == ["2.00", "3.80", "3.96"]


def test_partial_warning_and_plots() -> None:
    md = render_markdown(make_run(partial=True), plots=["io_throughput.png", "runs/x/latency.png"])
    lines = md.split("\n")
    assert lines[0] == "# agentvfs bench"
    assert lines[2].startswith("**PARTIAL RESULTS**: interrupted during metadata")
    assert "![I/O throughput](io_throughput.png)" in md
    assert "![Latency distributions](runs/x/latency.png)" in md


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Written:
    run = make_run()
    out = tmp_path_factory.mktemp("run")
    return run, out, write_report(run, out)


def test_write_report_round_trip(report_dir: Written) -> None:
    run, _, written = report_dir
    assert set(written) == {"results.json", "report.md", "io_throughput.png", "latency.png", "metadata_scaling.png"}
    back = RunResult.from_json(json.loads(written["results.json"].read_text(encoding="utf-8")))
    assert back.measurements == run.measurements
    assert back == run
    report = written["report.md"].read_text(encoding="utf-8")
    assert report == render_markdown(run, plots=["io_throughput.png", "latency.png", "metadata_scaling.png"])
    assert "![Metadata operations by directory size](metadata_scaling.png)" in report


def test_plots_are_pngs(report_dir: Written) -> None:
    _, out, written = report_dir
    for name in ("io_throughput.png", "latency.png", "metadata_scaling.png"):
        data = written[name].read_bytes()
        assert written[name].parent == out
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 5_000  # a drawn figure, not an empty canvas


def test_plots_skipped_without_data(tmp_path: Path) -> None:
    run = make_run()
    assert render_plots(RunResult("x", "t", {}, {}), tmp_path) == []
    # Only search latencies; io measurements that failed or were skipped draw nothing.
    run.measurements = [m for m in run.measurements if m.suite == "search" or m.layer in ("fsspec.fuse", "rclone")]
    assert render_plots(run, tmp_path) == [tmp_path / "latency.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latency.png"]
    assert (tmp_path / "latency.png").read_bytes().startswith(PNG_SIGNATURE)


def test_regenerate_inserts_and_replaces(tmp_path: Path, report_dir: Written) -> None:
    _, run_dir, _ = report_dir
    docs = tmp_path / "docs"
    docs.mkdir()
    results_md = docs / "RESULTS.md"
    head = "# Benchmark results\r\n"
    tail = "\nOlder numbers, kept by hand.\r\n\n## vfs overhead\n\n| a | b |\n"
    results_md.write_bytes((head + tail).encode())

    regenerate_results_md(run_dir, results_md)
    text = results_md.read_bytes().decode()
    assert text.startswith(head + "\n" + BEGIN_MARKER + "\n")
    assert text.endswith(END_MARKER + "\n" + tail)
    inside = text[text.index(BEGIN_MARKER) : text.index(END_MARKER)]
    assert f"`agentvfs bench --regenerate {run_dir.as_posix()}`" in inside
    assert "`agentvfs bench --size tiny --repeat 3`" in inside
    assert run_dir.parent == tmp_path.parent  # both in pytest's base temporary directory
    # One title in the file: the report's headings moved one level down.
    assert [line for line in text.splitlines() if line.startswith("# ")] == ["# Benchmark results"]
    assert "\n## agentvfs bench\n" in inside and "\n### I/O\n" in inside and "\n#### io on memory\n" in inside
    assert f"](../../{run_dir.name}/io_throughput.png)" in inside

    regenerate_results_md(run_dir, results_md)
    assert results_md.read_bytes().decode() == text  # idempotent

    # Edits outside survive byte for byte; the inside follows the run.
    edited = "Preface.\r\n" + text + "Appendix\n"
    results_md.write_bytes(edited.replace("Random reads", "STALE").encode())
    other = tmp_path / "other"
    changed = make_run()
    changed.command = "agentvfs bench --size small"
    write_report(changed, other)
    regenerate_results_md(other, results_md)
    new = results_md.read_bytes().decode()
    begin, end = new.index(BEGIN_MARKER), new.index(END_MARKER)
    assert new[:begin] == edited[: edited.index(BEGIN_MARKER)]
    assert new[end:] == edited[edited.index(END_MARKER) :]
    assert "STALE" not in new and "Random reads" in new[begin:end]
    assert "`agentvfs bench --size small`" in new[begin:end]
    assert "](../other/io_throughput.png)" in new


def test_regenerate_without_heading_and_bad_markers(tmp_path: Path, report_dir: Written) -> None:
    _, run_dir, _ = report_dir
    md = tmp_path / "notes.md"
    md.write_text("Just prose.\n", encoding="utf-8")
    regenerate_results_md(run_dir, md)
    text = md.read_text(encoding="utf-8")
    assert text.startswith(BEGIN_MARKER + "\n")
    assert text.endswith(END_MARKER + "\n\nJust prose.\n")

    md.write_text(f"# T\n{BEGIN_MARKER}\nno end\n", encoding="utf-8")
    with pytest.raises(ValueError, match="agentvfs bench: end"):
        regenerate_results_md(run_dir, md)
    assert md.read_text(encoding="utf-8") == f"# T\n{BEGIN_MARKER}\nno end\n"


def test_odd_measurements_do_not_crash(tmp_path: Path) -> None:
    """Zero-time samples, errors next to samples, zero latencies, odd params: still a report."""
    run = RunResult("agentvfs bench", "t0", {}, {}, finished=None)
    run.add(Measurement("io", "read", "s3", "direct", "Read | tiny", "MiB/s", amount=MiB, samples=[0.0, 0.5]))
    run.add(Measurement("io", "read", "s3", "agentvfs", "Read | tiny", "MiB/s", amount=MiB, samples=[0.25],
                        errors=["Timeout: 30 s\nline two"], notes=["cold"]))  # fmt: skip
    run.add(Measurement("io", "lat", "s3", "direct", "Latency", "ms", latencies=[0.0, 0.0]))
    run.add(Measurement("io", "lat", "s3", "agentvfs", "Latency", "ms", latencies=[0.001, 1.0]))
    run.add(Measurement("metadata", "ls", "s3", "direct", "ls", "s", params={"entries": "many"}, samples=[1.0]))
    run.add(Measurement("metadata", "ls", "s3", "agentvfs", "ls", "s", params={"entries": 1}, errors=["boom"]))
    md = render_markdown(run)
    rows = table_after(md, "### io on s3")
    # 1 MiB in 0 s is an infinite rate; the median of (inf, 2) is inf.
    assert rows[1][0] == "Read \\| tiny"
    assert rows[1][1] == "∞ MiB/s [2.00–∞]"
    assert re.fullmatch(r"4\.00 MiB/s \(\d+\) \(\d+\)", rows[1][2])
    assert "1 round(s) failed: Timeout: 30 s line two" in md
    assert "Note: cold" in md
    assert "not recorded" in md
    meta = table_after(md, "### metadata on s3")
    assert [r[0] for r in meta[1:]] == ["ls (entries=many)", "ls (1 entry)"]
    written = render_plots(run, tmp_path)
    assert [p.name for p in written] == ["io_throughput.png", "latency.png"]


def test_which_layer_to_use() -> None:
    md = render_markdown(make_run())
    advice = md[md.index("## Which layer to use") : md.index("## Configuration")]
    assert "On **memory** (each share is of the direct fsspec API" in advice
    # The best mountable layer, its share of the limit, and the layers that failed the case.
    assert "- Sequential read (64 MiB): **agentvfs**, 102 MiB/s (80% of direct); failed: fsspec.fuse" in advice
    assert "- grep -r: **agentvfs**, 0.400 s (62% of direct)" in advice  # a time: lower is better
    # On local the only other layer is the disk itself (the limit): nothing to choose.
    assert "On **local**" not in advice
    run = make_run()
    run.add(seq_read("local", "agentvfs", samples=rate_samples(64, [1200.0, 1300.0])))
    run.add(seq_read("local", "rclone", samples=rate_samples(64, [300.0, 320.0])))
    local = render_markdown(run)
    assert "- Sequential read (64 MiB): **agentvfs**, 1,250 MiB/s (81% of local disk); then rclone, 310 MiB/s" in local
