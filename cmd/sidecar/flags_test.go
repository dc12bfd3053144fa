package main

import "testing"

func TestParseByteSize(t *testing.T) {
	f := func(in string, want int64, ok bool) {
		t.Helper()
		got, err := parseByteSize(in)
		if (err == nil) != ok || ok && got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d, ok %v", in, got, err, want, ok)
		}
	}
	f("268435456", 256<<20, true)
	f("256MiB", 256<<20, true)
	f("256 mib", 256<<20, true)
	f("1GiB", 1<<30, true)
	f("64KiB", 64<<10, true)
	f("2GB", 2e9, true)
	f("500kb", 500e3, true)
	f("-1", -1, true)
	f("12b", 12, true)
	f("", 0, false)
	f("MiB", 0, false)
	f("1.5GiB", 0, false)
	f("9999999TiB", 0, false)
}
