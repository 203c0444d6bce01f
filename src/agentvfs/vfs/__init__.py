"""Storage: the workspace filesystem contract and its backends.

``Backend`` is the storage contract (seven async operations on relative paths, with version
guards and object metadata); ``BackendFilesystem`` is the workspace filesystem over any
backend, and ``MemoryBackend`` the reference backend.

``FsspecFilesystem`` wraps any fsspec filesystem under a root, over a backend of its storage
kind (``fsspec_backend`` chooses one: ``MemoryStoreBackend``, ``ObjectStoreBackend``,
``S3Backend``, ``GcsBackend``, ``DiskBackend`` or the generic ``FsspecBackend``);
``LocalFilesystem`` is a local directory with the reference's path rules;
``CompositeFilesystem`` mounts several of them at directories of one tree.
``OverlayFilesystem`` is copy-on-write over any of them, with a guarded ``commit``.
``check_storage_options`` refuses a storage option that a URL's fsspec class does not take.
"""

from .._exports import fixup_module_metadata
from ._backend import Backend as Backend
from ._backend import ByteRange as ByteRange
from ._backend import KnownVersions as KnownVersions
from ._backend import SupportsBatchRead as SupportsBatchRead
from ._backend import SupportsReadIntoBuffer as SupportsReadIntoBuffer
from ._backend import SupportsTreeWalk as SupportsTreeWalk
from ._backend import Version as Version
from ._backend import WriteMode as WriteMode
from ._backend import translate as translate
from ._backend import translated as translated
from ._backend_fs import BackendFilesystem as BackendFilesystem
from ._base import ChangeListener as ChangeListener
from ._base import SupportsConditionalUpload as SupportsConditionalUpload
from ._base import SupportsGrep as SupportsGrep
from ._base import SupportsHardLinks as SupportsHardLinks
from ._base import SupportsListStats as SupportsListStats
from ._base import SupportsLocalAttributes as SupportsLocalAttributes
from ._base import SupportsLocalFiles as SupportsLocalFiles
from ._base import SupportsLocalStaging as SupportsLocalStaging
from ._base import SupportsPinnedRead as SupportsPinnedRead
from ._base import SupportsPosixAttributes as SupportsPosixAttributes
from ._base import SupportsPutNew as SupportsPutNew
from ._base import SupportsRangedRead as SupportsRangedRead
from ._base import SupportsReadBeneath as SupportsReadBeneath
from ._base import SupportsReadInto as SupportsReadInto
from ._base import SupportsReadMany as SupportsReadMany
from ._base import SupportsStreamingUpload as SupportsStreamingUpload
from ._base import SupportsTransfer as SupportsTransfer
from ._base import SupportsUploadRecovery as SupportsUploadRecovery
from ._base import SupportsWalk as SupportsWalk
from ._base import SupportsWalkStats as SupportsWalkStats
from ._base import UploadStream as UploadStream
from ._base import WorkspaceFilesystem as WorkspaceFilesystem
from ._base import attribute_storage as attribute_storage
from ._base import check_version as check_version
from ._base import download_file as download_file
from ._base import list_stats as list_stats
from ._base import make_hard_link as make_hard_link
from ._base import make_special as make_special
from ._base import new_id as new_id
from ._base import publish_file as publish_file
from ._base import put_new as put_new
from ._base import read_file_beneath as read_file_beneath
from ._base import read_many as read_many
from ._base import read_range as read_range
from ._base import read_range_into as read_range_into
from ._base import rewrite_file as rewrite_file
from ._base import run_sync as run_sync
from ._base import set_attributes as set_attributes
from ._base import upload_file as upload_file
from ._base import walk as walk
from ._base import walk_stats as walk_stats
from ._blobs import BlobStore as BlobStore
from ._blobs import is_digest as is_digest
from ._blobs import sha256_hex as sha256_hex
from ._cache import DEFAULT_CACHE_BYTES as DEFAULT_CACHE_BYTES
from ._cache import SETTLE_SECONDS as SETTLE_SECONDS
from ._cache import CacheInfo as CacheInfo
from ._cache import ContentCache as ContentCache
from ._cache import SupportsContentCache as SupportsContentCache
from ._cache import default_cache_dir as default_cache_dir
from ._cache import settled as settled
from ._composite import CompositeFilesystem as CompositeFilesystem
from ._disk import Disk as Disk
from ._disk import DiskEntry as DiskEntry
from ._disk_fs import DiskBackend as DiskBackend
from ._disk_fs import leads_out_of_directory as leads_out_of_directory
from ._disk_fs import translated_reads as translated_reads
from ._fsspec import FsspecFilesystem as FsspecFilesystem
from ._fsspec import fsspec_backend as fsspec_backend
from ._fsspec_backends import FsspecBackend as FsspecBackend
from ._fsspec_backends import MemoryStoreBackend as MemoryStoreBackend
from ._glob import create_glob_matcher as create_glob_matcher
from ._glob import extract_glob_base as extract_glob_base
from ._glob import is_glob_pattern as is_glob_pattern
from ._grep import MATCH_LINE_LIMIT as MATCH_LINE_LIMIT
from ._grep import BoundedPattern as BoundedPattern
from ._grep import LineChunker as LineChunker
from ._local import LocalFilesystem as LocalFilesystem
from ._memory_backend import MemoryBackend as MemoryBackend
from ._mime import TEXT_EXTENSIONS as TEXT_EXTENSIONS
from ._mime import get_mime_type as get_mime_type
from ._mime import is_text_file as is_text_file
from ._object_store import GcsBackend as GcsBackend
from ._object_store import ObjectStoreBackend as ObjectStoreBackend
from ._object_store import S3Backend as S3Backend
from ._overlay import CommitReport as CommitReport
from ._overlay import OverlayFilesystem as OverlayFilesystem
from ._paths import normalize as normalize_path
from ._posix import PosixAttributes as PosixAttributes
from ._posix import foreign_metadata as foreign_metadata
from ._records import Capabilities as Capabilities
from ._records import FileEntry as FileEntry
from ._records import FileStat as FileStat
from ._records import GrepFileResult as GrepFileResult
from ._records import GrepMatch as GrepMatch
from ._records import MountInfo as MountInfo
from ._storage_options import accepted_storage_options as accepted_storage_options
from ._storage_options import check_storage_options as check_storage_options
from ._storage_options import filesystem_class as filesystem_class
from ._units import from_units as from_units
from ._units import to_units as to_units
from ._units import unit_length as unit_length
from ._wrapper import TimeoutFilesystem as TimeoutFilesystem
from ._wrapper import WrapperFilesystem as WrapperFilesystem

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "MATCH_LINE_LIMIT",
    "SETTLE_SECONDS",
    "TEXT_EXTENSIONS",
    "Backend",
    "BackendFilesystem",
    "BlobStore",
    "BoundedPattern",
    "ByteRange",
    "CacheInfo",
    "Capabilities",
    "ChangeListener",
    "CommitReport",
    "CompositeFilesystem",
    "ContentCache",
    "Disk",
    "DiskBackend",
    "DiskEntry",
    "FileEntry",
    "FileStat",
    "FsspecBackend",
    "FsspecFilesystem",
    "GcsBackend",
    "GrepFileResult",
    "GrepMatch",
    "KnownVersions",
    "LineChunker",
    "LocalFilesystem",
    "MemoryBackend",
    "MemoryStoreBackend",
    "MountInfo",
    "ObjectStoreBackend",
    "OverlayFilesystem",
    "PosixAttributes",
    "S3Backend",
    "SupportsBatchRead",
    "SupportsConditionalUpload",
    "SupportsContentCache",
    "SupportsGrep",
    "SupportsHardLinks",
    "SupportsListStats",
    "SupportsLocalAttributes",
    "SupportsLocalFiles",
    "SupportsLocalStaging",
    "SupportsPinnedRead",
    "SupportsPosixAttributes",
    "SupportsPutNew",
    "SupportsRangedRead",
    "SupportsReadBeneath",
    "SupportsReadInto",
    "SupportsReadIntoBuffer",
    "SupportsReadMany",
    "SupportsStreamingUpload",
    "SupportsTransfer",
    "SupportsTreeWalk",
    "SupportsUploadRecovery",
    "SupportsWalk",
    "SupportsWalkStats",
    "TimeoutFilesystem",
    "UploadStream",
    "Version",
    "WorkspaceFilesystem",
    "WrapperFilesystem",
    "WriteMode",
    "accepted_storage_options",
    "attribute_storage",
    "check_storage_options",
    "check_version",
    "create_glob_matcher",
    "default_cache_dir",
    "download_file",
    "extract_glob_base",
    "filesystem_class",
    "foreign_metadata",
    "from_units",
    "fsspec_backend",
    "get_mime_type",
    "is_digest",
    "is_glob_pattern",
    "is_text_file",
    "leads_out_of_directory",
    "list_stats",
    "make_hard_link",
    "make_special",
    "new_id",
    "normalize_path",
    "publish_file",
    "put_new",
    "read_file_beneath",
    "read_many",
    "read_range",
    "read_range_into",
    "rewrite_file",
    "run_sync",
    "set_attributes",
    "settled",
    "sha256_hex",
    "to_units",
    "translate",
    "translated",
    "translated_reads",
    "unit_length",
    "upload_file",
    "walk",
    "walk_stats",
]

fixup_module_metadata(__name__, globals())
