// Package provision finds databases for the conformance suite and the
// dialects' tests: an environment DSN wins; otherwise, where a Docker engine
// answers, a container is started (and removed when the test ends);
// otherwise the test skips with a message naming the variable to set. With
// SQLXBROKER_REQUIRE_DB=1 (CI sets it) every such skip is a failure.
//
// It is the only package that imports dockertest, and no package of the
// library imports it.
package provision

import (
	"database/sql"
	"fmt"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
	"os"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // drivers for ping
	_ "github.com/lib/pq"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// TB is the part of testing.TB provisioning uses.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Cleanup(func())
}

// Require is the variable that turns a skip into a failure.
const Require = "SQLXBROKER_REQUIRE_DB"

// Database says where one kind of database comes from.
type Database struct {
	Name         string   // e.g. "PostgreSQL 15"
	Family       string   // what the test report calls it, e.g. "PostgreSQL"
	Env          string   // e.g. "SQLXBROKER_POSTGRES_DSN"
	Driver       string   // database/sql driver name
	Repository   string   // Docker image
	Tag          string   // image tag
	ContainerEnv []string // the container's environment
	Port         string   // e.g. "5432/tcp"
	DSN          func(hostPort string) string
}

// The databases the built-in dialects are tested on.
var (
	Postgres = Database{Name: "PostgreSQL 15", Family: "PostgreSQL", Env: "SQLXBROKER_POSTGRES_DSN", Driver: "postgres",
		Repository: "postgres", Tag: "15", ContainerEnv: []string{"POSTGRES_PASSWORD=secret", "POSTGRES_DB=test"}, Port: "5432/tcp",
		DSN: func(hp string) string { return "postgres://postgres:secret@" + hp + "/test?sslmode=disable" }}
	MySQL = Database{Name: "MySQL 8", Family: "MySQL 8", Env: "SQLXBROKER_MYSQL8_DSN", Driver: "mysql",
		Repository: "mysql", Tag: "8.0", ContainerEnv: []string{"MYSQL_ROOT_PASSWORD=secret", "MYSQL_DATABASE=test"}, Port: "3306/tcp",
		DSN: func(hp string) string { return "root:secret@tcp(" + hp + ")/test" }}
	MariaDB = Database{Name: "MariaDB", Family: "MariaDB", Env: "SQLXBROKER_MYSQL_DSN", Driver: "mysql",
		Repository: "mariadb", Tag: "10.6", ContainerEnv: []string{"MARIADB_ROOT_PASSWORD=secret", "MARIADB_DATABASE=test"}, Port: "3306/tcp",
		DSN: func(hp string) string { return "root:secret@tcp(" + hp + ")/test" }}
)

// Get returns a DSN for d: the environment's, else a new container's.
func (d Database) Get(t TB) string {
	t.Helper()
	return d.get(t, os.Getenv(Require) == "1")
}

// GetOptional is Get for a database CI does not provide (MySQL 8 here): it
// skips, naming the variable, even under SQLXBROKER_REQUIRE_DB=1.
func (d Database) GetOptional(t TB) string {
	t.Helper()
	return d.get(t, false)
}

func (d Database) get(t TB, required bool) string {
	t.Helper()
	if dsn := strings.TrimSpace(os.Getenv(d.Env)); dsn != "" {
		if err := ping(d.Driver, dsn, 10*time.Second); err != nil {
			t.Fatalf("%s at %s=%q is unreachable: %v", d.Name, d.Env, dsn, err)
		}
		testreport.Tested(t, d.Family, d.Env)
		return dsn
	}
	dsn, err := d.container(t)
	if err == nil {
		testreport.Tested(t, d.Family, "a Docker container")
		return dsn
	}
	msg := fmt.Sprintf("no %s: set %s to a DSN of a database the tests may create tables in (Docker is not available to start one: %v)", d.Name, d.Env, err)
	if required {
		t.Fatalf("%s; %s=1 forbids skipping", msg, Require)
	}
	testreport.Skip(t, d.Family, msg)
	return ""
}

func (d Database) container(t TB) (string, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return "", err
	}
	if err := pool.Client.Ping(); err != nil {
		return "", fmt.Errorf("no Docker engine answers: %w", err)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{Repository: d.Repository, Tag: d.Tag, Env: d.ContainerEnv},
		func(hc *docker.HostConfig) {
			hc.AutoRemove = true
			hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
		})
	if err != nil {
		return "", fmt.Errorf("start %s:%s: %w", d.Repository, d.Tag, err)
	}
	t.Cleanup(func() { _ = pool.Purge(res) })
	_ = res.Expire(600)
	dsn := d.DSN(res.GetHostPort(d.Port))
	pool.MaxWait = 2 * time.Minute
	if err := pool.Retry(func() error { return ping(d.Driver, dsn, 5*time.Second) }); err != nil {
		return "", fmt.Errorf("%s:%s did not come up: %w", d.Repository, d.Tag, err)
	}
	t.Logf("started %s:%s for %s", d.Repository, d.Tag, d.Name)
	return dsn, nil
}

func ping(driver, dsn string, timeout time.Duration) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(timeout)
	for {
		err = db.Ping()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
