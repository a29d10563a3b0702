package provision_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
)

// fakeT records how Get ended the test.
type fakeT struct {
	ended, msg string
}

func (f *fakeT) Helper()                   {}
func (f *fakeT) Logf(string, ...any)       {}
func (f *fakeT) Cleanup(func())            {}
func (f *fakeT) Fatalf(s string, a ...any) { f.end("fatal", s, a) }
func (f *fakeT) Skipf(s string, a ...any)  { f.end("skip", s, a) }
func (f *fakeT) end(k, s string, a []any)  { f.ended, f.msg = k, fmt.Sprintf(s, a...); runtime.Goexit() }

func get(d provision.Database) *fakeT {
	f := &fakeT{}
	done := make(chan struct{})
	go func() { defer close(done); d.Get(f) }()
	<-done
	return f
}

func TestUnreachableEnvDSNFails(t *testing.T) {
	d := provision.Postgres
	d.Env = "SQLXBROKER_TEST_DEAD_DSN"
	t.Setenv(d.Env, "postgres://root@127.0.0.1:1/test?sslmode=disable&connect_timeout=1")
	f := get(d)
	if f.ended != "fatal" || !strings.Contains(f.msg, "unreachable") {
		t.Fatalf("an unreachable DSN: %s %q, want a failure saying it is unreachable", f.ended, f.msg)
	}
}

func TestNoDatabaseSkipsWithAdvice(t *testing.T) {
	d := provision.MariaDB
	d.Env = "SQLXBROKER_TEST_UNSET_DSN"
	d.Repository = "sqlxbroker-no-such-image" // never pull anything real
	t.Setenv(d.Env, "")
	t.Setenv(provision.Require, "")
	f := get(d)
	if f.ended != "skip" || !strings.Contains(f.msg, d.Env) {
		t.Fatalf("no database: %s %q, want a skip naming %s", f.ended, f.msg, d.Env)
	}
	t.Setenv(provision.Require, "1")
	f = get(d)
	if f.ended != "fatal" || !strings.Contains(f.msg, provision.Require) {
		t.Fatalf("no database under %s=1: %s %q, want a failure", provision.Require, f.ended, f.msg)
	}
}
