package knowledge

import (
	"errors"
	"fmt"
	"math"
)

// ReviewerOptions configure the memory reviewer (package memory's review.go): a fact whose
// importance reaches PromoteAt or falls below DemoteBelow is reviewed by
// the Extractor's model in the background, in up to MaxRounds calls, and
// promoted to core, kept (importance reset to DemoteBelow) or deleted.
// Reviews share the extraction queue and workers (Extraction.Queue,
// Workers, Timeout per call); at most one is in flight per tenant and user.
type ReviewerOptions struct {
	// Enabled turns the reviewer on. It needs Extraction.Extractor.
	Enabled bool
	// PromoteAt: a fact whose importance reaches it is reviewed for
	// promotion. Zero: PromoteReviewAt (2.5).
	PromoteAt float64
	// DemoteBelow: a fact whose importance falls below it (by decay) is
	// reviewed; KEEP resets the importance to it. Zero: DecayReviewAt
	// (0.5).
	DemoteBelow float64
	// MaxRounds bounds the model calls of one review: each may ask for a
	// [SEARCH:keywords] of the scope's memory, the last must decide.
	// Zero: 3.
	MaxRounds int
	// SearchK is how many memories one search shows the model. Zero: 5.
	SearchK int
	// LogSize is how many decisions a tenant and user's log keeps (the
	// newest). Zero: 1000.
	LogSize int
}

// EnsureDefaults sets the documented defaults of the zero fields.
func (o *ReviewerOptions) EnsureDefaults() {
	if o.PromoteAt == 0 {
		o.PromoteAt = PromoteReviewAt
	}
	if o.DemoteBelow == 0 {
		o.DemoteBelow = DecayReviewAt
	}
	if o.MaxRounds == 0 {
		o.MaxRounds = 3
	}
	if o.SearchK == 0 {
		o.SearchK = 5
	}
	if o.LogSize == 0 {
		o.LogSize = 1000
	}
}

// Validate reports options out of their documented ranges.
func (o *ReviewerOptions) Validate() error {
	if !(o.DemoteBelow > 0 && o.DemoteBelow < o.PromoteAt) || math.IsInf(o.PromoteAt, 0) {
		return fmt.Errorf("memory: Reviewer thresholds: want 0 < DemoteBelow (%v) < PromoteAt (%v)", o.DemoteBelow, o.PromoteAt)
	}
	if o.MaxRounds < 1 || o.MaxRounds > 10 {
		return fmt.Errorf("memory: Reviewer.MaxRounds %d not in [1, 10]", o.MaxRounds)
	}
	if o.SearchK < 1 || o.SearchK > 50 || o.LogSize < 1 {
		return errors.New("memory: Reviewer.SearchK must be in [1, 50] and LogSize positive")
	}
	return nil
}

// ToolContextOptions configure tool-result context (package memory's toolctx.go): the tool
// calls and results a request brings are condensed in the background into
// one or two sentences, shown in the recall block of the session's next
// turn (within Recall.Share) and made for that turn only; the block stays
// in the transcript as it was sent, and no memory unit holds it. The
// condensing call shares
// the extraction queue and workers.
type ToolContextOptions struct {
	// Enabled turns it on. It needs Extraction.Extractor and recall
	// (Recall.Share ≥ 0).
	Enabled bool
	// MaxBytes caps the condensed text; a longer answer is rejected, not
	// cut. Zero: 400.
	MaxBytes int
	// PromptBytes bounds the tool calls and results one prompt carries
	// (each message is cut to a share of it). Zero: 8 KiB.
	PromptBytes int
}

// EnsureDefaults sets the documented defaults of the zero fields.
func (o *ToolContextOptions) EnsureDefaults() {
	if o.MaxBytes == 0 {
		o.MaxBytes = 400
	}
	if o.PromptBytes == 0 {
		o.PromptBytes = 8 << 10
	}
}

// Validate reports options out of their documented ranges.
func (o *ToolContextOptions) Validate() error {
	if o.MaxBytes < 16 || o.MaxBytes > 4096 || o.PromptBytes < 256 {
		return fmt.Errorf("memory: ToolContext.MaxBytes %d not in [16, 4096] or PromptBytes %d below 256", o.MaxBytes, o.PromptBytes)
	}
	return nil
}

// L4Options configure L4 compression (l4.go, and package memory's): when a session holds more
// than Threshold facts, facts whose embeddings' cosine similarity reaches
// Similarity are clustered (union-find), and each cluster of at least
// MinCluster facts is merged by the Extractor's model into one fact, kept
// only when its fidelity (0.6 × mean embedding similarity to the originals
// + 0.4 × keyword retention) reaches Fidelity. Without embeddings
// (Recall.IndexDisabled) the Threshold most important facts are kept and
// the others deleted. Runs share the extraction queue and workers
// (Extraction.Queue, Workers, Timeout per call); merging needs
// Extraction.Extractor.
type L4Options struct {
	// Enabled turns L4 compression on.
	Enabled bool
	// Threshold: a session with more facts than this is compressed.
	// Zero: 150.
	Threshold int
	// Similarity is the cosine similarity at which two facts join a
	// cluster, in (0, 1]. Zero: 0.75.
	Similarity float64
	// MinCluster is the smallest cluster merged. Zero: 3.
	MinCluster int
	// Fidelity is the least composite fidelity a merge needs to replace
	// its originals, in [0, 1]. Zero: 0.5.
	Fidelity float64
	// MaxMerges bounds the merge calls of one run. Zero: 8.
	MaxMerges int
	// MaxClusterFacts bounds the facts of one merge prompt: a larger
	// cluster is cut into even parts. Zero: 12.
	MaxClusterFacts int
}

// EnsureDefaults sets the documented defaults of the zero fields.
func (o *L4Options) EnsureDefaults() {
	if o.Threshold == 0 {
		o.Threshold = 150
	}
	if o.Similarity == 0 {
		o.Similarity = 0.75
	}
	if o.MinCluster == 0 {
		o.MinCluster = 3
	}
	if o.Fidelity == 0 {
		o.Fidelity = 0.5
	}
	if o.MaxMerges == 0 {
		o.MaxMerges = 8
	}
	if o.MaxClusterFacts == 0 {
		o.MaxClusterFacts = 12
	}
}

// Validate reports options out of their documented ranges.
func (o *L4Options) Validate() error {
	if o.Threshold < 1 || o.MaxMerges < 1 {
		return fmt.Errorf("memory: L4.Threshold %d and MaxMerges %d must be positive", o.Threshold, o.MaxMerges)
	}
	if !(o.Similarity > 0 && o.Similarity <= 1) || !(o.Fidelity >= 0 && o.Fidelity <= 1) {
		return fmt.Errorf("memory: L4.Similarity %v not in (0, 1] or Fidelity %v not in [0, 1]", o.Similarity, o.Fidelity)
	}
	if o.MinCluster < 2 || o.MaxClusterFacts < o.MinCluster || o.MaxClusterFacts > 64 {
		return fmt.Errorf("memory: L4.MinCluster %d must be at least 2 and MaxClusterFacts %d in [MinCluster, 64]", o.MinCluster, o.MaxClusterFacts)
	}
	return nil
}
