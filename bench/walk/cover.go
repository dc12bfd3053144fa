package main

import (
	"go/token"
	"path/filepath"

	"golang.org/x/tools/cover"
	"golang.org/x/tools/go/ssa"
)

// coverage is what a Go coverage profile says ran: its blocks by file, the
// file named as the profile names it (import path + "/" + file name), so
// a profile taken in one checkout reads against another of the same
// module.
type coverage struct {
	fset   *token.FileSet
	blocks map[string][]cover.ProfileBlock
}

func readCoverage(file string, fset *token.FileSet) (*coverage, error) {
	profiles, err := cover.ParseProfiles(file) // duplicate blocks merged: covered if any run covered them
	if err != nil {
		return nil, err
	}
	c := &coverage{fset: fset, blocks: map[string][]cover.ProfileBlock{}}
	for _, p := range profiles {
		c.blocks[p.FileName] = p.Blocks
	}
	return c, nil
}

// key is pos's file as the profile names it: f's package path and the
// file's name.
func (c *coverage) key(f *ssa.Function, pos token.Position) string {
	return f.Pkg.Pkg.Path() + "/" + filepath.Base(pos.Filename)
}

// ran reports whether f has a covered block within its source (a
// closure's body counts for the closure and for the function around it,
// which ran to make it). A function without syntax of its own (a
// synthetic wrapper) is taken as run: it has no blocks to tell. A file
// the profile does not name was not built into the run: nothing in it ran.
func (c *coverage) ran(f *ssa.Function) bool {
	syn := f.Syntax()
	if syn == nil || f.Pkg == nil {
		return true
	}
	start, end := c.fset.Position(syn.Pos()), c.fset.Position(syn.End())
	for _, b := range c.blocks[c.key(f, start)] {
		if b.Count > 0 && !before(b.StartLine, b.StartCol, start) && !after(b.EndLine, b.EndCol, end) {
			return true
		}
	}
	return false
}

// siteRan reports whether the call at pos in f ran: the innermost block
// holding pos is covered. A position no block holds (an implicit call, a
// switch case's expression, an else-if's condition: the cover tool counts
// no block there) is taken as run when f ran.
func (c *coverage) siteRan(f *ssa.Function, pos token.Pos) bool {
	if !pos.IsValid() || f.Pkg == nil {
		return true
	}
	p := c.fset.Position(pos)
	blocks := c.blocks[c.key(f, p)]
	inner := -1
	for i, b := range blocks {
		if after(b.StartLine, b.StartCol, p) || !after(b.EndLine, b.EndCol, p) {
			continue // pos is not in [start, end)
		}
		// Blocks that hold pos nest (a statement holding a closure holds
		// the closure's blocks): the one starting last is the innermost.
		if inner < 0 || startsAfter(b, blocks[inner]) {
			inner = i
		}
	}
	if inner < 0 {
		return true
	}
	return blocks[inner].Count > 0
}

// before reports whether line.col comes before p, after whether it comes
// after p: by line, then column.
func before(line, col int, p token.Position) bool {
	return line < p.Line || line == p.Line && col < p.Column
}

func after(line, col int, p token.Position) bool {
	return line > p.Line || line == p.Line && col > p.Column
}

func startsAfter(a, b cover.ProfileBlock) bool {
	return a.StartLine > b.StartLine || a.StartLine == b.StartLine && a.StartCol > b.StartCol
}
