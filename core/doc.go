// Package core holds the contracts of sqlxbroker: the table description, the
// Dialect interface and its optional capabilities, the ClaimForm interface
// the three claim forms implement, deliveries, errors, and the subscription
// engine that drives a claim form.
//
// A dialect speaks one database family's SQL; a claim form is written once
// against the dialect contract; the engine is written once against the claim
// form contract. Nothing in this package branches on a dialect's name.
package core
