"""The reusable conformance suite and test servers for workspace filesystems.

Third-party backends run the same suite: subclass :class:`FilesystemTests` and provide a
``harness`` fixture returning a :class:`Harness` (the filesystem plus a direct oracle).
Installing agentvfs registers this package's pytest plugin (the ``anyio`` marker backend).
"""

from .._exports import fixup_module_metadata
from ._adversary import ATTACKS as ATTACKS
from ._adversary import Arena as Arena
from ._adversary import Attack as Attack
from ._adversary import AttackReport as AttackReport
from ._adversary import attack as attack
from ._adversary import load_attacks as load_attacks
from ._adversary import requirement_missing as requirement_missing
from ._adversary import run_attack as run_attack
from ._appender import appender_command as appender_command
from ._harness import Harness as Harness
from ._harness import backend_harness as backend_harness
from ._harness import composite_harness as composite_harness
from ._harness import fsspec_harness as fsspec_harness
from ._harness import local_harness as local_harness
from ._harness import mounted_harness as mounted_harness
from ._harness import overlay_harness as overlay_harness
from ._servers import EmulatorProcess as EmulatorProcess
from ._servers import FakeGcsServer as FakeGcsServer
from ._servers import MotoServer as MotoServer
from ._servers import free_port as free_port
from ._suite import FilesystemTests as FilesystemTests

__all__ = [
    "ATTACKS",
    "Arena",
    "Attack",
    "AttackReport",
    "EmulatorProcess",
    "FakeGcsServer",
    "FilesystemTests",
    "Harness",
    "MotoServer",
    "appender_command",
    "attack",
    "backend_harness",
    "composite_harness",
    "free_port",
    "fsspec_harness",
    "load_attacks",
    "local_harness",
    "mounted_harness",
    "overlay_harness",
    "requirement_missing",
    "run_attack",
]

fixup_module_metadata(__name__, globals())
