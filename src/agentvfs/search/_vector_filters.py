"""Metadata of the vector store: how it is stored for filtering, and the filter language.

Metadata values are kept as JSON per vector and, for filtering, as typed rows (one per key
and scalar value, lists expanded) in DuckDB. Filters (``$eq $ne $in $exists $and $or`` on
metadata keys) parse into a small tree that the store evaluates against those rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = ["FilterNode", "attr_rows", "metadata_json", "parse_filter", "values_sql"]

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
        try:
            text = json.dumps(
                _normalize(value),
                sort_keys=True,
                separators=(",", ":"),
                ensure_ascii=False,
                allow_nan=False,
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{value!r} is not JSON-compatible ({exc})") from exc
        return _JSON_DIGEST, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), None
    raise ValueError(f"{value!r} ({type(value).__name__}) is not a JSON value")


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
