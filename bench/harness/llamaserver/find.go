package llamaserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Environment variables that override where the tools are found.
const (
	EnvServer = "LLAMA_SERVER"    // path of the llama-server binary
	EnvScript = "LLAMA_TINY_GGUF" // path of tiny_gguf.py
)

// ErrNotFound marks a tool that is not on this machine.
var ErrNotFound = errors.New("llamaserver: not found")

// Paths are the tools this package runs.
type Paths struct {
	Server string // llama-server
	Script string // tiny_gguf.py
	Python string // python3
}

// Find locates llama-server, tiny_gguf.py and python3. An error wraps
// ErrNotFound and says what is missing and where it was looked for.
func Find() (Paths, error) {
	var p Paths
	var missing []string
	why := func(err error) string { return strings.TrimPrefix(err.Error(), ErrNotFound.Error()+": ") }
	srv, err := FindServer()
	if err != nil {
		missing = append(missing, why(err))
	}
	p.Server = srv
	if p.Script, err = findScript(srv); err != nil {
		missing = append(missing, why(err))
	}
	if p.Python, err = exec.LookPath("python3"); err != nil {
		missing = append(missing, "python3 is not on PATH")
	}
	if len(missing) > 0 {
		return p, fmt.Errorf("%w: %s", ErrNotFound, strings.Join(missing, "; "))
	}
	return p, nil
}

// FindServer returns $LLAMA_SERVER when set, else the first
// shared/llama/bin/llama-server found walking up from the working directory,
// then from the executable's directory.
func FindServer() (string, error) {
	if v := os.Getenv(EnvServer); v != "" {
		if !isExecutable(v) {
			return "", fmt.Errorf("%w: $%s=%s is not an executable file", ErrNotFound, EnvServer, v)
		}
		return v, nil
	}
	if p, ok := walkUp(searchRoots(), filepath.Join("shared", "llama", "bin", "llama-server"), isExecutable); ok {
		return p, nil
	}
	return "", fmt.Errorf("%w: no $%s and no shared/llama/bin/llama-server above %s", ErrNotFound, EnvServer, strings.Join(searchRoots(), " or "))
}

// findScript returns $LLAMA_TINY_GGUF, else tiny_gguf.py next to the
// server's bin folder, else shared/llama/tiny_gguf.py found walking up.
func findScript(server string) (string, error) {
	if v := os.Getenv(EnvScript); v != "" {
		if !isFile(v) {
			return "", fmt.Errorf("%w: $%s=%s is not a file", ErrNotFound, EnvScript, v)
		}
		return v, nil
	}
	if server != "" {
		if p := filepath.Join(filepath.Dir(filepath.Dir(server)), "tiny_gguf.py"); isFile(p) {
			return p, nil
		}
	}
	if p, ok := walkUp(searchRoots(), filepath.Join("shared", "llama", "tiny_gguf.py"), isFile); ok {
		return p, nil
	}
	return "", fmt.Errorf("%w: no $%s and no shared/llama/tiny_gguf.py", ErrNotFound, EnvScript)
}

// searchRoots are the folders the walks start from.
func searchRoots() []string {
	var roots []string
	if wd, err := os.Getwd(); err == nil {
		roots = append(roots, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		roots = append(roots, filepath.Dir(exe))
	}
	return roots
}

// walkUp returns the first dir/rel that ok accepts, for dir each root and
// then each of its parents.
func walkUp(roots []string, rel string, ok func(string) bool) (string, bool) {
	for _, root := range roots {
		dir, err := filepath.Abs(root)
		if err != nil {
			continue
		}
		for {
			if p := filepath.Join(dir, rel); ok(p) {
				return p, true
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", false
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// TinyModel returns the path of a tiny random-weight GGUF made by
// `python3 tiny_gguf.py OUT args...` (args: n_embd, n_layer, n_head,
// n_head_kv, n_ff, seed; none gives the script's defaults). Files are cached
// in dir (empty: the user's cache folder, else the temporary folder) under a
// name derived from the script's bytes and args, so a second call is a
// stat; the file is written to a temporary name and renamed, so concurrent
// callers never see half a model.
func TinyModel(p Paths, dir string, args ...int) (string, error) {
	if p.Python == "" || p.Script == "" {
		return "", fmt.Errorf("%w: tiny model needs python3 and tiny_gguf.py", ErrNotFound)
	}
	script, err := os.ReadFile(p.Script)
	if err != nil {
		return "", fmt.Errorf("llamaserver: read %s: %w", p.Script, err)
	}
	if dir == "" {
		dir = defaultCacheDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("llamaserver: model cache: %w", err)
	}
	sargs := make([]string, len(args))
	for i, a := range args {
		if a <= 0 {
			return "", fmt.Errorf("llamaserver: tiny model argument %d is %d", i, a)
		}
		sargs[i] = strconv.Itoa(a)
	}
	h := sha256.New()
	h.Write(script)
	h.Write([]byte("\x00" + strings.Join(sargs, " ")))
	name := "tiny"
	if len(sargs) > 0 {
		name += "-" + strings.Join(sargs, "-")
	}
	out := filepath.Join(dir, name+"-"+hex.EncodeToString(h.Sum(nil)[:6])+".gguf")
	if isFile(out) {
		return out, nil
	}
	tmp, err := os.CreateTemp(dir, name+"-*.tmp")
	if err != nil {
		return "", fmt.Errorf("llamaserver: model cache: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command(p.Python, append([]string{p.Script, tmp.Name()}, sargs...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("llamaserver: %s %s: %w: %s", p.Script, strings.Join(sargs, " "), err, strings.TrimSpace(string(b)))
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("llamaserver: model cache: %w", err)
	}
	return out, nil
}

func defaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kvsidecar", "tiny-gguf")
	}
	return filepath.Join(os.TempDir(), "kvsidecar-tiny-gguf")
}
