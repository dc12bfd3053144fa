//go:build linux

package main

import (
	"context"
	"time"
	"unsafe"

	"github.com/VictoriaMetrics/metrics"
	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/engine/generic"
	"github.com/kvsidecar/kvsidecar/internal/jsonscan"
)

// work is what the sidecar's pass-through does per request besides moving
// bytes, done in the loop with the sidecar's own code (-work): the body
// checked in one jsonscan pass with the fields routing reads (as
// proxy.parseRequest), the generic engine connector's hooks (Before, and
// After with the answer: its usage and timings read), and the request's
// metrics (a counter, the duration and time-to-first-byte histograms,
// bytes in and out), on one clock reading per wake-up of the loop. It
// measures what the design in docs/DESIGN.md ("The pass-through on an
// event loop of its own") budgets, not a proxy: one request at a time is
// in flight per connection, and the loop keeps one engine request.
type work struct {
	conn        *engine.Hooks
	req         engine.Request
	resp        engine.Response
	start       time.Time
	requests    *metrics.Counter
	duration    *metrics.PrometheusHistogram
	ttfb        *metrics.PrometheusHistogram
	in, out     *metrics.Counter
	bad, stream int
}

func newWork() *work {
	set := metrics.NewSet()
	return &work{
		conn:     engine.Wrap(generic.New(generic.Options{})),
		requests: set.NewCounter(`sidecar_http_requests_total{route="chat_completions",code="200"}`),
		duration: set.NewPrometheusHistogram(`sidecar_http_request_duration_seconds{route="chat_completions"}`),
		ttfb:     set.NewPrometheusHistogram(`sidecar_http_ttfb_seconds{route="chat_completions"}`),
		in:       set.NewCounter(`sidecar_http_request_bytes_total`),
		out:      set.NewCounter(`sidecar_http_response_bytes_total`),
	}
}

// before is the route and engine steps of one request.
func (w *work) before(body []byte, now time.Time) {
	w.start = now
	w.in.Add(len(body))
	var model, stream, key gjson.Result
	value := func(v []byte) gjson.Result { return gjson.Parse(unsafe.String(unsafe.SliceData(v), len(v))) }
	m := jsonscan.Members(body)
	for m.Next() {
		switch jsonscan.Name(m.Key()) {
		case "model":
			model = value(m.Value())
		case "stream":
			stream = value(m.Value())
		case "prompt_cache_key":
			key = value(m.Value())
		}
	}
	if !m.Valid() || key.Exists() {
		w.bad++ // the loop would hand this one to fasthttp
	}
	if stream.Bool() {
		w.stream++
	}
	w.req = engine.Request{Model: model.Str, Body: body, Start: now}
	_, _ = w.conn.Before(context.Background(), &w.req)
}

// after is the answer's accounting: the engine's after-hook and metrics.
func (w *work) after(status int, body []byte, now time.Time) {
	d := now.Sub(w.start).Seconds()
	w.ttfb.Update(d)
	w.out.Add(len(body))
	w.resp = engine.Response{Status: status, Body: body}
	w.conn.After(context.Background(), &w.req, &w.resp)
	w.requests.Inc()
	w.duration.Update(d)
	w.req, w.resp = engine.Request{}, engine.Response{}
}
