package main

import (
	"flag"
	"fmt"
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
