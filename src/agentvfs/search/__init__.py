"""Search over a workspace: BM25 kept in DuckDB, vectors in any vector store (hnswlib bundled),
and the reference's hybrid fusion.

``Workspace(bm25=..., vector_store=..., embedder=...)`` is the usual way in; the pieces are
public for programs that index on their own: :class:`BM25Index`, :class:`HnswVectorStore`,
:class:`SearchEngine`, the embedders (:class:`HashingEmbedder`, deterministic and model-free;
:class:`MiniLMEmbedder` with ``pip install agentvfs[embed]``) and :func:`split_into_chunks`.

Immutable index segments (:class:`Segment`, :func:`build_segment`) hold the BM25 postings and
documents of a set of files in one memory-mapped file; :func:`build_index` makes them of a whole
bucket (in this process or on a Dask cluster) and lists them in a :class:`Manifest`
(:func:`read_manifest`, :func:`fetch_segment`).
"""

from ..errors import MissingExtraError  # isort: skip

try:  # what a missing extra is told, instead of a bare "No module named 'duckdb'"
    import duckdb  # noqa: F401  # isort: skip
    import hnswlib  # noqa: F401  # isort: skip
    import numpy  # noqa: F401  # isort: skip
except ModuleNotFoundError as _missing:
    if _missing.name not in ("duckdb", "hnswlib", "numpy"):
        raise
    raise MissingExtraError("Search (agentvfs.search)", "search", _missing.name) from None

from .._exports import fixup_module_metadata
from ..errors import BM25FileError as BM25FileError
from ..errors import EmbeddingError as EmbeddingError
from ..errors import IndexConflictError as IndexConflictError
from ..errors import SearchIndexError as SearchIndexError
from ._bm25 import BM25Hit as BM25Hit
from ._bm25 import BM25Index as BM25Index
from ._bulk import BuildReport as BuildReport
from ._bulk import Manifest as Manifest
from ._bulk import SegmentRef as SegmentRef
from ._bulk import TaskReport as TaskReport
from ._bulk import build_index as build_index
from ._bulk import fetch_segment as fetch_segment
from ._bulk import read_manifest as read_manifest
from ._chunking import Chunk as Chunk
from ._chunking import split_into_chunks as split_into_chunks
from ._embedders import HashingEmbedder as HashingEmbedder
from ._engine import Document as Document
from ._engine import SearchEngine as SearchEngine
from ._engine import SearchResult as SearchResult
from ._minilm import MiniLMEmbedder as MiniLMEmbedder
from ._segments import Segment as Segment
from ._segments import SourceFile as SourceFile
from ._segments import SourceRecord as SourceRecord
from ._segments import build_segment as build_segment
from ._tokenize import TokenizeOptions as TokenizeOptions
from ._tokenize import make_tokenizer as make_tokenizer
from ._vectors import HnswVectorStore as HnswVectorStore
from ._workspace import WorkspaceSearch as WorkspaceSearch
from ._workspace import parse_bm25_config as parse_bm25_config
from ._workspace import parse_index_options as parse_index_options

__all__ = [
    "BM25FileError",
    "BM25Hit",
    "BM25Index",
    "BuildReport",
    "Chunk",
    "Document",
    "EmbeddingError",
    "HashingEmbedder",
    "HnswVectorStore",
    "IndexConflictError",
    "Manifest",
    "MiniLMEmbedder",
    "SearchEngine",
    "SearchIndexError",
    "SearchResult",
    "Segment",
    "SegmentRef",
    "SourceFile",
    "SourceRecord",
    "TaskReport",
    "TokenizeOptions",
    "WorkspaceSearch",
    "build_index",
    "build_segment",
    "fetch_segment",
    "make_tokenizer",
    "parse_bm25_config",
    "parse_index_options",
    "read_manifest",
    "split_into_chunks",
]

fixup_module_metadata(__name__, globals())
