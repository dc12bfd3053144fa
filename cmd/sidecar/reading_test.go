package main

import (
	"path"
	"regexp"
	"strings"
	"testing"
)

// TestReadingPathNamesRealFunctions: every function docs/READING.md lists
// (a backquoted name in a table row's first cell, outside parentheses) is
// declared in the file of that row's second cell: "Type.Method" as a method
// of Type, "pkg.Func" (pkg the file's package folder) or "Func" as a
// function. When it fails, a function moved or was renamed: correct the
// row, in the order the request runs.
func TestReadingPathNamesRealFunctions(t *testing.T) {
	doc := repoFile(t, "docs/READING.md")
	row := regexp.MustCompile("^\\| (.+) \\| `([^`]+\\.go)` \\|$")
	name := regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_.]*)`")
	paren := regexp.MustCompile(`\([^)]*\)`)
	rows, names := 0, 0
	for line := range strings.SplitSeq(doc, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		rows++
		file := m[2]
		src := repoFile(t, file)
		for _, n := range name.FindAllStringSubmatch(paren.ReplaceAllString(m[1], ""), -1) {
			names++
			if !declares(src, path.Base(path.Dir(file)), n[1]) {
				t.Errorf("docs/READING.md: %s is not declared in %s", n[1], file)
			}
		}
	}
	if rows < 40 || names < 80 {
		t.Fatalf("docs/READING.md: read %d rows naming %d functions; its tables changed shape (want | `names` | `file.go` | rows)", rows, names)
	}
}

// declares reports whether the Go source src (of package folder pkg)
// declares name: "Type.Method", "pkg.Func" or "Func".
func declares(src, pkg, name string) bool {
	typ, fn, qualified := strings.Cut(name, ".")
	if !qualified {
		fn, typ = typ, ""
	}
	funcRE := regexp.MustCompile(`(?m)^func ` + regexp.QuoteMeta(fn) + `[\[(]`)
	if typ == "" || typ == pkg {
		if funcRE.MatchString(src) {
			return true
		}
		if typ == pkg {
			return false
		}
	}
	method := regexp.MustCompile(`(?m)^func \(\w+ \*?` + regexp.QuoteMeta(typ) + `(\[[^\]]*\])?\) ` + regexp.QuoteMeta(fn) + `[\[(]`)
	return method.MatchString(src)
}
