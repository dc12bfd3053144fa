package main

// sidecar snapshot export|import|inspect: context snapshots (.hctx)
// against a running sidecar, through its GET and PUT
// /v1/sessions/{id}/snapshot.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/internal/hctx"
	"github.com/kvsidecar/kvsidecar/proxy"
)

const snapshotUsage = `usage: sidecar snapshot <export|import|inspect> [flags]

  export   GET a session's snapshot (.hctx: its memory and engine KV states) from a running sidecar
           sidecar snapshot export --url http://127.0.0.1:8080 --session ID -o FILE
  import   PUT a snapshot into a running sidecar (same model behind it), creating the session there
           sidecar snapshot import --url http://127.0.0.1:9090 --session ID FILE
  inspect  check a snapshot file whole and print its manifest
           sidecar snapshot inspect FILE

The API key (--api-key, or SIDECAR_API_KEY) and the end user (--user, sent as X-User-ID) must be
the session's, as on every route. Run "sidecar snapshot <command> -h" for the flags.
`

// snapshotConfig is what the snapshot commands read from flags and the
// environment.
type snapshotConfig struct {
	url, apiKey, user, session string
	out                        string
	timeout                    time.Duration
	json                       bool
}

func snapshotFlags(name string, c *snapshotConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("snapshot "+name, flag.ContinueOnError)
	fs.StringVar(&c.url, "url", "http://127.0.0.1:8080", "the sidecar's base URL")
	fs.StringVar(&c.apiKey, "api-key", "", "the API key the session belongs to (sent as Authorization: Bearer …)")
	fs.StringVar(&c.user, "user", "", "the session's end user, sent as X-User-ID (empty: a session that names none)")
	fs.StringVar(&c.session, "session", "", "the session id")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "bound on the whole call")
	fs.BoolVar(&c.json, "json", false, "print the result as one JSON object on stdout")
	if name == "export" {
		fs.StringVar(&c.out, "o", "", `the file to write ("-": stdout); required`)
	}
	return fs
}

func cmdSnapshot(args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(os.Stderr, snapshotUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "export":
		err = snapshotExport(args[1:])
	case "import":
		err = snapshotImport(args[1:])
	case "inspect":
		err = snapshotInspect(args[1:])
	default:
		fmt.Fprintf(os.Stderr, "sidecar snapshot: unknown command %q\n\n%s", args[0], snapshotUsage)
		return 2
	}
	var ue usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "sidecar snapshot %s: %v\n", args[0], err)
		return 2
	case err != nil:
		fmt.Fprintf(os.Stderr, "sidecar snapshot %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// usageError is a mistake on the command line (exit status 2).
type usageError struct{ error }

// parseSnapshotFlags parses args (flags, then at most want positional
// arguments, which it returns).
func parseSnapshotFlags(fs *flag.FlagSet, args []string, want int) ([]string, error) {
	// Flags may follow the file: move positional arguments last.
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
			if f := fs.Lookup(strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")); f != nil && !strings.Contains(a, "=") {
				if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); !isBool && i+1 < len(args) {
					i++
					flags = append(flags, args[i])
				}
			}
		default:
			pos = append(pos, a)
		}
	}
	if err := parseFlags(fs, flags, os.Getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if len(pos) != want {
		return nil, usageError{fmt.Errorf("want %d file argument(s), got %q", want, pos)}
	}
	return pos, nil
}

// snapshotURL is the snapshot route of a session on the sidecar at base.
func (c *snapshotConfig) snapshotURL() (string, error) {
	if c.session == "" {
		return "", usageError{errors.New("--session is required")}
	}
	u, err := url.Parse(strings.TrimRight(c.url, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", usageError{fmt.Errorf("--url %q: want http(s)://host:port", c.url)}
	}
	return u.String() + "/v1/sessions/" + url.PathEscape(c.session) + "/snapshot", nil
}

func (c *snapshotConfig) do(method, target string, body []byte) (*http.Response, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.user != "" {
		req.Header.Set("X-User-ID", c.user)
	}
	if method == http.MethodPut {
		req.Header.Set("Content-Type", proxy.SnapshotContentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, nil, fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct{ Message, Code string }
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			return resp, b, fmt.Errorf("%s: %d %s: %s", method, resp.StatusCode, e.Error.Code, e.Error.Message)
		}
		return resp, b, fmt.Errorf("%s: %d: %.200q", method, resp.StatusCode, b)
	}
	return resp, b, nil
}

func snapshotExport(args []string) error {
	var c snapshotConfig
	fs := snapshotFlags("export", &c)
	if _, err := parseSnapshotFlags(fs, args, 0); err != nil {
		return err
	}
	if c.out == "" {
		return usageError{errors.New(`-o FILE is required ("-" for stdout)`)}
	}
	target, err := c.snapshotURL()
	if err != nil {
		return err
	}
	start := time.Now()
	_, file, err := c.do(http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	took := time.Since(start)
	man, err := checkSnapshotFile(file)
	if err != nil {
		return fmt.Errorf("the sidecar answered a file that does not check out: %w", err)
	}
	if c.out == "-" {
		if _, err := os.Stdout.Write(file); err != nil {
			return err
		}
	} else if err := durable.WriteFile(c.out, file); err != nil {
		return err
	}
	return report(c.json && c.out != "-", map[string]any{"file": c.out, "bytes": len(file), "ms": ms(took), "manifest": man},
		fmt.Sprintf("exported session %q: %s in %d ms (%s)", c.session, sizeOf(len(file)), took.Milliseconds(), summary(man)))
}

func snapshotImport(args []string) error {
	var c snapshotConfig
	fs := snapshotFlags("import", &c)
	pos, err := parseSnapshotFlags(fs, args, 1)
	if err != nil {
		return err
	}
	target, err := c.snapshotURL()
	if err != nil {
		return err
	}
	file, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	if _, err := checkSnapshotFile(file); err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	start := time.Now()
	_, body, err := c.do(http.MethodPut, target, file)
	if err != nil {
		return err
	}
	took := time.Since(start)
	var res json.RawMessage = body
	var r struct {
		Replaced bool   `json:"replaced"`
		Note     string `json:"note"`
		Memory   struct {
			Messages, Units, Facts, Triples int
		} `json:"memory"`
		Engine *struct{ States, Tokens int } `json:"engine"`
	}
	_ = json.Unmarshal(body, &r)
	line := fmt.Sprintf("imported session %q: %s in %d ms (%d messages, %d units, %d facts, %d triples", c.session, sizeOf(len(file)),
		took.Milliseconds(), r.Memory.Messages, r.Memory.Units, r.Memory.Facts, r.Memory.Triples)
	if r.Engine != nil {
		line += fmt.Sprintf("; %d KV states, %d tokens", r.Engine.States, r.Engine.Tokens)
	}
	line += ")"
	if r.Replaced {
		line += "; replaced the session that was there"
	}
	if r.Note != "" {
		line += "; " + r.Note
	}
	return report(c.json, map[string]any{"file": pos[0], "bytes": len(file), "ms": ms(took), "result": res}, line)
}

func snapshotInspect(args []string) error {
	var c snapshotConfig
	fs := flag.NewFlagSet("snapshot inspect", flag.ContinueOnError)
	fs.BoolVar(&c.json, "json", false, "print the manifest as JSON on stdout")
	pos, err := parseSnapshotFlags(fs, args, 1)
	if err != nil {
		return err
	}
	file, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	man, err := checkSnapshotFile(file)
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	return report(c.json, man, fmt.Sprintf("%s: a whole snapshot of %s: %s", pos[0], sizeOf(len(file)), summary(man)))
}

// checkSnapshotFile checks a file whole (the importer checks again) and
// returns its manifest.
func checkSnapshotFile(file []byte) (map[string]any, error) {
	secs, err := hctx.Parse(file)
	if err != nil {
		return nil, err
	}
	mj, ok := hctx.Find(secs, hctx.KindManifest)
	if !ok {
		return nil, errors.New("no manifest")
	}
	var man map[string]any
	if err := json.Unmarshal(mj, &man); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return man, nil
}

// summary says what a manifest holds, for people.
func summary(man map[string]any) string {
	num := func(m any, k string) int {
		mm, _ := m.(map[string]any)
		f, _ := mm[k].(float64)
		return int(f)
	}
	mem := man["memory"]
	s := fmt.Sprintf("session %v, %d messages, %d units, %d facts, %d triples, working memory %d", man["session"],
		num(mem, "messages"), num(mem, "units"), num(mem, "facts"), num(mem, "triples"), num(mem, "active"))
	if eng, ok := man["engine"]; ok {
		s += fmt.Sprintf("; %d KV states, %d tokens, %s", num(eng, "states"), num(eng, "tokens"), sizeOf(num(eng, "bytes")))
		if n := num(eng, "skipped"); n > 0 {
			s += fmt.Sprintf(", %d left out (over --max-snapshot-bytes)", n)
		}
	}
	return s
}

func report(asJSON bool, v any, line string) error {
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(v)
	}
	fmt.Fprintln(os.Stderr, line)
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sizeOf(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
