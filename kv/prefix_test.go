package kv

import "testing"

func TestPrefixQuery(t *testing.T) {
	a := PrefixQuery("m", []int32{1, 2, 3})
	if a != PrefixQuery("m", []int32{1, 2, 3}) {
		t.Fatal("not stable")
	}
	for _, other := range []string{PrefixQuery("m", []int32{1, 2}), PrefixQuery("m2", []int32{1, 2, 3}), PrefixQuery("m", []int32{1, 2, 4}), PrefixQuery("m", nil)} {
		if other == a {
			t.Fatalf("collision with %s", other)
		}
	}
}
