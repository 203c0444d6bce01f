"""``agentvfs bench``: throughput of backends and mount layers, side by side in one run.

Suites ``io``, ``metadata``, ``agent``, ``search`` and ``sandbox`` run on each backend
(``memory``, ``local``, ``s3``, ``gcs``) through each layer (direct fsspec, the agentvfs
mount, and with ``--peers`` the local disk, ``fsspec.fuse``, ``rclone mount`` and
``s3fs``), and write ``results.json``, ``report.md`` and PNG plots.
"""

from .._exports import fixup_module_metadata
from ._args import add_arguments as add_arguments
from ._cli import main as main

__all__ = ["add_arguments", "main"]

fixup_module_metadata(__name__, globals())
