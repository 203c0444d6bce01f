"""Turning a `RunResult` into ``report.md``, PNG plots and the block in ``RESULTS.md``.

Everything here is derived from the run alone (its raw samples, never a stored median), so a
committed ``results.json`` regenerates the same tables and plots on any machine, and rendering
the same run twice gives the same Markdown byte for byte.

matplotlib is imported inside `render_plots` only: the CLI imports this module on every
``agentvfs bench`` call, and the plots are the one part that needs it.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from ._model import DIRECT, TIME_UNITS, Measurement, RunResult, pair_ratio

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

__all__ = [
    "BEGIN_MARKER",
    "END_MARKER",
    "PLOT_NAMES",
    "regenerate_results_md",
    "render_markdown",
    "render_plots",
    "write_report",
]

BEGIN_MARKER = "<!-- agentvfs bench: begin -->"
END_MARKER = "<!-- agentvfs bench: end -->"

#: Every plot `render_plots` may write, in the order it writes them, with its title.
PLOT_NAMES: dict[str, str] = {
    "io_throughput.png": "I/O throughput",
    "latency.png": "Latency distributions",
    "metadata_scaling.png": "Metadata operations by directory size",
}

#: Suites in the order a reader expects them; any other suite follows in order of appearance.
_SUITE_ORDER = ("io", "metadata", "agent", "search", "sandbox")
_SUITE_TITLES = {
    "io": "I/O",
    "metadata": "Metadata",
    "agent": "Agent workloads",
    "search": "Search",
    "sandbox": "Sandbox",
}

_DPI = 110
#: A chart switches to a log axis when its largest value is this many times its smallest, so
#: a 5 GiB/s memory read does not flatten a 50 MiB/s network mount into an invisible bar.
_LOG_RANGE = 50.0


# --------------------------------------------------------------------------------------------
# Number formatting
# --------------------------------------------------------------------------------------------


def _fmt_number(value: float) -> str:
    """Three significant digits, thousands separators, never scientific notation.

    ``1234.5 -> "1,234"``, ``128.0 -> "128"``, ``12.34 -> "12.3"``, ``0.5 -> "0.500"``.
    Whole numbers of 100 and more keep every digit: dropping them would make ``12,345 ops/s``
    read as ``12,300``, which is no clearer and is wrong.
    """
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, 2 - magnitude)
    # Rounding may carry into the next power of ten (0.9996 -> "1.000"): one digit too many,
    # which is harmless.
    return f"{value:,.{decimals}f}"


def _fmt_value(value: float, unit: str) -> str:
    """A value with its unit: ``1,234 MiB/s``, ``0.123 s``, ``1.23 ms``; scores bare."""
    if unit == "score" or not unit:
        return _fmt_number(value)
    return f"{_fmt_number(value)} {unit}"


def _fmt_ratio(ratio: float) -> str:
    """``×0.85``: two decimals in the usual range, three significant digits outside it."""
    if 0.1 <= ratio < 10:
        return f"×{ratio:.2f}"
    return f"×{_fmt_number(ratio)}"


def _fmt_params(params: dict[str, Any]) -> str:
    """``{"entries": 1000}`` -> ``1,000 entries``; ``{"jobs": 1}`` -> ``1 job``."""
    parts = []
    for key in sorted(params):
        value = params[key]
        if isinstance(value, int) and not isinstance(value, bool):
            noun = key.replace("_", " ")
            if value == 1:
                noun = noun[:-3] + "y" if noun.endswith("ies") else noun.removesuffix("s")
            parts.append(f"{value:,} {noun}")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def _case_label(m: Measurement, varying: bool = True) -> str:
    """The case in words, with its parameters when they tell rows of one case apart."""
    label = m.label or m.case
    return f"{label} ({_fmt_params(m.params)})" if m.params and varying else label


def _cell_text(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, no column separators."""
    return " ".join(text.split()).replace("|", "\\|")


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _code(text: str) -> str:
    """An inline code span that survives backticks inside ``text``."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fmt_setting(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(_fmt_setting(v) for v in value) if value else "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt_setting(v)}" for k, v in value.items()) if value else "—"
    return str(value)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _ratio(run: RunResult, m: Measurement) -> float | None:
    """How ``m`` compares with the direct layer, oriented so that above 1 is always faster.

    For rates (and scores) that is layer/direct; for times direct/layer, which is
    `pair_ratio` with its arguments swapped: the median of the per-round direct/layer ratios,
    exactly, rather than the reciprocal of a median (they differ with an even round count).
    """
    base = run.baseline(m)
    if base is None or base.unit != m.unit or not m.samples or not base.samples:
        return None
    ratio = pair_ratio(base, m) if m.unit in TIME_UNITS else pair_ratio(m, base)
    # A sample of zero seconds is an infinite rate, and a ratio of 0 or ∞ says nothing.
    return ratio if ratio is not None and math.isfinite(ratio) and ratio > 0 else None


def _ordered_suites(measurements: Iterable[Measurement]) -> list[str]:
    seen = list(dict.fromkeys(m.suite for m in measurements))
    known = [s for s in _SUITE_ORDER if s in seen]
    return known + [s for s in seen if s not in _SUITE_ORDER]


def _ordered_layers(measurements: Iterable[Measurement]) -> list[str]:
    layers = list(dict.fromkeys(m.layer for m in measurements))
    if DIRECT in layers:
        layers.remove(DIRECT)
        layers.insert(0, DIRECT)
    return layers


def _ordered_rows(measurements: Sequence[Measurement]) -> list[tuple[str, str]]:
    """(case, params key) rows: cases as first seen, each case's parameter values together.

    A suite may loop over directory sizes outside its cases (create 10, stat 10, ..., create
    100, ...); grouping by case keeps one operation's scaling in consecutive rows.
    """
    cases = list(dict.fromkeys(m.case for m in measurements))
    rows = list(dict.fromkeys((m.case, m.key[3]) for m in measurements))
    return [row for case in cases for row in rows if row[0] == case]


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


@dataclass
class _Footnotes:
    """Numbered notes under one table; numbers run on through the whole report."""

    start: int
    entries: dict[str, int] = field(default_factory=dict)

    def ref(self, text: str) -> str:
        # The same text (one skip reason on every case of a layer) shares one number.
        if text not in self.entries:
            self.entries[text] = self.start + len(self.entries)
        return f"({self.entries[text]})"

    @property
    def next_number(self) -> int:
        return self.start + len(self.entries)

    def lines(self) -> list[str]:
        return [f"- ({number}) {text}" for text, number in self.entries.items()]


def _error_text(errors: Sequence[str]) -> str:
    counts = dict.fromkeys(errors, 0)
    for error in errors:
        counts[error] += 1
    parts = [_one_line(e) + (f" (×{n})" if n > 1 else "") for e, n in counts.items()]
    return "; ".join(parts)


def _cell(run: RunResult, m: Measurement | None, notes: _Footnotes) -> tuple[str, bool]:
    """One table cell, and whether it shows a ratio (the table then explains ratios)."""
    if m is None:
        return "—", False
    if m.skipped is not None:
        return f"skipped {notes.ref('Skipped: ' + _one_line(m.skipped))}", False
    median = m.median()
    refs = []
    if m.errors:
        prefix = "Error: " if median is None else f"{len(m.errors)} round(s) failed: "
        refs.append(notes.ref(prefix + _error_text(m.errors)))
    refs.extend(notes.ref("Note: " + _one_line(note)) for note in m.notes)
    if median is None:
        head = "error" if m.errors else "—"
        return _cell_text(" ".join([head, *refs])), False
    parts = [_fmt_value(median, m.unit)]
    spread = m.spread()
    if spread is not None:
        parts.append(f"[{_fmt_number(spread[0])}–{_fmt_number(spread[1])}]")
    ratio = _ratio(run, m)
    if ratio is not None:
        parts.append(_fmt_ratio(ratio))
    return _cell_text(" ".join(parts + refs)), ratio is not None


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str]) -> list[str]:
    lines = ["| " + " | ".join(_cell_text(h) for h in header) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def _backend_table(run: RunResult, ms: Sequence[Measurement], first_note: int) -> tuple[list[str], int]:
    """The table of one suite on one backend, with its notes; returns the next note number."""
    layers = _ordered_layers(ms)
    by_cell = {(m.case, m.key[3], m.layer): m for m in reversed(ms)}  # first one wins
    notes = _Footnotes(first_note)
    rows = []
    any_ratio = False
    ordered = _ordered_rows(ms)
    per_case = collections.Counter(case for case, _ in ordered)
    for case, params in ordered:
        first = by_cell[next((case, params, layer) for layer in layers if (case, params, layer) in by_cell)]
        # A parameter every row shares (the corpus, the tree size) is noise in each label.
        row = [_cell_text(_case_label(first, varying=per_case[case] > 1))]
        for layer in layers:
            text, has_ratio = _cell(run, by_cell.get((case, params, layer)), notes)
            row.append(text)
            any_ratio |= has_ratio
        rows.append(row)
    lines = _table(["case", *layers], rows, ["l"] + ["r"] * len(layers))
    if any_ratio:
        lines += [
            "",
            f"×: against `{DIRECT}`, median of the per-round ratios: layer/direct for rates, direct/layer "
            "for times, so above 1 is faster than direct either way.",
        ]
    if notes.entries:
        lines += ["", *notes.lines()]
    return lines, notes.next_number


def _latency_table(ms: Sequence[Measurement]) -> list[str]:
    rows = []
    for m in ms:
        lat = sorted(m.latencies)
        p50, p95, p99 = (_fmt_number(_percentile(lat, q) * 1e3) for q in (0.50, 0.95, 0.99))
        rows.append([_cell_text(m.backend), _cell_text(_case_label(m)), _cell_text(m.layer), f"{len(lat):,}",
                     p50, p95, p99])  # fmt: skip
    header = ["backend", "case", "layer", "operations", "p50 (ms)", "p95 (ms)", "p99 (ms)"]
    return _table(header, rows, ["l", "l", "l", "r", "r", "r", "r"])


def render_markdown(run: RunResult, *, plots: Sequence[str] = ()) -> str:
    """The run as a Markdown report.

    Parameters
    ----------
    run : RunResult
        The run to describe.
    plots : sequence of str
        Image paths to embed at the end, as they should appear in the links (relative to where
        the Markdown will live), e.g. ``["io_throughput.png"]``.

    Returns
    -------
    str
        The report, ending with a newline. Only the run's own timestamps appear in it, so
        the same run always renders to the same text.
    """
    out: list[str] = ["# agentvfs bench", ""]
    if run.partial:
        reason = run.partial_reason or "the run did not finish"
        out += [f"**PARTIAL RESULTS**: {_one_line(reason).rstrip('.')}. Some suites, backends or layers are missing.",
                ""]
    out += [f"Command: {_code(run.command)}", ""]
    finished = run.finished or "not recorded (the run did not finish)"
    out += [f"Started {run.started}, finished {finished}.", ""]
    out += [
        "Each cell is the median over the repetitions, then `[lowest–highest]` when the case was "
        f"repeated, then `×ratio` against the `{DIRECT}` layer of the same backend when there is one.",
        "",
    ]
    advice = _which_layer(run)
    if advice:
        out += ["## Which layer to use", "", *advice, ""]
    if run.config:
        out += ["## Configuration", ""]
        rows = [[_cell_text(str(k)), _cell_text(_fmt_setting(v))] for k, v in run.config.items()]
        out += [*_table(["setting", "value"], rows, ["l", "l"]), ""]
    if run.machine:
        out += ["## Machine", ""]
        rows = [[_cell_text(k), _cell_text(v)] for k, v in run.machine.items()]
        out += [*_table(["component", "value"], rows, ["l", "l"]), ""]

    note = 1
    for suite in _ordered_suites(run.measurements):
        suite_ms = [m for m in run.measurements if m.suite == suite]
        out += [f"## {_SUITE_TITLES.get(suite, suite)}", ""]
        for backend in dict.fromkeys(m.backend for m in suite_ms):
            lines, note = _backend_table(run, [m for m in suite_ms if m.backend == backend], note)
            out += [f"### {suite} on {backend}", "", *lines, ""]
        with_latencies = [m for m in suite_ms if m.latencies]
        if with_latencies:
            out += [f"### {suite}: per-operation latency", "", *_latency_table(with_latencies), ""]

    if run.layers:
        out += ["## Layers", ""]
        out += [f"- **{_cell_text(name)}**: {_code(_one_line(how, 1000))}" for name, how in run.layers.items()]
        out += [""]
    if run.skipped:
        out += ["## Skipped", "", *(f"- {_one_line(s, 1000)}" for s in run.skipped), ""]
    if run.problems:
        out += ["## Problems", "", *(f"- {_one_line(p, 1000)}" for p in run.problems), ""]
    if plots:
        out += ["## Plots", ""]
        for plot in plots:
            name = PurePosixPath(plot).name
            title = PLOT_NAMES.get(name, PurePosixPath(plot).stem.replace("_", " "))
            out += [f"![{title}]({plot})", ""]
    return "\n".join(out).rstrip("\n") + "\n"


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


#: The layer that shows what each storage allows without a mount in between: the disk
#: itself, boto3 on S3; elsewhere the direct fsspec layer stands in.
_LIMIT_LAYERS = {"local": "local disk", "s3": "boto3"}
#: The suites whose cases the advice covers (the others compare engines, not layers).
_ADVICE_SUITES = ("io", "metadata", "agent")


def _which_layer(run: RunResult) -> list[str]:
    """A paragraph per backend: for each case, the best layer among the ones a user can mount
    (not the direct API, not the limit), its figure, and that figure as a share of what the
    storage allows; then the runner-up."""
    out: list[str] = []
    for backend in dict.fromkeys(m.backend for m in run.measurements):
        limit_layer = _LIMIT_LAYERS.get(backend, DIRECT)
        lines: list[str] = []
        cases = [m for m in run.measurements if m.backend == backend and m.suite in _ADVICE_SUITES]
        for key in dict.fromkeys(m.key for m in cases):
            ms = [m for m in cases if m.key == key]
            limit = next((m for m in ms if m.layer == limit_layer), None) or next(
                (m for m in ms if m.layer == DIRECT), None
            )
            choices = [m for m in ms if m.layer not in (DIRECT, limit_layer) and _finite_median(m) is not None]
            if not choices:
                continue
            choices.sort(key=lambda m: _finite_median(m) or 0.0, reverse=choices[0].higher_is_better)
            best = choices[0]
            value = _finite_median(best) or 0.0
            text = f"- {_case_label(best)}: **{best.layer}**, {_fmt_value(value, best.unit)}"
            base = _finite_median(limit) if limit is not None else None
            if limit is not None and base:
                share = value / base if best.higher_is_better else base / value if value else 0.0
                text += f" ({share:.0%} of {limit.layer})"
            if len(choices) > 1:
                second = choices[1]
                text += f"; then {second.layer}, {_fmt_value(_finite_median(second) or 0.0, second.unit)}"
            failed = [m.layer for m in ms if m.errors and _finite_median(m) is None]
            if failed:
                text += f"; failed: {', '.join(failed)}"
            lines.append(text)
        if lines:
            what = "the disk itself" if limit_layer == "local disk" else (
                "boto3 with no mount in between" if limit_layer == "boto3" else "the direct fsspec API"
            )
            out += [f"On **{backend}** (each share is of {what}, the most this storage gives here):", "", *lines, ""]
    return out[:-1] if out else out


def _finite_median(m: Measurement) -> float | None:
    if m.skipped is not None:
        return None
    value = m.median()
    return value if value is not None and math.isfinite(value) else None


def _wide(values: Iterable[float]) -> bool:
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(positive) and max(positive) / min(positive) > _LOG_RANGE


def _error_bars(ms: Sequence[Measurement], medians: Sequence[float]) -> list[list[float]]:
    """Asymmetric error bars (below, above) from each measurement's lowest and highest value."""
    below, above = [], []
    for m, med in zip(ms, medians, strict=True):
        spread = m.spread()
        if spread is None or not all(math.isfinite(v) for v in spread):
            below.append(0.0)
            above.append(0.0)
        else:
            below.append(max(0.0, med - spread[0]))
            above.append(max(0.0, spread[1] - med))
    return [below, above]


def _layer_colors(run: RunResult) -> dict[str, str]:
    """One colour per layer for the whole run, so a layer looks the same in every plot."""
    palette = [f"C{i}" for i in range(10)]
    layers = _ordered_layers(run.measurements)
    return {layer: palette[i % len(palette)] for i, layer in enumerate(layers)}


def _thousands(axis: Axis) -> None:
    """Tick labels as in the tables (``22,500``) rather than matplotlib's ``22500``."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda x, _pos: _fmt_number(x)))


def _save(fig: Figure, path: Path) -> Path:
    # No "Software" entry: the PNG then does not change with the matplotlib version alone.
    fig.savefig(path, dpi=_DPI, metadata={"Software": None})
    return path


def _plot_io(run: RunResult, path: Path, colors: dict[str, str]) -> Path | None:
    import matplotlib.pyplot as plt

    io = [m for m in run.measurements if m.suite == "io" and m.unit == "MiB/s"]
    # A case that failed on a layer is drawn as a labelled mark, not left out.
    data = [m for m in io if _finite_median(m) is not None or m.errors]
    if not any(_finite_median(m) is not None for m in data):
        return None
    backends = list(dict.fromkeys(m.backend for m in data))
    groups = [[m for m in data if m.backend == b] for b in backends]
    heights = [1.2 + 0.28 * len(_ordered_rows(g)) * len(_ordered_layers(g)) for g in groups]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, sum(heights)), squeeze=False, layout="constrained",
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    try:
        for ax, backend, group in zip(axes[:, 0], backends, groups, strict=True):
            _io_axes(ax, backend, group, colors)
        return _save(fig, path)
    finally:
        plt.close(fig)


def _io_axes(ax: Axes, backend: str, group: Sequence[Measurement], colors: dict[str, str]) -> None:
    rows = _ordered_rows(group)
    layers = _ordered_layers(group)
    bar = 0.8 / len(layers)
    labels = {(m.case, m.key[3]): _case_label(m) for m in reversed(group)}
    for j, layer in enumerate(layers):
        ms = [m for m in group if m.layer == layer]
        index = {(m.case, m.key[3]): m for m in reversed(ms)}
        present = [(i, index[row]) for i, row in enumerate(rows) if row in index]
        failed = [(i, m) for i, m in present if _finite_median(m) is None]
        present = [(i, m) for i, m in present if _finite_median(m) is not None]
        ys = [i - 0.4 + bar * (j + 0.5) for i, _ in present]
        medians = [_finite_median(m) or 0.0 for _, m in present]
        if present:
            bars = ax.barh(ys, medians, height=bar * 0.9, color=colors[layer], label=layer,
                           xerr=_error_bars([m for _, m in present], medians), capsize=2)  # fmt: skip
            ax.bar_label(bars, labels=[_fmt_number(v) for v in medians], padding=3, fontsize=7)
        for n, (i, _) in enumerate(failed):
            y = i - 0.4 + bar * (j + 0.5)
            # The legend names the layer by its bars, or by this mark where it has none.
            shown = layer if not present and n == 0 else None
            ax.plot([0], [y], marker="x", linestyle="none", color=colors[layer], markersize=6, clip_on=False,
                    label=shown)  # fmt: skip
            ax.annotate(f"{layer}: failed (see Problems)", (0, y), xytext=(6, 0), textcoords="offset points",
                        va="center", fontsize=7, color=colors[layer])  # fmt: skip
    ax.set_yticks(range(len(rows)), [labels[row] for row in rows], fontsize=8)
    ax.invert_yaxis()  # first case at the top, as in the tables
    ax.set_title(f"io on {backend}", fontsize=10)
    ax.set_xlabel("MiB/s (median; bars: lowest–highest); higher is better")
    if _wide(m.median() or 0.0 for m in group):
        ax.set_xscale("log")
    else:
        _thousands(ax.xaxis)
    ax.margins(x=0.15)  # room for the value labels at the ends of the bars
    # Outside the axes: inside, the legend would hide the longest bar's label.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _boxplot_orientation() -> dict[str, Any]:
    """``orientation="horizontal"`` from matplotlib 3.10 (``vert=False`` is deprecated there)."""
    import matplotlib

    version = tuple(int(p) for p in re.findall(r"\d+", matplotlib.__version__)[:2])
    return {"orientation": "horizontal"} if version >= (3, 10) else {"vert": False}


def _plot_latency(run: RunResult, path: Path, colors: dict[str, str]) -> Path | None:
    import matplotlib.pyplot as plt

    data = [m for m in run.measurements if m.latencies and m.skipped is None]
    if not data:
        return None
    groups = list(dict.fromkeys((m.suite, m.backend) for m in data))
    members = [[m for m in data if (m.suite, m.backend) == g] for g in groups]
    heights = [1.2 + 0.35 * len(ms) for ms in members]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, sum(heights)), squeeze=False, layout="constrained",
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    try:
        for ax, (suite, backend), ms in zip(axes[:, 0], groups, members, strict=True):
            values = [[v * 1e3 for v in m.latencies] for m in ms]
            wide = _wide(v for vs in values for v in vs)
            if wide:
                # A log axis cannot place a zero; such a latency is below the clock's resolution.
                values = [[v for v in vs if v > 0] or [float("nan")] for vs in values]
            box = ax.boxplot(values, positions=range(len(ms)), widths=0.6, patch_artist=True,
                             flierprops={"markersize": 2}, medianprops={"color": "black"},
                             **_boxplot_orientation())  # fmt: skip
            for patch, m in zip(box["boxes"], ms, strict=True):
                patch.set_facecolor(colors[m.layer])
                patch.set_alpha(0.6)
            ax.set_yticks(range(len(ms)), [f"{_case_label(m)} · {m.layer}" for m in ms], fontsize=8)
            ax.invert_yaxis()
            if wide:
                ax.set_xscale("log")
            ax.set_xlabel("latency (ms); lower is better")
            ax.set_title(f"{suite} on {backend}", fontsize=10)
        return _save(fig, path)
    finally:
        plt.close(fig)


def _plot_metadata(run: RunResult, path: Path, colors: dict[str, str]) -> Path | None:
    import matplotlib.pyplot as plt

    def usable(m: Measurement) -> bool:
        entries = m.params.get("entries")
        ok = isinstance(entries, int | float) and not isinstance(entries, bool) and entries > 0
        return m.suite == "metadata" and ok and _finite_median(m) is not None

    data = [m for m in run.measurements if usable(m)]
    if not data:
        return None
    cases = list(dict.fromkeys(m.case for m in data))
    backends = list(dict.fromkeys(m.backend for m in data))
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v"]
    ncols = min(2, len(cases))
    nrows = math.ceil(len(cases) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 3.6 * nrows + 0.8), squeeze=False,
                             layout="constrained")  # fmt: skip
    try:
        handles: dict[str, Any] = {}
        for ax, case in zip(axes.flat, cases, strict=False):
            ms = [m for m in data if m.case == case]
            for m_line in dict.fromkeys((m.backend, m.layer) for m in ms):
                backend, layer = m_line
                line = sorted((m for m in ms if (m.backend, m.layer) == m_line), key=lambda m: m.params["entries"])
                xs = [float(m.params["entries"]) for m in line]
                ys = [_finite_median(m) or 0.0 for m in line]
                b = backends.index(backend)
                container = ax.errorbar(xs, ys, yerr=_error_bars(line, ys), color=colors[layer],
                                        linestyle=styles[b % len(styles)], marker=markers[b % len(markers)],
                                        markersize=4, capsize=2, label=f"{backend} / {layer}")  # fmt: skip
                handles.setdefault(f"{backend} / {layer}", container)
            ax.set_xscale("log")
            if _wide(m.median() or 0.0 for m in ms):
                ax.set_yscale("log")
            else:
                _thousands(ax.yaxis)
            ax.set_title(ms[0].label or case, fontsize=10)
            ax.set_xlabel("entries in the directory")
            ax.set_ylabel(f"{ms[0].unit} ({'higher' if ms[0].higher_is_better else 'lower'} is better)")
        for ax in list(axes.flat)[len(cases) :]:
            ax.set_visible(False)
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", fontsize=8,
                   ncols=min(4, len(handles)))  # fmt: skip
        return _save(fig, path)
    finally:
        plt.close(fig)


def render_plots(run: RunResult, out_dir: Path) -> list[Path]:
    """Draw the run's plots as PNG files in ``out_dir``.

    Parameters
    ----------
    run : RunResult
        The run to plot.
    out_dir : Path
        Directory for the files (created if missing).

    Returns
    -------
    list of Path
        The files written, in the order of `PLOT_NAMES`. A plot without data (no io
        throughput, no latencies, no metadata sizes; errored and skipped measurements do not
        count) is not drawn and not listed.
    """
    import matplotlib

    # Agg before pyplot: a benchmark host has no display, and a GUI backend would try one.
    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = _layer_colors(run)
    drawn = [
        _plot_io(run, out_dir / "io_throughput.png", colors),
        _plot_latency(run, out_dir / "latency.png", colors),
        _plot_metadata(run, out_dir / "metadata_scaling.png", colors),
    ]
    return [p for p in drawn if p is not None]


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def write_report(run: RunResult, out_dir: Path) -> dict[str, Path]:
    """Write ``results.json``, the PNG plots and ``report.md`` (embedding them) to ``out_dir``.

    ``results.json`` is written first, so an exception while plotting never loses the data.

    Parameters
    ----------
    run : RunResult
        The run to write.
    out_dir : Path
        Directory for the files (created if missing).

    Returns
    -------
    dict of str to Path
        Every file written, by file name: ``"results.json"``, ``"report.md"`` and each plot
        drawn (``"io_throughput.png"``, ...).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    results.write_text(json.dumps(run.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    written = {results.name: results}
    for plot in render_plots(run, out_dir):
        written[plot.name] = plot
    report = out_dir / "report.md"
    plots = [name for name in PLOT_NAMES if name in written]
    report.write_text(render_markdown(run, plots=plots), encoding="utf-8")
    written[report.name] = report
    return written


def _shift_headings(markdown: str) -> str:
    """Every ATX heading one level down (``#`` -> ``##``), leaving fenced code alone."""
    out = []
    fenced = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,5}(\s|$)", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out)


def _display_path(path: Path) -> str:
    """``path`` as the reader would type it: relative to the working directory when inside it."""
    if path.is_absolute():
        rel = os.path.relpath(path, Path.cwd())
        if not rel.startswith(".."):
            return Path(rel).as_posix()
    return path.as_posix()


def regenerate_results_md(run_dir: Path, results_md: Path) -> None:
    """Replace the generated block of ``results_md`` with the report of the run in ``run_dir``.

    The block lies between `BEGIN_MARKER` and `END_MARKER` lines; everything outside them is
    kept byte for byte. Without the markers, the block is inserted after the file's first
    heading line (or at the top when it has none; the file is created when missing). Headings
    inside the block are one level down, so the file keeps its own title, and image links
    are relative to the directory of ``results_md``. Running it twice gives the same file.

    Parameters
    ----------
    run_dir : Path
        A run directory written by `write_report` (its ``results.json`` and plots).
    results_md : Path
        The Markdown file to update.

    Raises
    ------
    ValueError
        If the file has one marker without the other, or the end marker before the begin one.
    """
    data = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    run = RunResult.from_json(data)
    rel_dir = Path(os.path.relpath(run_dir, results_md.parent)).as_posix()
    # Link the plots the run directory holds; they were drawn with the run and are committed with it.
    plots = [PurePosixPath(rel_dir, name).as_posix() for name in PLOT_NAMES
             if (run_dir / name).is_file()]  # fmt: skip
    body = _shift_headings(render_markdown(run, plots=plots))
    block = (
        f"{BEGIN_MARKER}\n"
        f"_Generated by {_code('agentvfs bench --regenerate ' + _display_path(run_dir))} from the committed run "
        f"(produced by {_code(run.command)}); edits between these markers are overwritten._\n"
        f"\n{body}\n{END_MARKER}"
    )
    # Bytes, not text mode: text mode would turn CRLF into LF and break "byte for byte".
    text = results_md.read_bytes().decode("utf-8") if results_md.exists() else ""
    begin = _marker_line(text, BEGIN_MARKER)
    end = _marker_line(text, END_MARKER)
    if begin is None and end is None:
        new = _insert_block(text, block)
    elif begin is None or end is None or end[0] < begin[1]:
        raise ValueError(f"{results_md}: expected {BEGIN_MARKER!r} and then {END_MARKER!r}, each on a line of its own")
    else:
        new = text[: begin[0]] + block + text[end[1] :]
    if new != text:
        results_md.write_bytes(new.encode("utf-8"))


def _marker_line(text: str, marker: str) -> tuple[int, int] | None:
    """Start and end offsets of ``marker`` alone on a line (trailing whitespace allowed)."""
    match = re.search(rf"^{re.escape(marker)}[ \t]*(?=\r?\n|$)", text, re.MULTILINE)
    return (match.start(), match.end()) if match else None


def _insert_block(text: str, block: str) -> str:
    """``text`` with ``block`` after its first heading line (outside code), or at the top."""
    fenced = False
    offset = 0
    for line in text.splitlines(keepends=True):
        offset += len(line)
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6}(\s|$)", line):
            head, rest = text[:offset], text[offset:]
            # Blank lines around the block, so it does not run into the heading or the next paragraph.
            before = "\n" if head.endswith("\n") else "\n\n"
            after = "\n" if rest.startswith(("\n", "\r\n")) or not rest else "\n\n"
            return f"{head}{before}{block}{after}{rest}"
    return f"{block}\n\n{text}" if text else f"{block}\n"
