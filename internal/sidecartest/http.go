package sidecartest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// NoPoolClient never reuses connections, so each test request stands
// alone; it asks for no compression either.
var NoPoolClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}

// Post sends body to url as JSON with the headers of hdr through
// NoPoolClient and returns the response with its whole body read.
func Post(t testing.TB, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	return PostWith(t, NoPoolClient, url, body, hdr)
}

// PostWith is Post through c.
func PostWith(t testing.TB, c *http.Client, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	for k, v := range hdr {
		h[k] = v
	}
	return Do(t, c, http.MethodPost, url, body, h)
}

// Do sends a method request with body and the headers of hdr (no others)
// through c and returns the response with its whole body read.
func Do(t testing.TB, c *http.Client, method, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, b
}

// GetJSON gets url through NoPoolClient with key as the bearer token,
// decodes a 200's body into v (when v is not nil) and returns the status.
func GetJSON(t testing.TB, url, key string, v any) int {
	t.Helper()
	resp, b := Do(t, NoPoolClient, http.MethodGet, url, "", map[string]string{"Authorization": "Bearer " + key})
	if v != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v in %s", url, err, b)
		}
	}
	return resp.StatusCode
}

// WantOpenAIError checks that resp has status and that its body b is an
// OpenAI error envelope with code, a message and a type, sent as JSON.
func WantOpenAIError(t testing.TB, resp *http.Response, b []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d (body %s)", resp.StatusCode, status, b)
	}
	var e struct {
		Error struct {
			Message, Type, Code string
		}
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body is not JSON: %q", b)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code != code {
		t.Fatalf("error = %+v, want code %q and a message", e.Error, code)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type = %q", ct)
	}
}

// Eventually polls cond every 5 ms for up to 10 s and fails the test if
// it never holds: for what lands in the background after a response,
// with no hook to wait on (package memory's background work).
func Eventually(t testing.TB, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}
