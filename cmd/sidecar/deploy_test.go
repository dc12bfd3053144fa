package main

// Tests of deploy/ (issue 24, alerts): the Prometheus rules and the
// Grafana dashboard name only series that a live sidecar's /metrics
// exposes, with label values it writes; the console judges the same
// alerts; promtool checks the rules, runs their unit tests
// (kvsidecar.rules.test.yml), parses the dashboard's queries and lints a
// live /metrics. Without promtool the promtool test skips, or fails under
// KVSIDECAR_REQUIRE_PROMTOOL=1 (as .ci/run sets; Debian's prometheus
// package has it).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	deployRules     = filepath.Join("..", "..", "deploy", "prometheus", "kvsidecar.rules.yml")
	deployRuleTests = filepath.Join("..", "..", "deploy", "prometheus", "kvsidecar.rules.test.yml")
	deployDashboard = filepath.Join("..", "..", "deploy", "grafana", "kvsidecar.json")
)

// promtoolPath finds promtool, or skips (fails under
// KVSIDECAR_REQUIRE_PROMTOOL=1).
func promtoolPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KVSIDECAR_PROMTOOL"); p != "" {
		return p
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	msg := "no promtool found (apt-get install prometheus, or set KVSIDECAR_PROMTOOL)"
	if os.Getenv("KVSIDECAR_REQUIRE_PROMTOOL") == "1" {
		t.Fatal(msg + "; KVSIDECAR_REQUIRE_PROMTOOL=1")
	}
	t.Skip(msg)
	return ""
}

// ruleFile is what the tests read of a rules file: each rule's alert (or
// record) name and expression.
type ruleFile struct {
	names, exprs []string
}

// readRules reads the rules file's names and expressions. It understands
// the YAML the file is written in: `expr:` with the expression on the same
// line (plain or quoted) or as a block scalar (|, >, with - or +) on the
// lines indented below it. A rule it cannot read fails the test.
func readRules(t *testing.T, path string) ruleFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	lines := strings.Split(string(b), "\n")
	indent := func(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }
	key := regexp.MustCompile(`^\s*(?:- )?(alert|record|expr):\s*(.*?)\s*$`)
	for i := 0; i < len(lines); i++ {
		m := key.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		v := m[2]
		if m[1] != "expr" {
			rf.names = append(rf.names, strings.Trim(v, `'"`))
			continue
		}
		switch {
		case v == "":
			t.Fatalf("%s:%d: an expr the test cannot read", path, i+1)
		case strings.ContainsAny(v[:1], "|>"):
			var block []string
			base := indent(lines[i])
			for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || indent(lines[i+1]) > base) {
				i++
				block = append(block, strings.TrimSpace(lines[i]))
			}
			v = strings.TrimSpace(strings.Join(block, " "))
		case v[0] == '\'':
			v = strings.ReplaceAll(strings.TrimSuffix(v[1:], "'"), "''", "'")
		case v[0] == '"':
			if err := json.Unmarshal([]byte(v), &v); err != nil {
				t.Fatalf("%s:%d: %v", path, i+1, err)
			}
		}
		rf.exprs = append(rf.exprs, v)
	}
	if len(rf.names) == 0 || len(rf.names) != len(rf.exprs) {
		t.Fatalf("%s: %d rule names and %d expressions", path, len(rf.names), len(rf.exprs))
	}
	return rf
}

// dashboardQueries returns every PromQL query of the Grafana dashboard:
// its panels' targets and its variables' label_values(metric, label).
func dashboardQueries(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string
		Title  string
		Panels []struct {
			ID         int
			Type       string
			Title      string
			Datasource *struct{ UID string }
			Targets    []struct {
				Expr  string
				RefID string `json:"refId"`
			}
		}
		Templating struct {
			List []struct {
				Name, Type string
				Definition string
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: no uid, title or panels", path)
	}
	var out []string
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Fatalf("%s: panel id %d twice", path, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Fatalf("%s: panel %q has no targets or does not query the dashboard's datasource variable", path, p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Fatalf("%s: panel %q target %s has no expression", path, p.Title, tg.RefID)
			}
			out = append(out, tg.Expr)
		}
	}
	lv := regexp.MustCompile(`^label_values\(\s*([^,]+?)\s*,\s*\w+\s*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := lv.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Fatalf("%s: variable %s: want label_values(metric, label), got %q", path, v.Name, v.Definition)
		}
		out = append(out, m[1])
	}
	return out
}

// selector is one series selector of a PromQL expression.
type selector struct {
	name     string
	matchers []matcher
}

type matcher struct{ label, op, value string }

// promqlWords are the identifiers of PromQL that are not metric names
// (aggregations followed by by/without, keywords, binary operators).
var promqlWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true,
}

var matcherRE = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?`)

// selectors lexes a PromQL expression far enough to find its series
// selectors: identifiers that are not functions (followed by "("), not
// PromQL words and not label lists of by/without/on/ignoring/group_*, with
// their {label matchers}; strings, ranges and numbers are skipped.
func selectors(expr string) ([]selector, error) {
	var out []selector
	isStart := func(c byte) bool { return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || '0' <= c && c <= '9' }
	skipSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n') {
			i++
		}
		return i
	}
	// matchers reads a {…} starting at i; it returns them and the index
	// after the closing brace.
	readMatchers := func(i int) ([]matcher, int, error) {
		var ms []matcher
		i++ // {
		for {
			i = skipSpace(i)
			if i >= len(expr) {
				return nil, i, fmt.Errorf("unclosed { in %q", expr)
			}
			if expr[i] == '}' {
				return ms, i + 1, nil
			}
			m := matcherRE.FindStringSubmatch(expr[i:])
			if m == nil {
				return nil, i, fmt.Errorf("bad label matcher at %q", expr[i:])
			}
			ms = append(ms, matcher{m[1], m[2], m[3]})
			i += len(m[0])
		}
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' {
					j++
				}
				j++
			}
			i = j + 1
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unclosed [ in %q", expr)
			}
			i += j + 1
		case c == '{':
			ms, j, err := readMatchers(i)
			if err != nil {
				return nil, err
			}
			out = append(out, selector{matchers: ms}) // a selector without a name
			i = j
		case '0' <= c && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.') {
				i++
			}
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := skipSpace(j)
			switch {
			case word == "by" || word == "without" || word == "on" || word == "ignoring" || word == "group_left" || word == "group_right":
				if k < len(expr) && expr[k] == '(' { // a label list
					e := strings.IndexByte(expr[k:], ')')
					if e < 0 {
						return nil, fmt.Errorf("unclosed ( in %q", expr)
					}
					k += e + 1
				}
				i = k
			case promqlWords[word] || (k < len(expr) && expr[k] == '('):
				i = j // a function, aggregation or keyword
			default:
				s := selector{name: word}
				if k < len(expr) && expr[k] == '{' {
					ms, e, err := readMatchers(k)
					if err != nil {
						return nil, err
					}
					s.matchers, k = ms, e
				}
				out = append(out, s)
				i = k
			}
		default:
			i++
		}
	}
	return out, nil
}

// TestSelectors: the lexer finds the selectors of the kinds of
// expression the rules and the dashboard use, and nothing else.
func TestSelectors(t *testing.T) {
	got, err := selectors(`histogram_quantile(0.95, sum without (recall) (rate(x_bucket{recall=~"full|reuse", instance=~"$i"}[5m]))) > 0.5
		and on(instance) 1 - (a{tier="archive"} / ignoring(tier) (b > 0)) < 0.85 or sum by (le) (c) unless d offset 5m`)
	if err != nil {
		t.Fatal(err)
	}
	want := []selector{
		{"x_bucket", []matcher{{"recall", "=~", "full|reuse"}, {"instance", "=~", "$i"}}},
		{"a", []matcher{{"tier", "=", "archive"}}}, {"b", nil}, {"c", nil}, {"d", nil},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("selectors\n got %v\nwant %v", got, want)
	}
	if _, err := selectors(`a{tier="x"`); err == nil {
		t.Fatal("an unclosed selector lexed")
	}
}

// liveSeries is one sample line of /metrics.
type liveSeries struct {
	name   string
	labels map[string]string
}

var sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? [^ ]+$`)

// scrapeSeries reads a /metrics page into its series.
func scrapeSeries(t *testing.T, body []byte) []liveSeries {
	t.Helper()
	var out []liveSeries
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		m := sampleRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("/metrics line %q is not a sample", line)
		}
		s := liveSeries{name: m[1], labels: map[string]string{}}
		for rest := m[2]; rest != ""; {
			lm := matcherRE.FindStringSubmatch(rest)
			if lm == nil || lm[2] != "=" {
				t.Fatalf("/metrics line %q: bad labels", line)
			}
			s.labels[lm[1]] = lm[3]
			rest = rest[len(lm[0]):]
		}
		out = append(out, s)
	}
	return out
}

// targetLabels are added by Prometheus when it scrapes; the rules and the
// dashboard may match on them freely.
var targetLabels = map[string]bool{"instance": true, "job": true}

// matches reports whether a live series satisfies the selector, matchers
// on target labels aside.
func (s selector) matches(x liveSeries) (bool, error) {
	if s.name != "" && s.name != x.name {
		return false, nil
	}
	for _, m := range s.matchers {
		if m.label == "__name__" {
			if m.op != "=" {
				return false, fmt.Errorf("a __name__ matcher other than = is not checked")
			}
			if m.value != x.name {
				return false, nil
			}
			continue
		}
		if targetLabels[m.label] {
			continue
		}
		v := x.labels[m.label]
		switch m.op {
		case "=":
			if v != m.value {
				return false, nil
			}
		case "!=":
			if v == m.value {
				return false, nil
			}
		default:
			re, err := regexp.Compile("^(?:" + m.value + ")$")
			if err != nil {
				return false, err
			}
			if re.MatchString(v) != (m.op == "=~") {
				return false, nil
			}
		}
	}
	return true, nil
}

// TestDeployMatchesLiveMetrics: every series selector of the alert rules
// and of the dashboard matches a series of a live sidecar's /metrics
// (started as the binary, against a scripted upstream, after a chat
// turn); each regexp alternative of a label counts on its own, so a
// misspelt value does not hide behind a right one. The console judges the
// same alerts as the rules file.
func TestDeployMatchesLiveMetrics(t *testing.T) {
	up := newScriptedUpstream(t)
	sc := startChild(t, nil, "--upstream", up.URL, "--admin-token", consoleToken)
	req, _ := http.NewRequest("POST", "http://"+sc.addr+"/v1/chat/completions",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hello there"}]}`))
	req.Header.Set("Authorization", "Bearer sk-deploy")
	req.Header.Set("X-Session-ID", "deploy-1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("chat: %d", resp.StatusCode)
	}
	body := getMetrics(t, sc.admin)
	live := scrapeSeries(t, body)

	rules := readRules(t, deployRules)
	type query struct{ where, expr string }
	var qs []query
	for i, e := range rules.exprs {
		qs = append(qs, query{"rule " + rules.names[i], e})
	}
	for _, e := range dashboardQueries(t, deployDashboard) {
		qs = append(qs, query{"dashboard", e})
	}
	checked := map[string]bool{}
	for _, q := range qs {
		sels, err := selectors(q.expr)
		if err != nil {
			t.Fatalf("%s: %v", q.where, err)
		}
		if len(sels) == 0 {
			t.Fatalf("%s: no series in %q", q.where, q.expr)
		}
		for _, s := range sels {
			// One check per alternative of each regexp matcher.
			variants := []selector{s}
			for i, m := range s.matchers {
				if m.op != "=~" || targetLabels[m.label] || !regexp.MustCompile(`^[a-zA-Z0-9_.+|]+$`).MatchString(m.value) {
					continue
				}
				var next []selector
				for _, v := range variants {
					for _, alt := range strings.Split(m.value, "|") {
						c := selector{name: v.name, matchers: slices.Clone(v.matchers)}
						c.matchers[i] = matcher{m.label, "=", alt}
						next = append(next, c)
					}
				}
				variants = next
			}
			for _, v := range variants {
				found := false
				for _, x := range live {
					ok, err := v.matches(x)
					if err != nil {
						t.Fatalf("%s: %v", q.where, err)
					}
					if ok {
						found = true
						break
					}
				}
				if !found {
					t.Errorf("%s: no series of a live /metrics matches %s%v (in %q)", q.where, v.name, v.matchers, q.expr)
				}
				checked[v.name] = true
			}
		}
	}
	t.Logf("%d queries, %d metric names checked against %d live series", len(qs), len(checked), len(live))

	// The console marks the same thresholds the rules alert on.
	var kv struct {
		Thresholds []struct{ Alert string }
	}
	adminGet(t, sc.admin, "kv", &kv)
	var console []string
	for _, th := range kv.Thresholds {
		console = append(console, th.Alert)
	}
	slices.Sort(console)
	alerts := slices.Clone(rules.names)
	slices.Sort(alerts)
	if !slices.Equal(console, alerts) {
		t.Fatalf("the console judges %v, the rules alert on %v", console, alerts)
	}
}

func getMetrics(t *testing.T, addr string) []byte {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return b
}

// TestDeployPromtool: promtool accepts the rules file, its unit tests pass
// (each alert fires for a breaching series once its `for` passed, and not
// for one on the right side), the dashboard's queries parse (checked as
// recording rules), and a live /metrics passes `promtool check metrics`.
func TestDeployPromtool(t *testing.T) {
	promtool := promtoolPath(t)
	run := func(stdin []byte, args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(nil, "check", "rules", deployRules)
	run(nil, "test", "rules", deployRuleTests)

	var rec strings.Builder
	rec.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range dashboardQueries(t, deployDashboard) {
		q = strings.NewReplacer("$instance", ".*", "${instance}", ".*").Replace(q)
		b, _ := json.Marshal(q)
		fmt.Fprintf(&rec, "      - record: kvsidecar:dashboard_query_%d\n        expr: %s\n", i, b)
	}
	path := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(path, []byte(rec.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	run(nil, "check", "rules", path)

	up := newScriptedUpstream(t)
	sc := startChild(t, nil, "--upstream", up.URL)
	run(getMetrics(t, sc.admin), "check", "metrics")
}
