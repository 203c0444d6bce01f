"""What a benchmark run records: measurements, the run around them, and their JSON form.

A `Measurement` is one case (say "sequential read, 64 MiB") on one backend through one layer
(direct fsspec, the agentvfs mount, a peer mounter, ...) with every repetition kept. Values
are derived from the raw samples when a report is made, never stored twice, so a committed
``results.json`` is enough to regenerate every table and plot.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DIRECT", "SCHEMA_VERSION", "Measurement", "RunResult", "Unit"]

SCHEMA_VERSION = 1

#: The layer every ratio is computed against: the backend's own fsspec API in this process.
DIRECT = "direct"

#: How a measurement's samples turn into its headline value.
#:
#: ``MiB/s`` and ``ops/s``: samples are seconds for ``amount`` bytes or operations; the value is
#: ``amount / seconds`` (bytes shown in MiB). ``s`` and ``ms``: samples are seconds, shown as
#: such (lower is better). ``score``: samples are already the value (recall, nDCG; higher is
#: better).
Unit = str
RATE_UNITS = ("MiB/s", "ops/s")
TIME_UNITS = ("s", "ms")
_MiB = 1 << 20


@dataclass
class Measurement:
    """Every repetition of one case on one backend through one layer.

    Parameters
    ----------
    suite, case : str
        Suite name (``io``, ``metadata``, ...) and a short stable case key (``seq_read_cold``).
    backend, layer : str
        Storage backend (``memory``, ``local``, ``s3``, ``gcs``) and access layer.
    label : str
        The case in words, for tables and plot titles.
    unit : str
        One of `RATE_UNITS`, `TIME_UNITS` or ``"score"``.
    amount : float
        Bytes (``MiB/s``) or operations (``ops/s``) behind each sample; 0 otherwise.
    params : dict
        What varies within a case, such as ``{"entries": 1000}``; part of the identity.
    """

    suite: str
    case: str
    backend: str
    layer: str
    label: str
    unit: Unit
    amount: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)
    #: Per-operation latencies in seconds (random reads, queries), pooled over repetitions.
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Why the case did not run on this layer (unsupported, over budget); not an error.
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identity of the case apart from the layer, for pairing with the baseline."""
        return (self.suite, self.case, self.backend, _params_key(self.params))

    def values(self) -> list[float]:
        """Each sample in the measurement's unit."""
        return [self.convert(s) for s in self.samples]

    def convert(self, sample: float) -> float:
        """One raw sample in the measurement's unit."""
        if self.unit == "MiB/s":
            return self.amount / _MiB / sample if sample > 0 else float("inf")
        if self.unit == "ops/s":
            return self.amount / sample if sample > 0 else float("inf")
        if self.unit == "ms":
            return sample * 1e3
        return sample

    def median(self) -> float | None:
        """Median of the values, or None without samples."""
        vals = self.values()
        return statistics.median(vals) if vals else None

    def spread(self) -> tuple[float, float] | None:
        """Lowest and highest value, or None with fewer than two samples."""
        vals = self.values()
        return (min(vals), max(vals)) if len(vals) > 1 else None

    @property
    def higher_is_better(self) -> bool:
        return self.unit not in TIME_UNITS

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        return cls(**data)


def _params_key(params: dict[str, Any]) -> str:
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def pair_ratio(layer: Measurement, base: Measurement) -> float | None:
    """How the layer compares with the baseline, repetition by repetition.

    Repetitions are interleaved (round i runs the baseline, then every layer), so sample i of
    each was taken under the same conditions; the ratio is the median of the per-round ratios
    of the values (a rate ratio for rates, a time ratio for times). Rounds where either side
    failed are left out.
    """
    pairs = [(a, b) for a, b in zip(layer.values(), base.values(), strict=False)
             if 0 < a < math.inf and 0 < b < math.inf]
    if not pairs:
        return None
    return statistics.median(a / b for a, b in pairs)


@dataclass
class RunResult:
    """One ``agentvfs bench`` run: what was asked, where, and everything measured."""

    command: str
    started: str
    machine: dict[str, str]
    config: dict[str, Any]
    finished: str | None = None
    #: True when the run was interrupted or a suite aborted: the results are incomplete.
    partial: bool = False
    partial_reason: str | None = None
    measurements: list[Measurement] = field(default_factory=list)
    #: Layers and peers not run, each with the reason (not installed, not supported here).
    skipped: list[str] = field(default_factory=list)
    #: Misbehaviour worth reading (a mount that would not stop, a peer that failed to mount).
    problems: list[str] = field(default_factory=list)
    #: How each layer was run, per backend: ``{"s3 rclone": "rclone mount ... --vfs-cache-mode writes"}``.
    layers: dict[str, str] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    def add(self, m: Measurement) -> Measurement:
        self.measurements.append(m)
        return m

    def find(self, suite: str, case: str, backend: str, layer: str, params: dict[str, Any] | None = None) -> Measurement | None:
        want = (suite, case, backend, _params_key(params or {}))
        for m in self.measurements:
            if m.key == want and m.layer == layer:
                return m
        return None

    def baseline(self, m: Measurement) -> Measurement | None:
        """The direct-layer measurement of the same case, backend and parameters."""
        if m.layer == DIRECT:
            return None
        return self.find(m.suite, m.case, m.backend, DIRECT, m.params)

    def skip_once(self, message: str) -> None:
        if message not in self.skipped:
            self.skipped.append(message)

    def problem(self, message: str) -> None:
        if message not in self.problems:
            self.problems.append(message)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["measurements"] = [m.to_json() for m in self.measurements]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"results schema {data.get('schema')!r} is not {SCHEMA_VERSION}; rerun the benchmark")
        fields = dict(data)
        fields["measurements"] = [Measurement.from_json(m) for m in data.get("measurements", [])]
        return cls(**fields)
