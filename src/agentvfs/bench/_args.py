"""The arguments of ``agentvfs bench``, kept apart from the run so that every ``agentvfs``
command (``agentvfs mount`` starts often, as a child of mounts) parses without importing the
benchmark's servers and layers."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ._context import SIZES

__all__ = ["BACKENDS", "MOUNT_SUITES", "SUITES", "add_arguments"]

BACKENDS = ("memory", "local", "s3", "gcs")

#: Suite name -> module with ``run(ctx)``, in the order a run takes them.
SUITES = {
    "io": "._suite_io",
    "metadata": "._suite_metadata",
    "agent": "._suite_agent",
    "search": "._suite_search",
    "sandbox": "._suite_sandbox",
}
#: Suites that exercise mounts: they get the mount layers (the others use the backend only).
MOUNT_SUITES = ("io", "metadata", "agent")


def _suite_name(text: str) -> str:
    if text not in SUITES:
        raise argparse.ArgumentTypeError(f"unknown suite {text!r}; choose from {', '.join(SUITES)}")
    return text


def _backend_name(text: str) -> str:
    if text not in BACKENDS:
        raise argparse.ArgumentTypeError(f"unknown backend {text!r}; choose from {', '.join(BACKENDS)}")
    return text


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number not below ``low``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {n}")
        return n

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``agentvfs bench``."""
    p.add_argument("suites", nargs="*", type=_suite_name, metavar="SUITE",
                   help=f"suites to run: {', '.join(SUITES)} (default: all)")
    p.add_argument("--backend", dest="backends", action="append", type=_backend_name, metavar="NAME",
                   help="memory, local, s3 or gcs; repeat for several (default: memory and local). s3 starts "
                        "s3rver and gcs fake-gcs-server on 127.0.0.1 unless --endpoint is given")
    p.add_argument("--peers", action="store_true",
                   help="also run the peers: local disk, fsspec.fuse, rclone mount, s3fs-fuse (each skipped with "
                        "a message when not installed), and for search SQLite FTS5, DuckDB fts, bm25s and tantivy")
    p.add_argument("--size", choices=sorted(SIZES), default="small",
                   help="data sizes: tiny (seconds, for tests), small (default), full (1 GiB files, "
                        "up to 100,000 entries)")
    p.add_argument("--repeat", type=_at_least(1), default=3, help="rounds per case, median reported (default 3)")
    p.add_argument("--warmup", type=_at_least(0), default=1,
                   help="untimed runs before timing warm cases (default 1; never before cold ones)")
    p.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                   help="skip a larger size of a case on a layer whose estimate exceeds this (default 300)")
    p.add_argument("--fio", action="store_true", help="also run the fio job files on each directory layer")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="where results.json, report.md and the plots go (default: ./bench-results/<time>)")
    p.add_argument("--json", action="store_true", help="print results.json to stdout when done")
    p.add_argument("--endpoint", metavar="URL",
                   help="an existing S3-compatible (with --backend s3) or GCS (with --backend gcs) server; "
                        "nothing is started and the run writes under a fresh prefix it removes")
    p.add_argument("--key", help="access key for --endpoint (default: AWS_ACCESS_KEY_ID)")
    p.add_argument("--secret", help="secret key for --endpoint (default: AWS_SECRET_ACCESS_KEY)")
    p.add_argument("--bucket", help="bucket to use at --endpoint (default agentvfs-bench)")
    p.add_argument("--s3-server", choices=["s3rver", "moto"], default="s3rver",
                   help="the S3 server started for --backend s3 (default s3rver; moto caps ranged reads)")
    p.add_argument("--workdir", type=Path, metavar="DIR",
                   help="scratch space for mount points, local backend data and servers (default: a new "
                        "temporary directory; removed at the end)")
    p.add_argument("--cranfield", type=Path, metavar="DIR",
                   help="the Cranfield collection for judged search quality (default: $CRANFIELD_DIR if set)")
    p.add_argument("--regenerate", type=Path, metavar="RUN_DIR",
                   help="run nothing: rewrite report.md and plots of RUN_DIR from its results.json, and with "
                        "--results-md the generated section of that file")
    p.add_argument("--results-md", type=Path, metavar="FILE", help="with --regenerate: a RESULTS.md to update")
    p.add_argument("--quiet", action="store_true", help="no progress output")
