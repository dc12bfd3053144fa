// Command walk measures how a request walks through kvsidecar's code: from
// an entry function it follows the calls, in source order, depth first,
// through the module's own packages, and counts what a reader following
// the code meets.
//
// Method (the same before and after a change, so the figures compare):
//
//   - The program is the module's non-test packages in SSA form
//     (golang.org/x/tools/go/ssa). Callees come from VTA
//     (golang.org/x/tools/go/callgraph/vta, seeded with CHA): a call
//     through an interface or a function value (a field set at Open, a
//     callback) goes to the functions that can flow there.
//   - From the entry, each function's calls are taken in source order; a
//     function is expanded the first time it is reached (a stop) and
//     passed over after. Calls to functions outside the module are not
//     followed, but a module function or closure passed to one (a
//     sync.Once.Do, a sort's less) is visited there. `go` statements
//     start other goroutines and are not followed; synthetic wrappers
//     are transparent.
//   - Only the packages named by -expand (proxy and memory, with memory's
//     internal packages, by default: the request's own path) are followed
//     inside; a call into another module package (engine, index, tiers,
//     the foundations) is one stop, not followed. A dynamic call with more
//     than -maxcands module callees (an interface with several
//     implementations) is not followed: a reader cannot tell which runs.
//   - stops: functions reached; files: the distinct files they live in;
//     returns: each time the walk, calling or returning, enters a file it
//     had been in before and left; file entries: files + returns, every
//     time the walk enters a file (issue 37's figures, 95 stops, 39 files,
//     56 returns, satisfy stops = files + returns: its stops were file
//     entries); visits per file: how often the walk entered it;
//     climbs: calls whose callee's package imports (directly or not) the
//     caller's package, i.e. a lower package calling back up.
//
// Statically the walk meets every path, cold ones included. With -cover
// (a Go coverage profile of a run that served one request, taken with
// -coverpkg over the module) it meets what that run executed:
//
//   - a call is followed only into a function with at least one covered
//     block within its source (fn.Syntax()'s Pos..End against the
//     profile's file:line.col blocks); a dynamic call's candidates are
//     filtered before -maxcands counts them, so an interface call with
//     one implementation that ran is followed there;
//   - with -sites as well, only from a call site whose innermost block is
//     covered: a cold branch's call into a function that ran elsewhere is
//     not followed. A site no block holds (a case expression, an else-if's
//     condition) counts as run when its function ran.
//
// Everything else is as above. A profile counts all goroutines of the run
// (the store's background workers, the test's set-up): a function they
// ran counts as run; -sites keeps most of that off the walk.
//
// With -pairs N it also lists the N file pairs the walk crosses most
// (caller's file -> callee's file, each call that expands a function, with
// the callees): where the file entries come from.
//
// Usage: go run . -dir ../.. -entry '(*github.com/kvsidecar/kvsidecar/proxy.Server).forward' [-v] [-cover FILE [-sites]] [-pairs N]
// (scripts/walk.sh takes the profile of proxy's TestWalkOneChatTurn and
// walks it from forward and handle).
package main

import (
	"flag"
	"fmt"
	"go/token"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/tools/go/callgraph/cha"
	"golang.org/x/tools/go/callgraph/vta"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

func main() {
	dir := flag.String("dir", ".", "the module's root")
	entry := flag.String("entry", "(*github.com/kvsidecar/kvsidecar/proxy.Server).forward", "the function to start from")
	verbose := flag.Bool("v", false, "print the walk")
	expandFlag := flag.String("expand", "proxy,memory", "comma-separated package paths (relative to the module) whose functions are followed; a call into another module package is a stop not followed")
	maxCands := flag.Int("maxcands", 1, "a dynamic call with more module callees than this is not followed (a reader cannot tell which runs)")
	coverFile := flag.String("cover", "", "a Go coverage profile: follow calls only into functions with a covered block (what a run executed)")
	onlyRunSites := flag.Bool("sites", false, "with -cover: follow calls only from call sites in a covered block")
	pairsN := flag.Int("pairs", 0, "also print the N file pairs the walk crosses most (caller's file -> callee's file, each call that expands a function): where the entries come from")
	flag.Parse()
	if *onlyRunSites && *coverFile == "" {
		log.Fatal("-sites needs -cover")
	}

	cfg := &packages.Config{Mode: packages.LoadAllSyntax | packages.NeedModule, Dir: *dir}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		log.Fatal(err)
	}
	if packages.PrintErrors(pkgs) > 0 {
		os.Exit(1)
	}
	module := pkgs[0].Module.Path
	prog, _ := ssautil.AllPackages(pkgs, ssa.InstantiateGenerics)
	prog.Build()
	var cov *coverage
	if *coverFile != "" {
		if cov, err = readCoverage(*coverFile, prog.Fset); err != nil {
			log.Fatal(err)
		}
	}
	ran := func(f *ssa.Function) bool {
		if cov == nil {
			return true
		}
		if o := f.Origin(); o != nil {
			f = o
		}
		return cov.ran(f)
	}
	all := ssautil.AllFunctions(prog)
	cg := vta.CallGraph(all, cha.CallGraph(prog))
	cg.DeleteSyntheticNodes()

	// imports[p] holds every module package p imports, directly or not.
	imports := map[string]map[string]bool{}
	var walkImports func(p *packages.Package, into map[string]bool)
	walkImports = func(p *packages.Package, into map[string]bool) {
		for path, q := range p.Imports {
			if strings.HasPrefix(path, module) && !into[path] {
				into[path] = true
				walkImports(q, into)
			}
		}
	}
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		if strings.HasPrefix(p.PkgPath, module) {
			m := map[string]bool{}
			walkImports(p, m)
			imports[p.PkgPath] = m
		}
	})

	var start *ssa.Function
	for f := range all {
		if f.String() == *entry {
			start = f
		}
	}
	if start == nil {
		log.Fatalf("no function %s", *entry)
	}
	inModule := func(f *ssa.Function) bool {
		return f != nil && f.Pkg != nil && strings.HasPrefix(f.Pkg.Pkg.Path(), module)
	}
	fileOf := func(f *ssa.Function) string {
		p := prog.Fset.Position(f.Pos())
		if !p.IsValid() && f.Parent() != nil {
			p = prog.Fset.Position(f.Parent().Pos())
		}
		abs, _ := filepath.Abs(*dir)
		rel, err := filepath.Rel(abs, p.Filename)
		if err != nil {
			return p.Filename
		}
		return rel
	}
	pkgOf := func(f *ssa.Function) string { return f.Pkg.Pkg.Path() }
	expandable := func(f *ssa.Function) bool {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkgOf(f), module), "/")
		for _, e := range strings.Split(*expandFlag, ",") {
			if rel == e || strings.HasPrefix(rel, e+"/") {
				return true
			}
		}
		return false
	}

	expanded := map[*ssa.Function]bool{}
	seenFile := map[string]bool{}
	visits := map[string]int{}
	var stops, expandedStops, returns, climbs int
	var climbList []string
	type pair struct{ from, to string }
	crossings := map[pair][]string{} // the callees of each file pair's crossings
	cur := ""
	enter := func(file string) {
		if file == cur {
			return
		}
		if seenFile[file] {
			returns++
		}
		seenFile[file] = true
		visits[file]++
		cur = file
	}
	var walk func(f *ssa.Function, depth int)
	call := func(from, to *ssa.Function, depth int) {
		if !inModule(to) {
			return
		}
		if o := to.Origin(); o != nil {
			to = o
		}
		if imports[pkgOf(to)][pkgOf(from)] {
			climbs++
			climbList = append(climbList, fmt.Sprintf("%s -> %s", from, to))
		}
		back := cur
		if !expanded[to] && fileOf(to) != back {
			p := pair{back, fileOf(to)}
			crossings[p] = append(crossings[p], to.Name())
		}
		walk(to, depth)
		enter(back)
	}
	walk = func(f *ssa.Function, depth int) {
		if expanded[f] {
			if *verbose {
				fmt.Printf("%s(%s again)\n", strings.Repeat("  ", depth), f)
			}
			return
		}
		expanded[f] = true
		stops++
		enter(fileOf(f))
		if *verbose {
			fmt.Printf("%s%s  [%s]\n", strings.Repeat("  ", depth), f, fileOf(f))
		}
		if !expandable(f) {
			return
		}
		expandedStops++
		type site struct {
			pos     token.Pos
			callees []*ssa.Function
		}
		var sites []site
		node := cg.Nodes[f]
		byInstr := map[ssa.CallInstruction][]*ssa.Function{}
		if node != nil {
			for _, e := range node.Out {
				byInstr[e.Site] = append(byInstr[e.Site], e.Callee.Func)
			}
		}
		for _, b := range f.Blocks {
			for _, in := range b.Instrs {
				ci, ok := in.(ssa.CallInstruction)
				if !ok {
					continue
				}
				if _, isGo := in.(*ssa.Go); isGo {
					continue
				}
				if *onlyRunSites && !cov.siteRan(f, ci.Pos()) {
					continue
				}
				cs := slices.Clone(byInstr[ci])
				if sc := ci.Common().StaticCallee(); sc != nil && !slices.Contains(cs, sc) {
					cs = append(cs, sc)
				}
				var mod []*ssa.Function
				outside := false
				for _, c := range cs {
					if inModule(c) {
						if ran(c) {
							mod = append(mod, c)
						}
					} else {
						outside = true
					}
				}
				if outside || len(cs) == 0 {
					// Module functions handed to code outside the module run there.
					for _, a := range ci.Common().Args {
						switch v := a.(type) {
						case *ssa.MakeClosure:
							if fn, ok := v.Fn.(*ssa.Function); ok && inModule(fn) && ran(fn) {
								mod = append(mod, fn)
							}
						case *ssa.Function:
							if inModule(v) && ran(v) {
								mod = append(mod, v)
							}
						}
					}
				}
				if len(mod) > *maxCands {
					continue
				}
				sort.Slice(mod, func(i, j int) bool { return mod[i].String() < mod[j].String() })
				sites = append(sites, site{ci.Pos(), mod})
			}
		}
		sort.SliceStable(sites, func(i, j int) bool { return sites[i].pos < sites[j].pos })
		for _, s := range sites {
			for _, c := range s.callees {
				call(f, c, depth+1)
			}
		}
	}
	walk(start, 0)

	fmt.Printf("entry: %s\n", *entry)
	if cov != nil {
		// How many of the module's functions the profile says ran: a
		// profile that matches nothing (another module, other files) shows
		// here as 0.
		var nran, n int
		for f := range all {
			if inModule(f) && f.Syntax() != nil && f.Origin() == nil {
				n++
				if cov.ran(f) {
					nran++
				}
			}
		}
		fmt.Printf("cover: %s (sites: %v; %d of the module's %d functions ran)\n", *coverFile, *onlyRunSites, nran, n)
	}
	fmt.Printf("stops: %d (%d in -expand's packages, followed inside)\nfiles: %d\nreturns to a file left: %d\nfile entries: %d (files + returns)\nclimbs back up: %d\n", stops, expandedStops, len(seenFile), returns, len(seenFile)+returns, climbs)
	type fv struct {
		f string
		n int
	}
	var fvs []fv
	for f, n := range visits {
		fvs = append(fvs, fv{f, n})
	}
	sort.Slice(fvs, func(i, j int) bool { return fvs[i].n > fvs[j].n || fvs[i].n == fvs[j].n && fvs[i].f < fvs[j].f })
	fmt.Println("most entered files:")
	for _, x := range fvs[:min(len(fvs), 12)] {
		fmt.Printf("  %3d  %s\n", x.n, x.f)
	}
	fmt.Println("climbs:")
	for _, c := range climbList {
		fmt.Println("  " + c)
	}
	if *pairsN > 0 {
		ps := make([]pair, 0, len(crossings))
		once, calls := 0, 0
		for p, cs := range crossings {
			ps = append(ps, p)
			calls += len(cs)
			if len(cs) == 1 {
				once++
			}
		}
		sort.Slice(ps, func(i, j int) bool {
			a, b := len(crossings[ps[i]]), len(crossings[ps[j]])
			return a > b || a == b && (ps[i].from < ps[j].from || ps[i].from == ps[j].from && ps[i].to < ps[j].to)
		})
		fmt.Printf("file crossings: %d calls into another file, %d file pairs (%d crossed once); most crossed:\n", calls, len(ps), once)
		for _, p := range ps[:min(len(ps), *pairsN)] {
			fmt.Printf("  %3d  %s -> %s: %s\n", len(crossings[p]), p.from, p.to, strings.Join(crossings[p], ", "))
		}
	}
}
