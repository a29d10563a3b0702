package mysql

// CheckVersion exposes the version decision to the external tests.
var CheckVersion = checkVersion
