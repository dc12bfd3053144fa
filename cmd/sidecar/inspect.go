package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/kvsidecar/kvsidecar/respstore"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// inspectReport describes a data dir.
type inspectReport struct {
	Dir      string `json:"dir"`
	Sessions struct {
		Logs       int   `json:"logs"`
		LogBytes   int64 `json:"log_bytes"`
		Indexes    int   `json:"indexes"`
		IndexBytes int64 `json:"index_bytes"`
		Quarantine int   `json:"quarantined_tails"`
	} `json:"sessions"`
	KV struct {
		Blocks      int                `json:"blocks"`
		Bytes       int64              `json:"bytes"`
		Quarantined []tiers.Quarantine `json:"quarantined"`
	} `json:"kv"`
	// RESP is the store of --resp-listen (--data-dir/resp), when there is one.
	RESP *respstore.Inventory `json:"resp,omitempty"`
}

// cmdInspect reports what a data dir holds: session logs and indexes, and
// the KV archive, every file's CRC verified. Like a start of the sidecar,
// it moves archive files that fail verification to quarantine/; it writes
// nothing else. Run it on a stopped sidecar's data dir.
func cmdInspect(args []string) int {
	fset := flag.NewFlagSet("inspect", flag.ContinueOnError)
	asJSON := fset.Bool("json", false, "print one JSON object")
	dataDir := fset.String("data-dir", "", "the data dir to inspect, as serve's --data-dir (or give it as DIR)")
	fset.Usage = func() {
		fmt.Fprintln(fset.Output(), "usage: sidecar inspect [--json] DIR\n       sidecar inspect [--json] --data-dir DIR")
		fset.PrintDefaults()
	}
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	dir, ok := inspectDir(*dataDir, fset.Args())
	if !ok {
		fset.Usage()
		return 2
	}
	r, err := inspect(dir)
	if err == nil {
		err = emit(*asJSON, r, writeInspect)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar inspect:", err)
		return 1
	}
	return 0
}

// inspectDir is the folder inspect reads: --data-dir's or the one
// argument, or both when they name the same; ok is false otherwise.
func inspectDir(flagDir string, args []string) (string, bool) {
	switch {
	case len(args) > 1:
		return "", false
	case len(args) == 1 && flagDir != "" && filepath.Clean(args[0]) != filepath.Clean(flagDir):
		return "", false
	case len(args) == 1:
		return args[0], true
	}
	return flagDir, flagDir != ""
}

func inspect(dir string) (inspectReport, error) {
	var r inspectReport
	r.Dir = dir
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return r, fmt.Errorf("%s is not a data dir", dir)
	}
	sessions := filepath.Join(dir, "sessions")
	err := filepath.WalkDir(sessions, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case strings.Contains(p, string(filepath.Separator)+"quarantine"+string(filepath.Separator)):
			r.Sessions.Quarantine++
		case strings.HasSuffix(p, ".log"):
			r.Sessions.Logs++
			r.Sessions.LogBytes += info.Size()
		case strings.HasSuffix(p, ".idx"):
			r.Sessions.Indexes++
			r.Sessions.IndexBytes += info.Size()
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return r, fmt.Errorf("sessions: %w", err)
	}
	kvDir := filepath.Join(dir, "kv")
	if _, err := os.Stat(kvDir); err == nil {
		a, err := tiers.OpenArchive(tiers.ArchiveOptions{Dir: kvDir, VerifyOnOpen: true})
		if err != nil {
			return r, fmt.Errorf("kv archive: %w", err)
		}
		r.KV.Blocks, r.KV.Bytes, r.KV.Quarantined = a.Len(), a.Bytes(), a.Quarantined()
		if err := a.Close(); err != nil {
			return r, fmt.Errorf("kv archive: %w", err)
		}
	}
	respDir := filepath.Join(dir, "resp")
	if _, err := os.Stat(respDir); err == nil {
		inv, err := respstore.Inspect(respDir)
		if err != nil {
			return r, err
		}
		r.RESP = &inv
	}
	return r, nil
}

func writeInspect(w io.Writer, r inspectReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "data dir\t%s\n", r.Dir)
	fmt.Fprintf(tw, "session logs\t%d (%d bytes)\n", r.Sessions.Logs, r.Sessions.LogBytes)
	fmt.Fprintf(tw, "session indexes\t%d (%d bytes)\n", r.Sessions.Indexes, r.Sessions.IndexBytes)
	fmt.Fprintf(tw, "quarantined log tails\t%d\n", r.Sessions.Quarantine)
	fmt.Fprintf(tw, "KV archive blocks\t%d (%d bytes on disk)\n", r.KV.Blocks, r.KV.Bytes)
	fmt.Fprintf(tw, "KV quarantined\t%d\n", len(r.KV.Quarantined))
	for _, q := range r.KV.Quarantined {
		fmt.Fprintf(tw, "  %s\t%s\n", q.File, q.Reason)
	}
	if v := r.RESP; v != nil {
		fmt.Fprintf(tw, "RESP values\t%d (%d bytes, %d on disk)\n", v.Values, v.Bytes, v.FileBytes)
		for _, t := range v.Tenants {
			fmt.Fprintf(tw, "  tenant %s\t%d keys, %d bytes, %d salts\n", t.Tenant, t.Keys, t.Bytes, t.Salts)
		}
		fmt.Fprintf(tw, "RESP quarantined\t%d\n", len(v.Quarantined))
		for _, q := range v.Quarantined {
			fmt.Fprintf(tw, "  %s\t%s\n", q.File, q.Reason)
		}
	}
	return tw.Flush()
}

// emit writes r as one JSON object, or as tables through table.
func emit[R any](asJSON bool, r R, table func(io.Writer, R) error) error {
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return table(os.Stdout, r)
}
