package main

import (
	_ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)
