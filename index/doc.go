// Package index is the RAG tier: it finds the stored memories that matter for
// a query. It owns
//
//   - a BM25 inverted index over an English/CJK tokenizer (lower-casing,
//     stopwords, Porter stemming; CJK runs as character bigrams),
//   - vector search over embeddings: an exact scan for small indexes, an
//     HNSW graph (github.com/coder/hnsw) above Options.ExactBelow vectors,
//   - an entity graph (graph.go, EntityGraph, attached with SetGraph): the
//     entities a query names (runs of its terms equal to a triple's subject
//     or object) lead to their triples, one hop further, and to the
//     documents supporting them; bounded per query (entities of at most 4
//     terms, 64 links per entity, 8 first-hop links expanded),
//   - hybrid fusion of the rankings (weighted normalised scores or
//     reciprocal rank fusion, Options.Fusion; the graph's list, when a
//     graph is attached, adds Options.GraphWeight),
//   - a reranker over relevance, recency, importance and access count
//     (Options.Rerank),
//   - embedders behind one interface: the offline HashEmbedder (default,
//     no model) and OpenAIEmbedder for an OpenAI-compatible /v1/embeddings
//     (batches bounded in texts and bytes, a bounded content-hash cache
//     that in-flight texts join, retries, a cooldown while the endpoint
//     fails, inputs cut to what the server takes, and the server's vector
//     space followed when it changes model: SpaceEmbedder),
//   - persistence of documents and vectors in one checksummed file (Save,
//     Load), written atomically.
//
// Index is a thin owner of the documents (by slot; an ID names its slot)
// and of the one lock, over parts that each own their state:
//
//   - bm25 (bm25.go): the postings, document frequencies and lengths of
//     the live documents. Its n is the index's one count of them
//     (Index.Len); a term is in its postings exactly when a live document
//     holds it (a posting list may still name tombstones until compaction).
//   - vectors (vectors.go): the stored vectors' dimension and space, their
//     count, the exact scan and the HNSW graph. The graph, when built,
//     holds every live vector; its keys are slots, never reused before
//     compaction; it is never edited in place.
//   - embedding (space.go): the embedder and the optional interfaces it
//     implements; set by New and never changed, so used without the lock.
//     Every call that may wait on the network goes through it, outside
//     the lock.
//   - EntityGraph (graph.go): immutable once built; Index holds the one
//     attached with SetGraph.
//   - persistence (persist.go): functions over a snapshot of the entries;
//     no state of its own.
//
// The parts have no lock or goroutine of their own: Index.mu guards them
// all, so that a document enters every part under one lock (the first
// invariant below); only Index's methods take it, and the parts' methods
// expect it held (for reading, in searches). The package starts no
// goroutine; OpenAIEmbedder's state has its own mutex.
//
// Files, one concern each: index.go (Index: documents, Add, Upsert,
// Delete, Rebuild, compaction, Stats), search.go (Search, SearchFunc,
// SearchFocus: one search through the parts), bm25.go (term frequencies,
// postings, IDF, Coverage), vectors.go (exact scan, HNSW graph), graph.go
// (the entity graph), fusion.go (fusion, rerank, recency), topn.go (the
// bounded heap every retriever ranks with), tokenize.go and stem.go (the
// tokenizer memory shares via Tokenize), embed.go, openai.go and
// openai_fetch.go (embedders; the HTTP side in the latter), space.go (the
// embedder calls, vector-space changes and re-embedding), persist.go
// (Save, Load), options.go.
//
// The package imports nothing from the project; memory/ owns the documents
// (memory units) and their metadata and keeps the index in step with them.
//
// Invariants:
//
//   - A document is in every index or in none: Add, Upsert and Delete apply
//     to BM25 and vectors under one lock, and embedding happens before the
//     lock, so a failed embedding changes nothing.
//   - Deleted or replaced documents are tombstones until compaction and are
//     never returned by Search (see Index for why the HNSW graph is never
//     edited in place).
//   - Every stored vector has unit length and the index's one dimension,
//     and, with a SpaceEmbedder, comes from one vector space: when the
//     embedder answers in another (the server's model changed), Stale
//     says so and searches fail with ErrEmbed until Reembed or the next
//     Add or Upsert re-embeds every document and swaps the vectors at
//     once; zero embeddings are not stored (such documents are found by
//     BM25 only).
//   - A persisted file is used whole or not at all: Load verifies the
//     CRC-32C and every length before building anything, and reports
//     durable.ErrCorrupt, never a partial index; the caller rebuilds with Rebuild.
//   - An attached EntityGraph is immutable and names documents by ID: it
//     survives compaction, and documents it names that the index does not
//     hold (or keep rejects) are never returned through it.
//   - Search results are deterministic for a given index content (ties are
//     broken by ID), except that HNSW walks above ExactBelow vectors are
//     approximate.
//   - Errors carry the "index:" prefix and wrap the package's sentinels.
package index
