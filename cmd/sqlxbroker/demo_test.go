package main

import (
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
)

// TestDemo runs the demo on SQLite (no flags but the size) and, through
// --driver and --dsn, on PostgreSQL and MariaDB; it fails unless every
// message is completed or kept dead, and bad flags are refused by name.
func TestDemo(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		testreport.Tested(t, "SQLite", "a file in a temporary directory")
		if err := demo([]string{"--messages", "600", "--dir", t.TempDir()}); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range []struct {
		driver string
		db     provision.Database
	}{{"postgres", provision.Postgres}, {"mysql", provision.MariaDB}} {
		t.Run(c.driver, func(t *testing.T) {
			dsn := c.db.Get(t)
			if err := demo([]string{"--driver", c.driver, "--dsn", dsn, "--messages", "600"}); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--driver", "mysql"}, "--driver mysql needs --dsn"},
		{[]string{"--driver", "nope", "--dsn", "x"}, `unknown dialect "nope"`},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		if err := demo(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("demo %q: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
