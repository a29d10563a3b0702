// Package fuzz holds the fuzz targets of what a table description lets
// reach SQL, run with the built-in dialects; it has no code of its own.
package fuzz
