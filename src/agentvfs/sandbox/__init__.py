"""Sandboxes: where an agent's shell commands run, and the filesystems mounted into them."""

from ._mounts import MountEntry as MountEntry
from ._mounts import MountManager as MountManager
from ._mounts import MountState as MountState

__all__ = ["MountEntry", "MountManager", "MountState"]

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and _obj.__module__.startswith(__name__ + "._"):
        _obj.__module__ = __name__
del _name, _obj
