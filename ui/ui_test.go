package ui

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// TestPageIsSelfContained: every file the page loads is embedded, and no
// file points the browser anywhere else (no CDN, no font or script host):
// the console works on a machine with no network.
func TestPageIsSelfContained(t *testing.T) {
	index, err := fs.ReadFile(Files, "index.html")
	if err != nil {
		t.Fatal(err)
	}
	refs := regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(string(index), -1)
	if len(refs) < 3 {
		t.Fatalf("index.html loads %d files, want the stylesheet and both scripts", len(refs))
	}
	for _, r := range refs {
		if _, err := fs.Stat(Files, r[1]); err != nil {
			t.Errorf("index.html loads %q, which is not embedded: %v", r[1], err)
		}
	}
	remote := regexp.MustCompile(`(?i:(https?:)?//[a-z0-9.-]+\.[a-z]{2,})|@import|\burl\(`)
	err = fs.WalkDir(Files, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Files, name)
		if err != nil {
			return err
		}
		for _, m := range remote.FindAllString(string(b), -1) {
			if m == "http://www.w3.org" {
				continue // the SVG namespace is a name, not a fetch
			}
			t.Errorf("%s refers to %q: the console must fetch nothing from elsewhere", name, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestScriptsNeverParseMarkup: stored text (memories, messages, triples)
// reaches the page through textContent only; no script turns strings into
// markup, and none relies on inline code the Content-Security-Policy blocks.
func TestScriptsNeverParseMarkup(t *testing.T) {
	for _, name := range []string{"app.js", "plot.js"} {
		b, err := fs.ReadFile(Files, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s uses %s", name, bad)
			}
		}
	}
	index, _ := fs.ReadFile(Files, "index.html")
	if regexp.MustCompile(`<script>|<style|\son[a-z]+="|\sstyle="`).Match(index) {
		t.Error("index.html holds inline script, style or event handlers, which the console's Content-Security-Policy blocks")
	}
}

// TestPageHasIcon: the page links an embedded icon, so no browser asks
// the sidecar for /favicon.ico (a 404 in the console on the first load).
func TestPageHasIcon(t *testing.T) {
	index, err := fs.ReadFile(Files, "index.html")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`<link rel="icon" href="([^"]+)"`).FindSubmatch(index)
	if m == nil {
		t.Fatal("index.html links no icon")
	}
	b, err := fs.ReadFile(Files, string(m[1]))
	if err != nil || !strings.HasPrefix(string(b), "<svg ") {
		t.Fatalf("the icon %s: %v %.40q", m[1], err, b)
	}
}
