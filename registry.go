package sqlxbroker

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

var (
	dialectsMu sync.RWMutex
	dialects   = make(map[string]core.Dialect)
)

// Register makes a dialect available under a database/sql driver name, the
// name sqlx.DB.DriverName reports ("postgres", "pgx", "mysql", "sqlite").
// Dialects register in init(); users blank-import the dialect package. If
// Register is called twice with the same name, or if d is nil or name empty,
// it panics.
//
// Register also tells sqlx the name's bind type (d.BindType), so that
// Rebind on the name's pools and transactions (a handler's Delivery.Tx)
// writes the dialect's placeholders; it panics when sqlx already binds the
// name otherwise.
func Register(name string, d core.Dialect) {
	dialectsMu.Lock()
	defer dialectsMu.Unlock()
	if d == nil {
		panic("sqlxbroker: Register dialect is nil")
	}
	if name == "" {
		panic("sqlxbroker: Register dialect with an empty name")
	}
	if _, dup := dialects[name]; dup {
		panic("sqlxbroker: Register called twice for dialect " + name)
	}
	bindDriver(name, d)
	dialects[name] = d
}

// bindDriver binds name to d's bind type in sqlx when sqlx does not know
// the name, and panics when sqlx binds it otherwise.
func bindDriver(name string, d core.Dialect) {
	switch bt := sqlx.BindType(name); bt {
	case d.BindType():
	case sqlx.UNKNOWN:
		sqlx.BindDriver(name, d.BindType())
	default:
		panic(fmt.Sprintf("sqlxbroker: Register dialect %s for driver %q with bind type %d, but sqlx binds %q with %d", d.Name(), name, d.BindType(), name, bt))
	}
}

// Dialects returns a sorted list of the registered dialect names.
func Dialects() []string {
	dialectsMu.RLock()
	defer dialectsMu.RUnlock()
	list := make([]string, 0, len(dialects))
	for name := range dialects {
		list = append(list, name)
	}
	sort.Strings(list)
	return list
}

// knownImports says which package registers a built-in driver name.
var knownImports = map[string]string{
	"postgres":        "github.com/sqlxbroker/sqlxbroker/dialects/postgres",
	"pgx":             "github.com/sqlxbroker/sqlxbroker/dialects/postgres",
	"postgres-txpool": "github.com/sqlxbroker/sqlxbroker/dialects/postgres",
	"mysql":           "github.com/sqlxbroker/sqlxbroker/dialects/mysql",
	"sqlite":          "github.com/sqlxbroker/sqlxbroker/dialects/sqlite",
}

// Lookup returns the dialect registered under name. An unknown name fails
// with an error matching core.ErrUnknownDialect that says what to import.
func Lookup(name string) (core.Dialect, error) {
	dialectsMu.RLock()
	d, ok := dialects[name]
	dialectsMu.RUnlock()
	if ok {
		return d, nil
	}
	hint := "register one with sqlxbroker.Register"
	if pkg, ok := knownImports[name]; ok {
		hint = fmt.Sprintf(`import _ %q`, pkg)
	}
	known := strings.Join(Dialects(), ", ")
	if known == "" {
		known = "none"
	}
	return nil, fmt.Errorf("%w %q (forgotten import? %s; registered: %s)", core.ErrUnknownDialect, name, hint, known)
}

// DialectOf returns the dialect for db's driver name.
func DialectOf(db *sqlx.DB) (core.Dialect, error) { return Lookup(db.DriverName()) }
