package main

import (
	"flag"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoFile reads a file at the repository's root (two folders up).
func repoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestREADMEFlagTableListsEveryFlag: the README's configuration table
// names every flag of `sidecar serve` in a row's first cell, and names no
// flag serve lacks. When it fails, add the flag to the table under
// "## Configuration" (a row of its own, or beside a flag it goes with).
func TestREADMEFlagTableListsEveryFlag(t *testing.T) {
	readme := repoFile(t, "README.md")
	_, conf, ok := strings.Cut(readme, "\n## Configuration\n")
	if !ok {
		t.Fatal("README.md has no ## Configuration section")
	}
	conf, _, _ = strings.Cut(conf, "\n## ")
	listed := map[string]bool{}
	name := regexp.MustCompile("`--([a-z0-9-]+)`")
	for _, line := range strings.Split(conf, "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			listed[m[1]] = true
		}
	}
	var c serveConfig
	var missing []string
	serveFlags(&c).VisitAll(func(f *flag.Flag) {
		if !listed[f.Name] {
			missing = append(missing, "--"+f.Name)
		}
		delete(listed, f.Name)
	})
	if len(missing) > 0 {
		t.Errorf("README.md's flag table lacks %d flags of sidecar serve: %s", len(missing), strings.Join(missing, ", "))
	}
	for n := range listed {
		t.Errorf("README.md's flag table lists --%s, which sidecar serve does not have", n)
	}
}

// TestMakeHelp: `make help` lists every target of the Makefile once, in
// groups, its texts starting in one column, with no unexpanded $(VAR) and
// no reference to an issue number.
func TestMakeHelp(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Fatalf("make, to run make help: %v", err)
	}
	out, err := exec.Command(mk, "-s", "-C", "../..", "help").CombinedOutput()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, out)
	}
	help := string(out)
	if strings.Contains(help, "$(") {
		t.Errorf("make help shows an unexpanded variable:\n%s", help)
	}
	if m := regexp.MustCompile(`(?i)\bissues? #?\d+|#\d+`).FindString(help); m != "" {
		t.Errorf("make help refers to %q: a newcomer cannot look that up; say what the target does", m)
	}
	var groups, targets []string
	col := -1
	for _, line := range strings.Split(strings.TrimRight(help, "\n"), "\n")[1:] {
		switch {
		case line == "":
		case !strings.HasPrefix(line, " "):
			groups = append(groups, line)
		default:
			f := strings.Fields(line)
			targets = append(targets, f[0])
			rest := strings.TrimPrefix(line, "  "+f[0])
			at := len(line) - len(strings.TrimLeft(rest, " "))
			if col < 0 {
				col = at
			}
			if at != col || at < len("  ")+len(f[0])+2 {
				t.Errorf("text of %s starts at column %d, others at %d: %q", f[0], at, col, line)
			}
			if len(line) > 125 {
				t.Errorf("help line of %s is %d columns: %q", f[0], len(line), line)
			}
		}
	}
	if len(groups) < 3 {
		t.Errorf("%d groups, want the targets grouped: %q", len(groups), groups)
	}
	var phony []string
	for _, line := range strings.Split(repoFile(t, "Makefile"), "\n") {
		if rest, ok := strings.CutPrefix(line, ".PHONY:"); ok {
			phony = append(phony, strings.Fields(rest)...)
		}
	}
	slices.Sort(phony)
	slices.Sort(targets)
	if !slices.Equal(phony, targets) || len(targets) < 20 {
		t.Errorf("make help lists %q\nthe Makefile's .PHONY targets are %q", targets, phony)
	}
}
