"""Metadata of the vector store: how it is stored for filtering, and the filter language.

Metadata values are kept as JSON per vector and, for filtering, as typed rows (one per key
and scalar value, lists expanded) in DuckDB. Filters (``$eq $ne $in $exists $and $or`` on
metadata keys) parse into a small tree that the store evaluates against those rows, and that
``compile_filter``/``matches`` evaluate in Python, with the same semantics, for metadata that is
not in a store.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "FilterNode",
    "attr_rows",
    "compile_filter",
    "filter_keys",
    "matches",
    "metadata_json",
    "parse_filter",
    "values_sql",
]

_Labels = npt.NDArray[np.int64]

_OPERATORS: Final = "$eq, $ne, $in, $nin, $exists, $and, $or"

# Value tags of vector_attrs.t. Long strings and whole lists/objects are kept as SHA-256 digests,
# so a 4,000-character chunk text costs 64 characters there and equality stays exact.
_NULL, _BOOL, _NUM, _STR, _STR_DIGEST, _JSON_DIGEST = range(6)
_SHORT_STRING = 256


# -- metadata ------------------------------------------------------------------------------


def metadata_json(index: str, id: str, meta: Mapping[str, Any]) -> str:
    if not isinstance(meta, Mapping):
        raise ValueError(
            f"Vector index {index!r}: the metadata of id {id!r} must be a mapping, got {type(meta).__name__}"
        )
    for key in meta:
        if not isinstance(key, str):
            raise ValueError(
                f"Vector index {index!r}: the metadata of id {id!r} has a non-string key {key!r}"
            )
    try:
        return json.dumps(dict(meta), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"Vector index {index!r}: the metadata of id {id!r} is not JSON-compatible ({exc})"
        ) from exc


def _normalize(value: Any) -> Any:
    """JSON value with integral floats as ints, so that ``[1.0] == [1]`` as in JSON."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list | tuple):
        return [_normalize(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _normalize(v) for k, v in value.items()}
    return value


def _encode(value: Any) -> tuple[int, str | None, float | None]:
    """A metadata or filter value as (tag, s, n) of vector_attrs."""
    if value is None:
        return _NULL, None, None
    if isinstance(value, bool):
        return _BOOL, None, 1.0 if value else 0.0
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"number {value!r} is too large") from None
        if not math.isfinite(number):
            raise ValueError(f"{value!r} is not a JSON number")
        return _NUM, None, number
    if isinstance(value, str):
        if len(value) <= _SHORT_STRING:
            return _STR, value, None
        return _STR_DIGEST, hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest(), None
    if isinstance(value, list | tuple | Mapping):
        text = _json_text(value)
        return _JSON_DIGEST, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), None
    raise ValueError(f"{value!r} ({type(value).__name__}) is not a JSON value")


def _json_text(value: Any) -> str:
    """The canonical JSON text of a list or object, whose digest ``_encode`` stores.

    Shared by ``_encode`` and ``compile_filter`` so that both see the same whole-value equality
    (sorted keys, integral floats as ints, no spaces).
    """
    try:
        return json.dumps(
            _normalize(value),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{value!r} is not JSON-compatible ({exc})") from exc


def attr_rows(labels: _Labels, metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """vector_attrs rows: one per top-level key, plus one per element of a list value."""
    label: list[int] = []
    key: list[str] = []
    tag: list[int] = []
    text: list[str | None] = []
    number: list[float] = []
    elem: list[bool] = []

    def row(item: int, name: str, value: Any, element: bool) -> None:
        t, s, n = _encode(value)
        label.append(item)
        key.append(name)
        tag.append(t)
        text.append(s)
        number.append(math.nan if n is None else n)
        elem.append(element)

    for item, meta in zip(labels.tolist(), metas, strict=True):
        for name, value in meta.items():
            row(item, name, value, False)
            if isinstance(value, list | tuple):
                for element in value:
                    row(item, name, element, True)
    return {
        "label": np.array(label, np.int64),
        "key": key,
        "t": np.array(tag, np.uint8),
        "s": np.array(text, dtype=object),
        "n": np.array(number, np.float64),
        "elem": np.array(elem, np.bool_),
    }


# -- filter parsing ------------------------------------------------------------------------

# ("all",) | ("and", [nodes]) | ("or", [nodes]) | ("not", node) | ("exists", key)
# | ("match", key, values): the key equals one of the values (or, for a list, contains it).
FilterNode = tuple[Any, ...]


def parse_filter(filter: object) -> FilterNode:
    if not isinstance(filter, Mapping):
        raise ValueError(f"A filter must be a mapping, got {type(filter).__name__}")
    parts: list[FilterNode] = []
    for key, condition in filter.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"Filter keys must be non-empty strings, got {key!r}")
        if key.startswith("$"):
            if key not in ("$and", "$or"):
                raise ValueError(f"Unsupported filter operator {key!r} (supported: {_OPERATORS})")
            if (
                isinstance(condition, str | bytes | Mapping)
                or not isinstance(condition, Sequence)
                or not condition
            ):
                raise ValueError(
                    f"Filter operator {key} needs a non-empty list of filters, got {condition!r}"
                )
            children = [parse_filter(child) for child in condition]
            parts.append(("and" if key == "$and" else "or", children))
        else:
            parts.append(_parse_field(key, condition))
    if not parts:
        return ("all",)
    return parts[0] if len(parts) == 1 else ("and", parts)


def _parse_field(key: str, condition: Any) -> FilterNode:
    operators = isinstance(condition, Mapping) and [
        k for k in condition if isinstance(k, str) and k.startswith("$")
    ]
    if not operators:
        return ("match", key, (_checked(key, condition),))
    assert isinstance(condition, Mapping)
    if len(operators) != len(condition):
        raise ValueError(f"Filter on {key!r} mixes operators and plain keys: {dict(condition)!r}")
    parts: list[FilterNode] = []
    for op, value in condition.items():
        if op in ("$eq", "$ne"):
            match = ("match", key, (_checked(key, value),))
            parts.append(match if op == "$eq" else ("not", match))
        elif op in ("$in", "$nin"):
            if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
                raise ValueError(f"Filter operator {op} on {key!r} needs a list, got {value!r}")
            match = ("match", key, tuple(_checked(key, v) for v in value))
            parts.append(match if op == "$in" else ("not", match))
        elif op == "$exists":
            if not isinstance(value, bool):
                raise ValueError(
                    f"Filter operator $exists on {key!r} needs true or false, got {value!r}"
                )
            parts.append(("exists", key) if value else ("not", ("exists", key)))
        else:
            raise ValueError(
                f"Unsupported filter operator {op!r} on {key!r} (supported: {_OPERATORS})"
            )
    return parts[0] if len(parts) == 1 else ("and", parts)


def _checked(key: str, value: Any) -> Any:
    try:
        _encode(value)
    except ValueError as exc:
        raise ValueError(f"Filter value for {key!r}: {exc}") from None
    return value


def values_sql(values: Sequence[Any]) -> tuple[str, list[Any]]:
    """SQL over vector_attrs (t, s, n) true when the row equals one of ``values``."""
    strings: dict[int, list[str]] = {}
    numbers: dict[int, list[float]] = {}
    null = False
    for value in values:
        t, s, n = _encode(value)
        if t == _NULL:
            null = True
        elif s is not None:
            strings.setdefault(t, []).append(s)
        elif n is not None:
            numbers.setdefault(t, []).append(n)
    clauses: list[str] = []
    params: list[Any] = []
    for t, group in sorted(strings.items()):
        clauses.append(f"(t = {t} AND s IN ({', '.join('?' * len(group))}))")
        params.extend(group)
    for t, nums in sorted(numbers.items()):
        clauses.append(f"(t = {t} AND n IN ({', '.join('?' * len(nums))}))")
        params.extend(nums)
    if null:
        clauses.append(f"t = {_NULL}")
    return " OR ".join(clauses), params


# -- filter evaluation in Python -----------------------------------------------------------

#: A compiled filter: whether one item's metadata passes it.
Matcher = Callable[[Mapping[str, Any]], bool]

_MISSING: Final = object()


def _always(meta: Mapping[str, Any]) -> bool:
    return True


def compile_filter(node: FilterNode) -> Matcher:
    """A function telling whether one item's metadata passes ``node``, as the store decides.

    The filter values are encoded once here, so applying the result to many items costs one
    set lookup per metadata value (or list element) looked at.

    Parameters
    ----------
    node : FilterNode
        A tree from ``parse_filter``.

    Returns
    -------
    Callable[[Mapping[str, Any]], bool]
        Takes one item's metadata (a mapping of top-level keys, as given to ``upsert``).

    Raises
    ------
    ValueError
        ``node`` is not a filter tree, or one of its values is not a JSON value.

    Notes
    -----
    The semantics are those of ``HnswVectorStore`` over ``attr_rows``: ``("match", key,
    values)`` holds when ``key`` is present and its value, or (for a list) one of its elements,
    equals one of ``values`` by ``_encode``: the same JSON type, numbers as doubles (``1 == 1.0``,
    ``True != 1``), strings exactly, lists and objects as whole normalised JSON values. Elements
    are not expanded further, so an element that is itself a list matches only that whole list.
    ``("exists", key)`` holds when ``key`` is a top-level key, whatever its value (``None`` too).
    The store rejects metadata that is not JSON; here such a value (NaN, a set, a number too
    large for a double) equals no filter value, but its key still exists.
    """
    kind = node[0] if isinstance(node, tuple) and node else None
    if kind == "all":
        return _always
    if kind in ("and", "or"):
        children = tuple(compile_filter(child) for child in node[1])
        if len(children) == 1:
            return children[0]
        if kind == "and":
            return lambda meta: all(child(meta) for child in children)
        return lambda meta: any(child(meta) for child in children)
    if kind == "not":
        inner = compile_filter(node[1])
        return lambda meta: not inner(meta)
    if kind == "exists":
        key = node[1]
        # The store looks for the key's own row (not an element row); every top-level key has
        # one, whatever its value.
        return lambda meta: key in meta
    if kind == "match":
        return _compile_match(node[1], node[2])
    raise ValueError(f"Not a filter tree: {node!r}")


def filter_keys(node: FilterNode) -> set[str]:
    """The metadata keys a filter looks at."""
    kind = node[0]
    if kind in ("and", "or"):
        return set().union(*(filter_keys(child) for child in node[1]))
    if kind == "not":
        return filter_keys(node[1])
    if kind in ("exists", "match"):
        return {node[1]}
    return set()


def matches(node: FilterNode, meta: Mapping[str, Any]) -> bool:
    """Whether ``meta`` (one item's metadata) passes ``node``, exactly as in the store.

    Parameters
    ----------
    node : FilterNode
        A tree from ``parse_filter``.
    meta : Mapping[str, Any]
        One item's metadata.

    Returns
    -------
    bool

    See Also
    --------
    compile_filter : The same, compiled once for many items, and the semantics.
    """
    return compile_filter(node)(meta)


def _compile_match(key: str, values: Sequence[Any]) -> Matcher:
    """The matcher of ``("match", key, values)``: the filter values grouped by their tag."""
    null = False
    bools: set[bool] = set()
    numbers: set[float] = set()
    strings: set[str] = set()
    jsons: set[str] = set()
    for value in values:
        tag, _, number = _encode(value)  # the store's tags, and its errors for bad values
        if tag == _NULL:
            null = True
        elif tag == _BOOL:
            bools.add(bool(value))
        elif tag == _NUM:
            assert number is not None
            numbers.add(number)
        elif tag in (_STR, _STR_DIGEST):
            # Equal strings have equal lengths, so the same tag, and the same SHA-256 digest
            # exactly when they are equal: plain comparison is the store's equality, unhashed.
            strings.add(value)
        else:
            # Likewise the canonical text stands for its digest.
            jsons.add(_json_text(value))

    def equal(value: Any) -> bool:
        """Whether one value (the key's own or an element) has the row of a filter value."""
        if value is None:
            return null
        if isinstance(value, bool):  # before int: True is an int in Python, not in JSON
            return value in bools
        if isinstance(value, int | float):
            if not numbers:
                return False
            try:
                # As _encode: the store compares doubles, so 2**53 + 1 == 2**53 there too.
                return float(value) in numbers
            except OverflowError:
                return False
        if isinstance(value, str):
            return value in strings
        if isinstance(value, list | tuple | Mapping):
            if not jsons:  # skip serialising values that no filter value could equal
                return False
            try:
                return _json_text(value) in jsons
            except ValueError:
                return False
        return False

    def match(meta: Mapping[str, Any]) -> bool:
        value = meta.get(key, _MISSING)
        if value is _MISSING:
            return False
        if equal(value):
            return True
        # attr_rows adds one row per element of a list (not of an object), one level deep.
        return isinstance(value, list | tuple) and any(equal(element) for element in value)

    return match
