package main

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// envName maps a flag name to its environment variable: upstream-timeout ->
// SIDECAR_UPSTREAM_TIMEOUT.
func envName(flagName string) string {
	return "SIDECAR_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags parses args into fs after filling every flag not given on the
// command line from its environment variable. This is the one place the
// sidecar reads SIDECAR_* variables.
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	fs.VisitAll(func(f *flag.Flag) {
		f.Usage += fmt.Sprintf(" (env %s)", envName(f.Name))
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, e)
			}
		}
	})
	return err
}

// byteSize is a flag of bytes: a plain integer, or a number with a unit
// (KiB, MiB, GiB, TiB, or KB, MB, GB, TB; case-insensitive), e.g. 256MiB.
type byteSize int64

func (b *byteSize) String() string { return fmt.Sprint(int64(*b)) }

func (b *byteSize) Set(v string) error {
	n, err := parseByteSize(v)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// parseByteSize parses a byteSize's text.
func parseByteSize(v string) (int64, error) {
	s := strings.TrimSpace(v)
	mult := int64(1)
	lower := strings.ToLower(s)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"b", 1}} {
		if strings.HasSuffix(lower, u.suffix) {
			s, mult = strings.TrimSpace(s[:len(s)-len(u.suffix)]), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want bytes, e.g. 268435456 or 256MiB", v)
	}
	if n > math.MaxInt64/mult || n < math.MinInt64/mult {
		return 0, fmt.Errorf("size %q: too large", v)
	}
	return n * mult, nil
}
