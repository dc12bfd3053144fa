// Package ui holds the operator console's page: plain HTML, CSS and
// JavaScript with no build step and nothing fetched from elsewhere at run
// time, embedded in the binary. Package admin serves Files at /ui/ of the
// admin listener when the sidecar runs with an admin token, and the page
// talks to admin's API under /admin/v1 with that token.
//
// app.js builds every element with textContent (memories hold text users
// and models wrote: nothing of theirs becomes markup), and plot.js draws
// the time series as inline SVG. The page works under the strict
// Content-Security-Policy admin sends (no inline script or style).
package ui

import "embed"

// Files are the console's files: index.html, app.css, app.js, plot.js and
// favicon.svg (the page links it, so the browser asks for no /favicon.ico).
//
//go:embed index.html app.css app.js plot.js favicon.svg
var Files embed.FS
