package mysql

// CheckVersion exposes the version decision to the external tests.
var CheckVersion = checkVersion

// SameStateExpr exposes the comparison of generation expressions.
func SameStateExpr(a, b string) bool { return normalExpr(a) == normalExpr(b) }
