package workload

// The conversation-text rows of the archive study (archive.go): messages
// and session blocks with zstd, plain and with a dictionary trained on the
// tenant's own archive.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/klauspost/compress/dict"
	"github.com/klauspost/compress/zstd"

	"github.com/kvsidecar/kvsidecar/index"
)

// splitSessions returns each conversation's turn texts, by session, split
// into the archive (the older trainShare of the sessions) and the rest.
func splitSessions(c LocomoConversation, trainShare float64) (archive, recent [][]string) {
	var sessions [][]string
	last := -1
	for _, t := range c.Turns {
		if t.Session != last {
			sessions = append(sessions, nil)
			last = t.Session
		}
		sessions[len(sessions)-1] = append(sessions[len(sessions)-1], LocomoTurnText(t, true, true))
	}
	cut := max(1, min(len(sessions)-1, int(math.Round(trainShare*float64(len(sessions))))))
	return sessions[:cut], sessions[cut:]
}

// archiveText measures the conversation-text rows: the recent sessions'
// messages compressed one by one (a session log record each), with plain
// zstd and with a dictionary trained on the archive, and whole sessions as
// blocks.
func archiveText(convs []LocomoConversation, o ArchiveOptions) ([]ArchiveRow, error) {
	var train [][]byte
	var msgs [][]byte
	var blocks [][]byte
	for _, c := range convs {
		archive, recent := splitSessions(c, o.TrainShare)
		for _, s := range archive {
			for _, m := range s {
				train = append(train, []byte(m))
			}
		}
		for _, s := range recent {
			var block []byte
			for _, m := range s {
				msgs = append(msgs, []byte(m))
				block = append(append(block, m...), '\n')
			}
			blocks = append(blocks, block)
		}
	}
	if len(train) == 0 || len(msgs) == 0 {
		return nil, errors.New("bench: archive: too few sessions to split")
	}
	d, err := dict.BuildZstdDict(train, dict.Options{MaxDictSize: o.DictBytes, HashBytes: 6, ZstdDictID: 24, ZstdLevel: zstd.SpeedDefault})
	if err != nil {
		return nil, fmt.Errorf("bench: archive: train dictionary: %w", err)
	}
	var rows []ArchiveRow
	for _, v := range []struct {
		row, method string
		units       [][]byte
		dict        []byte
	}{
		{"conversation text", "zstd per message (default level)", msgs, nil},
		{"conversation text", fmt.Sprintf("zstd per message + dictionary trained on the tenant's archive (%d KiB)", o.DictBytes>>10), msgs, d},
		{"conversation text", "zstd per session block", blocks, nil},
		{"conversation text", "zstd per session block + the dictionary", blocks, d},
	} {
		row, err := zstdRow(v.units, v.dict, o.Repeat)
		if err != nil {
			return nil, err
		}
		row.Row, row.Method = v.row, v.method
		rows = append(rows, row)
	}
	base, err := hybridRecall10(convs)
	if err != nil {
		return nil, err
	}
	for i := range rows {
		rows[i].Recall10Base = base
	}
	rows[1].Note = fmt.Sprintf("trained on %d messages of the older %.0f%% of each conversation's sessions; the %d later messages compressed", len(train), 100*o.TrainShare, len(msgs))
	return rows, nil
}

// zstdRow compresses each unit alone (with dict when set), checks every
// unit decodes back and times decoding them all.
func zstdRow(units [][]byte, d []byte, repeat int) (ArchiveRow, error) {
	eopts := []zstd.EOption{zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true)}
	dopts := []zstd.DOption{zstd.WithDecoderConcurrency(1)}
	if d != nil {
		eopts = append(eopts, zstd.WithEncoderDict(d))
		dopts = append(dopts, zstd.WithDecoderDicts(d))
	}
	enc, err := zstd.NewWriter(nil, eopts...)
	if err != nil {
		return ArchiveRow{}, err
	}
	defer enc.Close()
	dec, err := zstd.NewReader(nil, dopts...)
	if err != nil {
		return ArchiveRow{}, err
	}
	defer dec.Close()
	row := ArchiveRow{Lossless: true, SideBytes: int64(len(d))}
	frames := make([][]byte, len(units))
	raw := 0
	for i, u := range units {
		frames[i] = enc.EncodeAll(u, nil)
		row.RawBytes += int64(len(u))
		row.StoredBytes += int64(len(frames[i]))
		raw += len(u)
	}
	row.StoredBytes += row.SideBytes
	buf := make([]byte, 0, 64<<10)
	for i, f := range frames {
		out, err := dec.DecodeAll(f, buf[:0])
		if err != nil {
			return row, fmt.Errorf("bench: archive: decode: %w", err)
		}
		if !bytes.Equal(out, units[i]) {
			return row, errors.New("bench: archive: a message did not decode back")
		}
	}
	row.DecodeMBps = bestMBps(raw, repeat, func() {
		for _, f := range frames {
			buf, _ = dec.DecodeAll(f, buf[:0])
		}
	})
	return row, nil
}

// hybridRecall10 is evidence recall@10 (%) of the sidecar's default index
// (hybrid BM25 + vectors over each turn with its previous one) on the
// uncompressed turns.
func hybridRecall10(convs []LocomoConversation) (float64, error) {
	var sum float64
	n := 0
	ctx := context.Background()
	for _, c := range convs {
		x, err := index.New(index.Options{})
		if err != nil {
			return 0, err
		}
		docs := make([]index.Doc, 0, len(c.Turns))
		for i, t := range c.Turns {
			text := LocomoTurnText(t, true, true)
			if i > 0 && c.Turns[i-1].Session == t.Session {
				text += "\n" + LocomoTurnText(c.Turns[i-1], true, true)
			}
			docs = append(docs, index.Doc{ID: t.DiaID, Text: text})
		}
		if err := x.Upsert(ctx, docs...); err != nil {
			return 0, err
		}
		for _, q := range c.QA {
			if len(q.Evidence) == 0 {
				continue
			}
			hits, err := x.Search(ctx, q.Question, 10, index.ModeHybrid)
			if err != nil {
				return 0, err
			}
			sum += evidenceRecall(hits, q.Evidence, 10)
			n++
		}
	}
	return 100 * sum / float64(max(n, 1)), nil
}
