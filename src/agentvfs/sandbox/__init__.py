"""Sandboxes: where an agent's shell commands run, and the filesystems mounted into them.

``LocalSandbox`` runs commands on this machine -- without isolation by default (which
isolates nothing), or inside bubblewrap without privilege -- under per-command resource
limits, keeps background processes in its process manager, and mounts workspace filesystems
into its working directory through the mount manager.
"""

from .._exports import fixup_module_metadata
from ._isolation import PROXY_PORT as PROXY_PORT
from ._isolation import detect_isolation as detect_isolation
from ._limits import detect_cgroups as detect_cgroups
from ._local import COMMAND_RETAINED_BYTES as COMMAND_RETAINED_BYTES
from ._local import LocalSandbox as LocalSandbox
from ._local import shell_quote as shell_quote
from ._mounts import MountEntry as MountEntry
from ._mounts import MountManager as MountManager
from ._mounts import MountState as MountState
from ._output import DEFAULT_MAX_RETAINED_BYTES as DEFAULT_MAX_RETAINED_BYTES
from ._output import RetainedOutputBuffer as RetainedOutputBuffer
from ._processes import AbortSignal as AbortSignal
from ._processes import LocalProcessManager as LocalProcessManager
from ._processes import ProcessHandle as ProcessHandle
from ._processes import SandboxProcessManager as SandboxProcessManager
from ._records import CommandResult as CommandResult

__all__ = [
    "COMMAND_RETAINED_BYTES",
    "DEFAULT_MAX_RETAINED_BYTES",
    "PROXY_PORT",
    "AbortSignal",
    "CommandResult",
    "LocalProcessManager",
    "LocalSandbox",
    "MountEntry",
    "MountManager",
    "MountState",
    "ProcessHandle",
    "RetainedOutputBuffer",
    "SandboxProcessManager",
    "detect_cgroups",
    "detect_isolation",
    "shell_quote",
]

fixup_module_metadata(__name__, globals())
