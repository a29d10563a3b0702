package sqlxbroker

import (
	"context"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// CountQuery is one statement Counts runs, for the plans test.
type CountQuery struct {
	State State // "" for the oldest ready row
	Query string
	Args  []any
}

// CountQueries returns the statements Counts runs for t at now.
func (b *Broker) CountQueries(ctx context.Context, t Table, now time.Time) ([]CountQuery, error) {
	p, err := b.Plan(t)
	if err != nil {
		return nil, err
	}
	var marks *core.StateMarks
	if sm := p.Caps.StateMarker; sm != nil {
		if marks, err = sm.StateMarks(ctx, b.pool, p); err != nil {
			return nil, err
		}
	}
	var out []CountQuery
	for _, q := range countQueries(p, &t, now, marks) {
		out = append(out, CountQuery{q.state, q.query, q.args})
	}
	return out, nil
}
