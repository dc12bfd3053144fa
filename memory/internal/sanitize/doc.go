// Package sanitize makes text from models, operators and clients safe for
// package memory to store and to show a model: valid UTF-8, no control,
// format (zero-width, bidi override) or line-separator characters, bounded
// in bytes and cut on rune boundaries. Pure functions, no state.
package sanitize
