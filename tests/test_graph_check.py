"""check_graph: hnswlib graph files from untrusted storage are accepted as hnswlib writes them,
refused with a message naming the fault when forged, and never let hnswlib read out of bounds."""

from __future__ import annotations

import random
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from agentvfs.search._vector_graphs import _HEADER, check_graph, hnswlib

# Header fields by position in _HEADER.
MAX_ELEMENTS, MAXLEVEL, ENTERPOINT, MAX_M0, MULT = 1, 6, 7, 9, 11


def build(path: Path, n: int, dim: int, m: int, space: str, seed: int = 0) -> bytes:
    """The bytes of an hnswlib graph of ``n`` random vectors labelled 0 .. n-1."""
    vectors = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    index = hnswlib().Index(space=space, dim=dim)
    index.init_index(max_elements=n, M=m, ef_construction=100, random_seed=1)
    index.add_items(vectors, np.arange(n))
    index.save_index(str(path))
    return path.read_bytes()


@dataclass(frozen=True)
class Layout:
    """A valid graph's bytes and where its parts are (found independently of check_graph)."""

    data: bytes
    count: int
    dimension: int
    max_m: int
    record: int
    label_offset: int
    levels: list[int]
    sizes_at: list[int]  # the offset of each element's linkListSize

    @staticmethod
    def of(data: bytes, dimension: int) -> Layout:
        header = _HEADER.unpack_from(data)
        count, record, label_offset, max_m = header[2], header[3], header[4], header[8]
        levels, sizes_at = [], []
        offset = _HEADER.size + count * record
        for _ in range(count):
            (size,) = struct.unpack_from("<I", data, offset)
            sizes_at.append(offset)
            levels.append(size // (4 * max_m + 4))
            offset += 4 + size
        assert offset == len(data)
        return Layout(data, count, dimension, max_m, record, label_offset, levels, sizes_at)

    def level0(self, element: int) -> int:
        """The offset of an element's level-0 record."""
        return _HEADER.size + element * self.record

    def upper(self, element: int, level: int) -> int:
        """The offset of an element's list at ``level`` >= 1."""
        return self.sizes_at[element] + 4 + (level - 1) * (4 * self.max_m + 4)

    def label(self, element: int) -> int:
        return int.from_bytes(self.data[self.level0(element) + self.label_offset :][:8], "little")

    def with_header(self, field: int, value: float) -> bytes:
        header = list(_HEADER.unpack_from(self.data))
        header[field] = value
        return _HEADER.pack(*header) + self.data[_HEADER.size :]

    def with_u32(self, offset: int, value: int) -> bytes:
        data = bytearray(self.data)
        struct.pack_into("<I", data, offset, value)
        return bytes(data)

    def with_u64(self, offset: int, value: int) -> bytes:
        data = bytearray(self.data)
        struct.pack_into("<Q", data, offset, value)
        return bytes(data)

    def linked_upper(self) -> tuple[int, int]:
        """An element with a level-1 list holding a link, and a level-0 element it does not
        link to (the target of forged upper-level links)."""
        for element, level in enumerate(self.levels):
            if level and struct.unpack_from("<H", self.data, self.upper(element, 1))[0]:
                low = next(e for e, lv in enumerate(self.levels) if lv == 0 and e != element)
                return element, low
        raise AssertionError("no element with an upper-level link")


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """A 300-element graph with upper levels (M=8 puts about one element in 8 above level 0)."""
    data = build(tmp_path_factory.mktemp("graph") / "g.hnsw", 300, 8, 8, "cosine")
    layout = Layout.of(data, 8)
    assert _HEADER.unpack_from(data)[MAXLEVEL] >= 1
    return layout


# -- graphs hnswlib writes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "dim", "m", "space"),
    [
        (1, 4, 8, "cosine"),
        (1, 3, 16, "l2"),
        (2, 3, 16, "l2"),
        (2, 5, 8, "cosine"),
        (50, 16, 8, "cosine"),
        (50, 7, 16, "ip"),
        (3000, 24, 8, "cosine"),
        (3000, 32, 16, "l2"),
    ],
)
def test_hnswlib_graphs_pass(tmp_path: Path, n: int, dim: int, m: int, space: str) -> None:
    """Every graph hnswlib saves for ``init_index(max_elements=n)`` is accepted, as bytes or
    as a memoryview."""
    data = build(tmp_path / "g.hnsw", n, dim, m, space)
    check_graph(data, count=n, dimension=dim)
    check_graph(memoryview(data), count=n, dimension=dim)


# -- forged graphs -----------------------------------------------------------------------

Forgery = Callable[[Layout], tuple[bytes, int, int, str]]


def _truncated(g: Layout) -> tuple[bytes, int, int, str]:
    return g.data[:-1], g.count, g.dimension, r"^truncated: ends"


def _trailing(g: Layout) -> tuple[bytes, int, int, str]:
    return g.data + b"\0", g.count, g.dimension, r"^1 trailing bytes after the last element"


def _short(g: Layout) -> tuple[bytes, int, int, str]:
    return g.data[:95], g.count, g.dimension, r"^only 95 bytes, shorter than hnswlib's 96-byte"


def _max_elements(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_header(MAX_ELEMENTS, g.count + 1)
    return data, g.count, g.dimension, r"^max_elements is 301, not its 300 elements"


def _count(g: Layout) -> tuple[bytes, int, int, str]:
    return g.data, g.count + 1, g.dimension, r"^holds 300 elements, not the 301 expected"


def _dimension(g: Layout) -> tuple[bytes, int, int, str]:
    return g.data, g.count, g.dimension + 1, r"^label_offset is \d+, not \d+ .*dimension 9"


def _max_m0(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_header(MAX_M0, 17)
    return data, g.count, g.dimension, r"^maxM0 is 17, not 2\*M = 16"


def _level0_id(g: Layout) -> tuple[bytes, int, int, str]:
    element = next(e for e in range(g.count) if g.data[g.level0(e)])  # one with links
    data = g.with_u32(g.level0(element) + 4, g.count)
    return data, g.count, g.dimension, rf"^element {element} links to 300 at level 0, past its 300"


def _level0_count(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_u32(g.level0(5), 17)
    return data, g.count, g.dimension, r"^element 5 lists 17 links at level 0, more than maxM0 = 16"


def _deleted(g: Layout) -> tuple[bytes, int, int, str]:
    data = bytearray(g.data)
    data[g.level0(7) + 2] |= 1
    return bytes(data), g.count, g.dimension, r"^element 7 is marked deleted$"


def _duplicate_label(g: Layout) -> tuple[bytes, int, int, str]:
    label = g.label(4)
    data = g.with_u64(g.level0(3) + g.label_offset, label)
    first, second = sorted([3, 4])
    return data, g.count, g.dimension, rf"^label {label} is on elements {first} and {second}$"


def _label_range(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_u64(g.level0(9) + g.label_offset, g.count)
    return data, g.count, g.dimension, r"^element 9 has label 300, past its 300 elements"


def _list_size(g: Layout) -> tuple[bytes, int, int, str]:
    element = g.levels.index(0)
    data = g.with_u32(g.sizes_at[element], 4)
    expect = rf"^element {element} has 4 bytes of upper-level links, not a multiple of 36"
    return data, g.count, g.dimension, expect


def _upper_to_lower(g: Layout) -> tuple[bytes, int, int, str]:
    element, low = g.linked_upper()
    data = g.with_u32(g.upper(element, 1) + 4, low)
    expect = rf"^element {element} links to {low} at level 1, which has only level 0$"
    return data, g.count, g.dimension, expect


def _upper_id(g: Layout) -> tuple[bytes, int, int, str]:
    element, _ = g.linked_upper()
    data = g.with_u32(g.upper(element, 1) + 4, g.count)
    expect = rf"^element {element} links to 300 at level 1, past its 300 elements"
    return data, g.count, g.dimension, expect


def _upper_count(g: Layout) -> tuple[bytes, int, int, str]:
    element, _ = g.linked_upper()
    data = g.with_u32(g.upper(element, 1), 9)
    expect = rf"^element {element} lists 9 links at level 1, more than maxM = 8"
    return data, g.count, g.dimension, expect


def _enterpoint_range(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_header(ENTERPOINT, g.count)
    return data, g.count, g.dimension, r"^enterpoint is 300, past its 300 elements"


def _enterpoint_level(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_header(ENTERPOINT, g.levels.index(0))
    return data, g.count, g.dimension, r"^maxlevel is \d+ but the enterpoint \d+ has level 0$"


def _maxlevel_low(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_header(MAXLEVEL, max(g.levels) - 1)
    return data, g.count, g.dimension, r"^element \d+ has level \d+, above maxlevel \d+$"


def _maxlevel_negative(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_header(MAXLEVEL, -1)
    return data, g.count, g.dimension, r"^maxlevel is -1, not between 0 and 100"


def _mult_nan(g: Layout) -> tuple[bytes, int, int, str]:
    data = g.with_header(MULT, float("nan"))
    return data, g.count, g.dimension, r"^mult is nan, not a finite number"


FORGERIES: list[Forgery] = [
    _truncated,
    _trailing,
    _short,
    _max_elements,
    _count,
    _dimension,
    _max_m0,
    _level0_id,
    _level0_count,
    _deleted,
    _duplicate_label,
    _label_range,
    _list_size,
    _upper_to_lower,
    _upper_id,
    _upper_count,
    _enterpoint_range,
    _enterpoint_level,
    _maxlevel_low,
    _maxlevel_negative,
    _mult_nan,
]


@pytest.mark.parametrize("forge", FORGERIES, ids=[f.__name__.strip("_") for f in FORGERIES])
def test_forged_graphs_are_refused(graph: Layout, forge: Forgery) -> None:
    """Each way a graph can make hnswlib read out of bounds (or not be ours) is refused, with a
    message naming the fault."""
    data, count, dimension, expect = forge(graph)
    with pytest.raises(ValueError, match=expect):
        check_graph(data, count=count, dimension=dimension)


# -- fuzzing -----------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import hnswlib
    import numpy as np

    queries = np.random.default_rng(7).normal(size=(6, 16)).astype(np.float32)
    for path in sorted(Path(sys.argv[1]).iterdir()):
        index = hnswlib.Index(space="cosine", dim=16)
        index.load_index(str(path))
        index.set_ef(50)
        for query in queries:
            try:
                index.knn_query(query, k=10)
            except RuntimeError:  # fewer than k reachable: hnswlib's own error, not a fault
                pass
    print("searched", len(list(Path(sys.argv[1]).iterdir())))
    """
)


def _mutant(g: Layout, rng: random.Random) -> bytes:
    """The graph with one to three random changes, mostly where its structure is."""
    data = bytearray(g.data)
    tail = _HEADER.size + g.count * g.record

    def offset() -> int:
        where = rng.random()
        if where < 0.3:
            return rng.randrange(len(data))
        if where < 0.45:
            return rng.randrange(_HEADER.size)
        if where < 0.7:  # a level-0 link header or id
            return g.level0(rng.randrange(g.count)) + rng.randrange(4 * 2 * g.max_m + 4)
        if where < 0.8:  # a label
            return g.level0(rng.randrange(g.count)) + g.label_offset + rng.randrange(8)
        return tail + rng.randrange(len(data) - tail)  # the upper-level lists

    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.4:
            at = offset()
            if at < len(data):
                data[at] ^= 1 << rng.randrange(8)
        elif kind < 0.9:
            at = offset() & ~3
            value = rng.choice(
                [0, 1, g.count - 1, g.count, g.count + 1, 0xFFFF, 0xFFFFFFFF, rng.getrandbits(32)]
            )
            if at + 4 <= len(data):
                struct.pack_into("<I", data, at, value)
        else:  # a truncation ends the changes: the offsets above are of the whole graph
            del data[rng.randrange(len(data)) :]
            break
    return bytes(data)


def test_fuzzed_graphs_never_crash_hnswlib(tmp_path: Path) -> None:
    """Randomly damaged graphs are refused or are safe: every accepted one loads in hnswlib and
    is searched in a child process, which must not crash."""
    g = Layout.of(build(tmp_path / "g.hnsw", 400, 16, 8, "cosine"), 16)
    accepted_dir = tmp_path / "accepted"
    accepted_dir.mkdir()
    rng = random.Random(20240611)
    refused = accepted = 0
    for n in range(400):
        data = _mutant(g, rng)
        try:
            check_graph(data, count=g.count, dimension=g.dimension)
        except ValueError:
            refused += 1
            continue
        accepted += 1
        (accepted_dir / f"{n:04d}.hnsw").write_bytes(data)
    (accepted_dir / "original.hnsw").write_bytes(g.data)
    print(f"refused {refused}, accepted {accepted} of 400 mutants")
    assert refused >= 200 and accepted >= 20
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(accepted_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert child.stdout.split() == ["searched", str(accepted + 1)]
