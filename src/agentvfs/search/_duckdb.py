"""What the BM25 index and the vector store share of DuckDB: opening a database file,
naming why one cannot be used, listing its tables, and transactions.

Both keep their data in one DuckDB file each and must never change a file that is not
theirs; both report a file held by another process, a file that is no DuckDB database and a
corrupt file in words a user can act on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import duckdb
import numpy as np

__all__ = ["FileTrouble", "connect", "no_pandas_lookups", "registered", "table_names", "transaction", "trouble"]

#: Why a DuckDB file cannot be used.
FileTrouble = Literal["locked", "not_duckdb", "corrupt", "other"]

_WHY: dict[FileTrouble, str] = {
    "locked": "is held by another process (DuckDB allows one writer, or many read-only readers)",
    "not_duckdb": "is not a DuckDB database",
    "corrupt": "is corrupt",
    "other": "cannot be read",
}


def trouble(exc: duckdb.Error) -> tuple[FileTrouble, str]:
    """Classify a DuckDB error about a file, and say it in a few words (``is corrupt``)."""
    message = str(exc)
    kind: FileTrouble
    if re.search(r"\block\b", message, re.IGNORECASE):
        kind = "locked"  # "Could not set lock", "Conflicting lock" (a word: "block" is not one)
    elif "not a valid DuckDB database" in message:
        kind = "not_duckdb"
    elif "orrupt" in message or "checksum" in message:
        kind = "corrupt"
    else:
        kind = "other"
    return kind, _WHY[kind]


def connect(path: str, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB database (``":memory:"`` for none); DuckDB's errors propagate, for the
    caller to report with :func:`trouble` in its own terms."""
    return duckdb.connect(path, read_only=read_only)


def table_names(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The tables of the database's main schema."""
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() "
        "WHERE database_name = current_database() AND schema_name = 'main'"
    ).fetchall()
    return {row[0] for row in rows}


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """BEGIN, then COMMIT, or ROLLBACK on any error (a failed COMMIT included)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # DuckDB may have rolled back already
            con.execute("ROLLBACK")
        raise
    try:
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def registered(
    con: duckdb.DuckDBPyConnection, name: str, columns: Mapping[str, Any]
) -> Iterator[None]:
    """``columns`` (NumPy arrays of equal length) as the view ``name`` for the block.

    A column of Python objects must hold values of one type, and not only None: its type is
    taken from its first value. By default DuckDB looks at a thousand values of such a column
    (each conversion also trying to import pandas), which took longer than inserting them;
    the connection's setting is put back afterwards.
    """
    rows = min((len(column) for column in columns.values()), default=0)
    objects = any(getattr(column, "dtype", None) == np.dtype(object) for column in columns.values())
    previous: int | None = None
    if objects and rows > _SAMPLE_WORTH_SETTING:  # (three statements: only worth it for many)
        row = con.execute("SELECT current_setting('pandas_analyze_sample')").fetchone()
        previous = int(row[0]) if row is not None else None
        con.execute("SET pandas_analyze_sample = 1")
    try:
        con.register(name, columns)
        try:
            yield
        finally:
            con.unregister(name)
    finally:
        if previous is not None:
            con.execute(f"SET pandas_analyze_sample = {previous}")


#: Rows of Python objects below which DuckDB's look at them costs less than changing the
#: setting for one registration.
_SAMPLE_WORTH_SETTING = 64


_PANDAS_MISSING = importlib.util.find_spec("pandas") is None


@contextlib.contextmanager
def no_pandas_lookups() -> Iterator[None]:
    """Make DuckDB's per-value ``import pandas`` fail fast while it converts Python objects.

    DuckDB tries to import pandas for every Python object it converts (list parameters, object
    columns); when pandas is not installed each failed import searches ``sys.path`` (about
    0.1 ms, i.e. seconds per batch). A ``None`` in ``sys.modules`` makes the import fail at
    once; pandas is absent anyway, so no import can be affected but these failing ones.
    """
    if not _PANDAS_MISSING or "pandas" in sys.modules:
        yield
        return
    sys.modules["pandas"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("pandas", 0) is None:
            del sys.modules["pandas"]
