package postgres_test

import (
	"fmt"

	"github.com/lib/pq"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// A pool that follows a failover: new connections go to whichever of the
// two servers accepts writes, and a connection left on one that does not
// is dropped after its first failed statement. Open does not connect.
func ExampleOpen_failover() {
	db, err := postgres.Open("host=db1.internal,db2.internal port=5432,5432 user=app dbname=app " +
		"target_session_attrs=read-write connect_timeout=5")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	b, err := sqlxbroker.Open(db)
	fmt.Println(b != nil, err)

	// Per-host ports in a URL are refused: lib/pq would read "db1:5432" as
	// a host name.
	_, err = postgres.Open("postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write")
	fmt.Println(err != nil)
	// Output:
	// true <nil>
	// true
}

// Stale tells the errors after which a pool from Open replaces a
// connection: its server is a standby, read-only or shutting down.
func ExampleStale() {
	standby := fmt.Errorf("claim: %w", &pq.Error{Code: "25006", Message: "cannot execute LISTEN during recovery"})
	conflict := &pq.Error{Code: "23505", Message: "duplicate key value violates unique constraint"}
	fmt.Println(postgres.Stale(standby), postgres.Stale(conflict))
	// Output: true false
}
