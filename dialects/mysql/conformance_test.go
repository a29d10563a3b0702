package mysql_test

import (
	"testing"

	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

// TestConformance runs the shared suite on MySQL or MariaDB:
// SQLXBROKER_MYSQL_DSN, else a MariaDB container where Docker runs, else a
// skip that names the variable.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.DSNTarget(mysql.Dialect{}, "mysql", provision.MariaDB.Get(t)))
}

// TestConformanceMySQL8 runs the suite on MySQL 8 where one is given
// (SQLXBROKER_MYSQL8_DSN) or Docker can start one.
func TestConformanceMySQL8(t *testing.T) {
	conformance.Run(t, conformance.DSNTarget(mysql.Dialect{}, "mysql", provision.MySQL.GetOptional(t)))
}
