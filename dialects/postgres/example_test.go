package postgres_test

import (
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// Behind PgBouncer in transaction mode, open the pool with the driver name
// "postgres-txpool" (lib/pq, with binary_parameters=yes in the DSN): its
// brokers refuse advisory tables at subscribe time, poll instead of
// LISTEN, and prepare nothing. sqlx.Open does not connect yet.
func ExampleDialect_transactionPooling() {
	db, err := sqlx.Open(postgres.TxPoolDriver, "postgres://app@127.0.0.1:6433/app?sslmode=disable&binary_parameters=yes")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		panic(err)
	}
	fmt.Println(b.Dialect().(postgres.Dialect).TransactionPooling)
	// The same without the driver name:
	b = sqlxbroker.OpenDialect(db, postgres.Dialect{TransactionPooling: true})
	fmt.Println(b.Dialect().Name())
	// Output:
	// true
	// PostgreSQL
}
