"""Search over a workspace: BM25 kept in DuckDB, vectors in any vector store (hnswlib bundled),
and the reference's hybrid fusion."""
