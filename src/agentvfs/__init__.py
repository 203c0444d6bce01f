"""agentvfs: a workspace for AI agents over any storage fsspec can reach.

The public names live here; implementation modules are private.
"""

from typing import TYPE_CHECKING

from . import errors as errors
from ._context import RequestContext as RequestContext
from ._exports import fixup_module_metadata
from .errors import DirectoryNotEmpty as DirectoryNotEmpty
from .errors import DirectoryNotFound as DirectoryNotFound
from .errors import FileDecodeError as FileDecodeError
from .errors import FileExists as FileExists
from .errors import FileNotFound as FileNotFound
from .errors import FileReadRequiredError as FileReadRequiredError
from .errors import FilesystemError as FilesystemError
from .errors import FilesystemNotAvailableError as FilesystemNotAvailableError
from .errors import FileTooLarge as FileTooLarge
from .errors import InvalidPathError as InvalidPathError
from .errors import IsDirectory as IsDirectory
from .errors import IsolationUnavailableError as IsolationUnavailableError
from .errors import MountError as MountError
from .errors import NameTooLongError as NameTooLongError
from .errors import NoMountError as NoMountError
from .errors import NotDirectory as NotDirectory
from .errors import NotRegularFile as NotRegularFile
from .errors import PermissionDenied as PermissionDenied
from .errors import SandboxError as SandboxError
from .errors import SandboxNotAvailableError as SandboxNotAvailableError
from .errors import SandboxTimeoutError as SandboxTimeoutError
from .errors import SearchNotAvailableError as SearchNotAvailableError
from .errors import StaleFileError as StaleFileError
from .errors import WorkspaceError as WorkspaceError
from .errors import WorkspaceNotReadyError as WorkspaceNotReadyError
from .errors import WorkspaceReadOnlyError as WorkspaceReadOnlyError
from .sandbox import CommandResult as CommandResult
from .sandbox import LocalSandbox as LocalSandbox
from .tools import WORKSPACE_TOOLS as WORKSPACE_TOOLS
from .tools import ToolMedia as ToolMedia
from .tools import WorkspaceTool as WorkspaceTool
from .vfs import CompositeFilesystem as CompositeFilesystem
from .vfs import FileEntry as FileEntry
from .vfs import FileStat as FileStat
from .vfs import FsspecFilesystem as FsspecFilesystem
from .vfs import LocalFilesystem as LocalFilesystem
from .vfs import WorkspaceFilesystem as WorkspaceFilesystem
from .workspace import Workspace as Workspace

__version__ = "0.1.0"

__all__ = [
    "WORKSPACE_TOOLS",
    "CommandResult",
    "CompositeFilesystem",
    "DirectoryNotEmpty",
    "DirectoryNotFound",
    "FileDecodeError",
    "FileEntry",
    "FileExists",
    "FileNotFound",
    "FileReadRequiredError",
    "FileStat",
    "FileTooLarge",
    "FilesystemError",
    "FilesystemNotAvailableError",
    "FsspecFilesystem",
    "HnswVectorStore",
    "InvalidPathError",
    "IsDirectory",
    "IsolationUnavailableError",
    "LocalFilesystem",
    "LocalSandbox",
    "MountError",
    "NameTooLongError",
    "NoMountError",
    "NotDirectory",
    "NotRegularFile",
    "PermissionDenied",
    "RequestContext",
    "SandboxError",
    "SandboxNotAvailableError",
    "SandboxTimeoutError",
    "SearchNotAvailableError",
    "SearchResult",
    "StaleFileError",
    "ToolMedia",
    "Workspace",
    "WorkspaceError",
    "WorkspaceFilesystem",
    "WorkspaceNotReadyError",
    "WorkspaceReadOnlyError",
    "WorkspaceTool",
]

if TYPE_CHECKING:
    from .search import HnswVectorStore as HnswVectorStore
    from .search import SearchResult as SearchResult


def __getattr__(name: str) -> object:
    # Search pulls in DuckDB, NumPy and hnswlib: imported on first use, so processes that
    # never search (a mount server, a sandbox command) start faster.
    if name in ("HnswVectorStore", "SearchResult"):
        from . import search

        return getattr(search, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


fixup_module_metadata(__name__, globals(), ("RequestContext", "Workspace"))
