"""FUSE mounts: any workspace filesystem as a real directory.

``mount(fs, "/mnt/x")`` (async) or ``Mount(fs, "/mnt/x")`` (a context manager) serve the
filesystem to the kernel with pyfuse3 on a thread of this process, so shell commands see a
bucket as ordinary files. The semantics are written down in ``docs/mount-semantics.md``.
"""

# First: the helper library must be loaded before pyfuse3 is imported.
from . import _helper  # noqa: F401  # isort: skip
from ..errors import MissingExtraError  # isort: skip

try:  # what a missing extra is told, instead of a bare "No module named 'pyfuse3'"
    import pyfuse3  # noqa: F401  # isort: skip
    import trio  # noqa: F401  # isort: skip
except ModuleNotFoundError as _missing:
    if _missing.name not in ("pyfuse3", "trio"):
        raise
    raise MissingExtraError("FUSE mounts (agentvfs.mounts)", "fuse", _missing.name) from None

from .._exports import fixup_module_metadata
from ._child import ProcessMount as ProcessMount
from ._child import recipe_for as recipe_for
from ._helper import libfuse_version as libfuse_version
from ._helper import passthrough_unavailable_reason as passthrough_unavailable_reason
from ._helper import unavailable_reason as helper_unavailable_reason
from ._options import MountOptions as MountOptions
from ._recovery import RecoveredFile as RecoveredFile
from ._recovery import default_state_dir as default_state_dir
from ._recovery import discard_recovered as discard_recovered
from ._recovery import list_recovered as list_recovered
from ._recovery import serving_process as serving_process
from ._server import Mount as Mount
from ._server import cleanup_stale_mount as cleanup_stale_mount
from ._server import fuse_available as fuse_available
from ._server import is_mounted as is_mounted
from ._server import mount as mount

__all__ = [
    "Mount",
    "MountOptions",
    "ProcessMount",
    "RecoveredFile",
    "cleanup_stale_mount",
    "default_state_dir",
    "discard_recovered",
    "fuse_available",
    "helper_unavailable_reason",
    "is_mounted",
    "libfuse_version",
    "list_recovered",
    "mount",
    "passthrough_unavailable_reason",
    "recipe_for",
    "serving_process",
]

fixup_module_metadata(__name__, globals())
