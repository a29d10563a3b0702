// Package core holds the contracts behind sqlxbroker, for dialect authors
// and the claim forms: Dialect and its optional capabilities (dialect.go),
// the Pool a dialect keeps its per-pool state in, the compiled table Plan,
// and the ClaimForm contract the engine drives (form.go). Applications use
// package sqlxbroker; nothing here branches on a dialect's name.
package core
