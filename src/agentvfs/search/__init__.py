"""Search over a workspace: BM25 kept in DuckDB, vectors in any vector store (hnswlib bundled),
and the reference's hybrid fusion.

``Workspace(bm25=..., vector_store=..., embedder=...)`` is the usual way in; the pieces are
public for programs that index on their own: :class:`BM25Index`, :class:`HnswVectorStore`,
:class:`SearchEngine`, the embedders (:class:`HashingEmbedder`, deterministic and model-free;
:class:`MiniLMEmbedder` with ``pip install agentvfs[embed]``) and :func:`split_into_chunks`.
"""

from ._bm25 import BM25Hit as BM25Hit
from ._bm25 import BM25Index as BM25Index
from ._chunking import Chunk as Chunk
from ._chunking import split_into_chunks as split_into_chunks
from ._embedders import EmbeddingError as EmbeddingError
from ._embedders import HashingEmbedder as HashingEmbedder
from ._engine import Document as Document
from ._engine import SearchEngine as SearchEngine
from ._engine import SearchResult as SearchResult
from ._minilm import MiniLMEmbedder as MiniLMEmbedder
from ._tokenize import TokenizeOptions as TokenizeOptions
from ._vectors import HnswVectorStore as HnswVectorStore
from ._workspace import SearchIndexError as SearchIndexError

__all__ = [
    "BM25Hit",
    "BM25Index",
    "Chunk",
    "Document",
    "EmbeddingError",
    "HashingEmbedder",
    "HnswVectorStore",
    "MiniLMEmbedder",
    "SearchEngine",
    "SearchIndexError",
    "SearchResult",
    "TokenizeOptions",
    "split_into_chunks",
]

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and _obj.__module__.startswith(__name__ + "._"):
        _obj.__module__ = __name__
del _name, _obj
