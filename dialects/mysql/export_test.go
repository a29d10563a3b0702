package mysql

import (
	"context"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// CheckVersion exposes the version decision to the external tests.
var CheckVersion = checkVersion

// SameStateExpr exposes the comparison of generation expressions.
func SameStateExpr(a, b string) bool { return normalExpr(a) == normalExpr(b) }

// TryInWaves exposes the fallback of TryFirstAdvisoryLocks.
func TryInWaves(d Dialect, ctx context.Context, p *core.AdvisoryParams, want int) ([]int, error) {
	return d.tryInWaves(ctx, p, want)
}
