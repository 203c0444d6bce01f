"""The reusable conformance suite and test servers for workspace filesystems.

Third-party backends run the same suite: subclass :class:`FilesystemTests` and provide a
``harness`` fixture returning a :class:`Harness` (the filesystem plus a direct oracle).
Installing agentvfs registers this package's pytest plugin (the ``anyio`` marker backend).
"""

from ._harness import Harness as Harness
from ._harness import composite_harness as composite_harness
from ._harness import fsspec_harness as fsspec_harness
from ._harness import local_harness as local_harness
from ._harness import mounted_harness as mounted_harness
from ._servers import FakeGcsServer as FakeGcsServer
from ._servers import MotoServer as MotoServer
from ._servers import free_port as free_port
from ._suite import FilesystemTests as FilesystemTests

__all__ = [
    "FakeGcsServer",
    "FilesystemTests",
    "Harness",
    "MotoServer",
    "composite_harness",
    "free_port",
    "fsspec_harness",
    "local_harness",
    "mounted_harness",
]
