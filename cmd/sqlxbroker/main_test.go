package main

import (
	"database/sql"
	"slices"
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
)

// TestDrivers: the drivers the commands offer are the dialects this binary
// can open, each with its database/sql driver linked, and no dialect it
// cannot (pgx, whose driver it does not link).
func TestDrivers(t *testing.T) {
	got := strings.Split(drivers(), ", ")
	for _, want := range []string{"mysql", "postgres", "sqlite"} {
		if !slices.Contains(got, want) {
			t.Errorf("drivers() = %v, want %s among them", got, want)
		}
	}
	for _, d := range sqlxbroker.Dialects() {
		linked := slices.Contains(sql.Drivers(), d)
		if offered := slices.Contains(got, d); offered != linked {
			t.Errorf("dialect %q: offered %v, its driver linked %v", d, offered, linked)
		}
	}
	if slices.Contains(got, "pgx") {
		t.Errorf("drivers() = %v offers pgx, whose driver this binary does not link", got)
	}
}
