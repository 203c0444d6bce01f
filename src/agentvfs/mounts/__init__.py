"""FUSE mounts: any workspace filesystem as a real directory.

``mount(fs, "/mnt/x")`` (async) or ``Mount(fs, "/mnt/x")`` (a context manager) serve the
filesystem to the kernel with pyfuse3 on a thread of this process, so shell commands see a
bucket as ordinary files. The semantics are written down in ``docs/mount-semantics.md``.
"""

# First: the passthrough library must be loaded before pyfuse3 is imported.
from . import _passthrough  # noqa: F401  # isort: skip
from .._exports import fixup_module_metadata
from ._options import MountOptions as MountOptions
from ._server import Mount as Mount
from ._server import cleanup_stale_mount as cleanup_stale_mount
from ._server import fuse_available as fuse_available
from ._server import is_mounted as is_mounted
from ._server import mount as mount

__all__ = ["Mount", "MountOptions", "cleanup_stale_mount", "fuse_available", "is_mounted", "mount"]

fixup_module_metadata(__name__, globals())
