"""``agentvfs bench``: throughput of backends and mount layers, side by side in one run.

Suites ``io``, ``metadata``, ``agent``, ``search`` and ``sandbox`` run on each backend
(``memory``, ``local``, ``s3``, ``gcs``) through each layer (direct fsspec, the agentvfs
mount, and with ``--peers`` the local disk, ``fsspec.fuse``, ``rclone mount`` and
``s3fs``), and write ``results.json``, ``report.md`` and PNG plots.
"""

from __future__ import annotations

import argparse

from .._exports import fixup_module_metadata
from ._args import add_arguments as add_arguments

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``agentvfs bench`` with parsed ``args``: 0 when the run completed, 130 when
    interrupted, 2 for bad input.

    The suites and their test servers (``agentvfs[bench]``) are imported only here, so that
    every other command works without that extra.
    """
    from ._cli import main as run

    return run(args, parser)

fixup_module_metadata(__name__, globals())
