package sqlite_test

import (
	"os"

	"github.com/jmoiron/sqlx"
)

func getenv(k string) string { return os.Getenv(k) }

func tempDir() string {
	d, err := os.MkdirTemp("", "sqlxbroker-sqlite-")
	if err != nil {
		panic(err)
	}
	return d
}

func sqlxOpen(dsn string) (*sqlx.DB, error) { return sqlx.Open("sqlite", dsn) }
