"""``matches``/``compile_filter``: metadata filters evaluated in Python, checked case by case and
against ``HnswVectorStore`` (DuckDB) on random items and filters."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from agentvfs.search._vector_filters import compile_filter, matches, parse_filter
from agentvfs.search._vectors import HnswVectorStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    # The store runs its work in threads, so one event loop is enough here.
    return "asyncio"


LONG = "L" * 300
LONG_OTHER = "L" * 299 + "M"  # same length and prefix: only the whole string tells them apart

# (filter, metadata, expected): each holds for matches() and for the store.
CASES: list[tuple[dict[str, Any], dict[str, Any], bool]] = [
    # numbers compare as numbers; True is not 1 and "1" is not 1
    ({"n": 1}, {"n": 1}, True),
    ({"n": 1}, {"n": 1.0}, True),
    ({"n": 1.0}, {"n": 1}, True),
    ({"n": 1}, {"n": True}, False),
    ({"n": True}, {"n": 1}, False),
    ({"n": True}, {"n": True}, True),
    ({"n": False}, {"n": 0}, False),
    ({"n": 1}, {"n": "1"}, False),
    ({"n": 0.0}, {"n": -0.0}, True),
    ({"n": 2**53}, {"n": 2**53 + 1}, True),  # both are the same double
    # None is JSON null, not a missing key
    ({"n": None}, {"n": None}, True),
    ({"n": None}, {}, False),
    ({"n": {"$ne": None}}, {}, True),
    ({"n": {"$exists": True}}, {"n": None}, True),
    ({"n": {"$exists": False}}, {"n": None}, False),
    ({"n": {"$exists": False}}, {"m": 1}, True),
    ({"n": {"$exists": True}}, {"n": []}, True),
    # a scalar matches a list containing it, with the same equality
    ({"tags": "x"}, {"tags": ["x", "y"]}, True),
    ({"tags": 1}, {"tags": [2, 1.0]}, True),
    ({"tags": 1}, {"tags": [True]}, False),
    ({"tags": None}, {"tags": [None]}, True),
    ({"tags": None}, {"tags": []}, False),
    ({"tags": {"$in": ["z", 2]}}, {"tags": ["x", 2.0]}, True),
    ({"tags": {"$nin": ["z", 2]}}, {"tags": ["x", 2.0]}, False),
    ({"tags": {"$ne": "x"}}, {"tags": ["x", "y"]}, False),
    # lists compare as whole values, in order; an element list matches only that whole list
    ({"tags": ["x", "y"]}, {"tags": ["x", "y"]}, True),
    ({"tags": ["x", "y"]}, {"tags": ["y", "x"]}, False),
    ({"tags": ["x"]}, {"tags": "x"}, False),
    ({"tags": [1, True]}, {"tags": [1.0, True]}, True),
    ({"tags": [1, 1]}, {"tags": [1.0, True]}, False),
    ({"tags": []}, {"tags": []}, True),
    ({"tags": []}, {"tags": [[]]}, True),
    ({"tags": [1, 2]}, {"tags": [[1, 2], 3]}, True),
    ({"tags": [[1, 2], 3]}, {"tags": [[1.0, 2], 3]}, True),
    ({"tags": 1}, {"tags": [[1, 2], 3]}, False),
    ({"tags": {"$in": [[2, 1], [1, 2]]}}, {"tags": [[1, 2]]}, True),
    ({"tags": [2.0**53]}, {"tags": [2**53]}, False),  # normalised only below 2**53
    # objects compare as whole values: key order and 1.0 vs 1 do not matter, True vs 1 does
    ({"o": {"a": 1, "b": [1, 2]}}, {"o": {"b": [1.0, 2], "a": 1.0}}, True),
    ({"o": {"a": 1}}, {"o": {"a": True}}, False),
    ({"o": {"a": 1}}, {"o": {"a": 1, "b": None}}, False),
    ({"o": {}}, {"o": {}}, True),
    ({"o": {"a": 1}}, {"o": [{"a": 1.0}]}, True),
    ({"o": 1}, {"o": {"a": 1}}, False),  # objects are not expanded
    ({"o": {"$eq": {"s": LONG}}}, {"o": {"s": LONG}}, True),
    # long strings are compared whole (by digest in the store)
    ({"t": LONG}, {"t": LONG}, True),
    ({"t": LONG}, {"t": LONG_OTHER}, False),
    ({"t": LONG}, {"t": [LONG_OTHER, LONG]}, True),
    ({"t": {"$nin": [LONG_OTHER]}}, {"t": LONG}, True),
    # $ne and $nin also match items without the key; $in [] nothing, $nin [] everything
    ({"k": {"$ne": "a"}}, {}, True),
    ({"k": {"$ne": "a"}}, {"k": "a"}, False),
    ({"k": {"$nin": ["a", "b"]}}, {"other": "a"}, True),
    ({"k": {"$nin": ["a", "b"]}}, {"k": "b"}, False),
    ({"k": {"$in": []}}, {"k": "a"}, False),
    ({"k": {"$nin": []}}, {}, True),
    ({"k": {"$ne": "a", "$exists": True}}, {}, False),
    # several keys, $and, $or, nesting
    ({"k": "a", "n": 1}, {"k": "a", "n": 1.0}, True),
    ({"k": "a", "n": 1}, {"k": "a"}, False),
    (
        {"$and": [{"k": "a"}, {"$or": [{"n": 2}, {"m": {"$exists": False}}]}]},
        {"k": "a", "n": 1},
        True,
    ),
    (
        {"$and": [{"k": "a"}, {"$or": [{"n": 2}, {"m": {"$exists": False}}]}]},
        {"k": "a", "m": 0},
        False,
    ),
    (
        {"$or": [{"$and": [{"k": "a"}, {"n": 1}]}, {"$and": [{"k": "b"}, {"n": {"$ne": 1}}]}]},
        {"k": "b"},
        True,
    ),
    ({"$or": [{"k": "z"}], "n": {"$in": [1, 2]}}, {"k": "z", "n": 2.0}, True),
    ({"$and": [{}, {"k": {"$exists": False}}]}, {}, True),
    ({}, {}, True),
]


@pytest.mark.parametrize(("flt", "meta", "expected"), CASES)
def test_matches_cases(flt: dict[str, Any], meta: dict[str, Any], expected: bool) -> None:
    """Each operator and the tricky equalities give the expected answer."""
    node = parse_filter(flt)
    assert matches(node, meta) is expected
    assert compile_filter(node)(meta) is expected


async def test_cases_agree_with_the_store() -> None:
    """The store gives the expected answer of every case too (one item per case)."""
    store = HnswVectorStore()
    await store.create_index("cases", 2)
    ids = [f"c{i}" for i in range(len(CASES))]
    await store.upsert("cases", [[1.0, 0.5]] * len(CASES), [meta for _, meta, _ in CASES], ids)
    for id, (flt, _, expected) in zip(ids, CASES, strict=True):
        hits = await store.query("cases", [1.0, 0.0], top_k=len(CASES), filter=flt)
        assert (id in {h["id"] for h in hits}) is expected, (flt, CASES[ids.index(id)][1])


def test_compiled_filter_is_reusable() -> None:
    """One compiled filter answers for many items, and each item independently."""
    check = compile_filter(parse_filter({"tags": {"$in": ["x", [1, 2]]}, "n": {"$ne": 0}}))
    items: list[dict[str, Any]] = [
        {"tags": ["x"]},
        {"tags": [[1, 2]], "n": 0},
        {"tags": [1, 2]},
        {"tags": "y"},
        {},
    ]
    assert [check(meta) for meta in items] == [True, False, True, False, False]
    assert [check(meta) for meta in items] == [True, False, True, False, False]


def test_values_the_store_rejects_equal_nothing() -> None:
    """Non-JSON metadata (read from elsewhere) equals no filter value, but its key exists."""
    for value in (float("nan"), float("inf"), {1, 2}, 10**400, [float("nan")], b"x"):
        meta = {"v": value}
        assert not matches(parse_filter({"v": 1}), meta)
        assert not matches(parse_filter({"v": {"$in": [[1], "x", None, True]}}), meta)
        assert matches(parse_filter({"v": {"$ne": 1}}), meta)
        assert matches(parse_filter({"v": {"$exists": True}}), meta)


def test_bad_trees_and_values_are_rejected() -> None:
    """A tree that parse_filter cannot produce, or a non-JSON filter value, raises ValueError."""
    with pytest.raises(ValueError, match="Not a filter tree"):
        compile_filter(("nope", "k"))
    with pytest.raises(ValueError, match="not a JSON number"):
        compile_filter(("match", "k", (float("nan"),)))


# -- differential test against the store -----------------------------------------------------

KEYS = ["a", "b", "c", "d"]
SCALARS: list[Any] = [
    0, 1, 2, -1, 2**53, 2**53 + 1,
    1.0, 2.0, 0.5, -0.0, 2.0**53,
    True, False, None,
    "", "x", "y", "1", "true",
    LONG, LONG_OTHER,
]  # fmt: skip


def random_value(rng: random.Random, depth: int = 0, seen: list[Any] | None = None) -> Any:
    """A metadata or filter value: mostly scalars, some lists (nested too) and small objects.

    With ``seen`` (values of the items), half of the values are taken from there, so that filters
    on whole lists and objects find their equals too.
    """
    if seen and rng.random() < 0.5:
        return rng.choice(seen)
    roll = rng.random()
    if roll < 0.6 or depth >= 2:
        return rng.choice(SCALARS)
    if roll < 0.85:
        # Short lists from few values, so that whole lists repeat and compare equal.
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    keys = rng.sample(["p", "q"], rng.randint(0, 2))
    return {key: random_value(rng, depth + 1) for key in keys}


def random_meta(rng: random.Random) -> dict[str, Any]:
    """Metadata with a random subset of the keys."""
    return {key: random_value(rng) for key in KEYS if rng.random() < 0.6}


def random_condition(rng: random.Random, seen: list[Any]) -> Any:
    """The condition on one key: a plain value or one or two operators."""
    ops = rng.choice(
        [
            ["plain"],
            ["$eq"],
            ["$ne"],
            ["$in"],
            ["$nin"],
            ["$exists"],
            ["$ne", "$exists"],
            ["$in", "$nin"],
        ]
    )
    if ops == ["plain"]:
        # An object here is a plain value too: the pool's object keys do not start with "$".
        return random_value(rng, seen=seen)
    condition: dict[str, Any] = {}
    for op in ops:
        if op in ("$in", "$nin"):
            condition[op] = [random_value(rng, seen=seen) for _ in range(rng.randint(0, 3))]
        elif op == "$exists":
            condition[op] = rng.random() < 0.5
        else:
            condition[op] = random_value(rng, seen=seen)
    return condition


def random_filter(rng: random.Random, seen: list[Any], depth: int = 3) -> dict[str, Any]:
    """A filter nested up to ``depth`` levels of $and/$or, with one or more keys per level."""
    flt: dict[str, Any] = {}
    for key in rng.sample(KEYS, rng.choice([0, 1, 1, 1, 2])):
        flt[key] = random_condition(rng, seen)
    if depth > 0 and (not flt or rng.random() < 0.5):
        op = rng.choice(["$and", "$or"])
        flt[op] = [random_filter(rng, seen, depth - 1) for _ in range(rng.randint(1, 2))]
    return flt


async def test_matches_agrees_with_the_store_on_random_items() -> None:
    """For random items and filters, matches() allows exactly the items the store returns."""
    rng = random.Random(20240611)
    n_items, n_filters = 300, 150
    metas = [random_meta(rng) for _ in range(n_items)]
    seen = [value for meta in metas for value in meta.values()]
    seen += [element for value in seen if isinstance(value, list) for element in value]
    ids = [f"i{i}" for i in range(n_items)]
    vectors = np.random.default_rng(7).normal(size=(n_items, 4)).tolist()
    store = HnswVectorStore()
    await store.create_index("items", 4)
    await store.upsert("items", vectors, metas, ids)
    query = [0.1, 0.2, 0.3, 0.4]
    some = everything = 0
    for _ in range(n_filters):
        flt = random_filter(rng, seen)
        check = compile_filter(parse_filter(flt))
        expected = {id for id, meta in zip(ids, metas, strict=True) if check(meta)}
        hits = await store.query("items", query, top_k=n_items, filter=flt)
        assert {h["id"] for h in hits} == expected, flt
        assert {
            id for id, meta in zip(ids, metas, strict=True) if matches(parse_filter(flt), meta)
        } == expected
        some += 0 < len(expected) < n_items
        everything += len(expected) == n_items
    # Not vacuous: most filters select some items but not all.
    assert some >= n_filters // 2, (some, everything)
