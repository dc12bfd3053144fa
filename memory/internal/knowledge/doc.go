// Package knowledge owns what package memory learns in the background from
// a session's turns, apart from the session it is learnt for: the language
// spoken with the memory model (its prompts and the strict parsers of its
// answers), the algorithms run on what it answers, the knowledge base's
// triples, the extraction queue and its goroutines, and the options and
// counters of all of it. Package memory's learner (extract.go, review.go,
// l4.go, toolctx.go, triples.go, categories.go) is the glue: it reads and
// writes the session under the session's lock, and calls this package for
// everything else.
//
// # What it owns
//
//   - The model's contract (extractor.go): Extractor, the one thing the
//     subsystem needs of a model (package llm, wired by cmd/sidecar, makes
//     the calls), and ExtractRequest, whose Kind names the prompt.
//   - The prompts (prompts.go): facts and triples, episodes, a review's
//     rounds, tool context (and the L4 merge's, l4.go), built from plain
//     lines and facts the caller passes; every text sanitized and bounded.
//   - Fact operations (factops.go): [ADD] [UPDATE:id] [BOOST:id]
//     [DELETE:id] [SKIP], parsed strictly line by line (ParseFactOps,
//     ParseLines: a bad line is rejected alone, wrapping memerr.ErrInvalid),
//     and what a fact's text and id may be (ValidFactText, ValidFactID).
//   - Categories and the decay and boost policy (category.go): system,
//     core, fact, episode; which decay, which are always injected, and the
//     design's figures (fact ×0.85 every 5 days, episode ×0.6 every 3 days
//     and gone after 7, review at 2.5 and 0.5, boosts 2 h apart and +1.0 a
//     day).
//   - The knowledge base (triples.go): Triple, its log form TripleRecord,
//     the "[TRIPLE]" lines of the fact prompt and their parser, a
//     session's triples (KB: the cascade when a fact is deleted, what is
//     left to write, the graph given to its index) and the links of the
//     user's graph.
//   - The reviewer's answers (review.go): [PROMOTE] [KEEP] [DELETE]
//     [SEARCH:…], one line, parsed strictly (ParseReview).
//   - Tool-result context (toolctx.go): the condensed answer's check
//     (ParseToolContext) and the header the recall block shows it under.
//   - L4 compression (l4.go): embeddings at unit length, union-find
//     clusters, the fidelity figures (0.6 × similarity + 0.4 × keyword
//     retention), the keywords, the merge prompt and its parser, a
//     session's refused clusters (L4State), the counters.
//   - The extraction queue (queue.go): Queue, a bounded queue and the
//     goroutines that drain it, started and waited for by its owner; a full
//     queue refuses, never blocks.
//   - The options of the reviewer, tool context and L4 (options.go), with
//     EnsureDefaults and Validate. package memory's Options holds them
//     under the same names (aliases).
//
// # What it needs
//
// Nothing of package memory: it imports only index (the embedder and the
// entity graph), memory/internal/memerr (ErrInvalid) and
// memory/internal/sanitize. Everything that touches a session — its lock,
// its units, its log, the worker that writes them — stays memory's; the
// functions here take what they compute on (texts, facts, triples) and
// return what memory applies.
//
// # Who calls it
//
// Package memory only: its learner (which job is due, what its prompt
// shows, applying the answers), its log replay (triple and l4 records), its recall (the
// session's graph), and its public types, which are aliases of these
// (memory.Category, Triple, MergeInfo, ExtractRequest, Extractor,
// ReviewerOptions, ToolContextOptions, L4Options, L4Stats).
//
// # Invariants
//
//   - A model's answer is never trusted: every parser is strict, bounded
//     in the bytes it reads, and rejects a line or an answer whole rather
//     than cut it; a text that looks like another operation is refused.
//   - No goroutine outlives its owner: Queue's run until the context given
//     to Start ends, and Wait waits for them.
//   - KB and L4State hold no lock: the session's lock protects them.
package knowledge
