package sqlxbroker_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
)

// The columns Publish writes for a message: a zero ID is left to the
// database, the attempt column starts at 1.
func ExampleMessageColumns() {
	type signup struct {
		ID    int64  `db:"id"`
		Email string `db:"email"`
	}
	cols, vals, err := sqlxbroker.MessageColumns(sqlxbroker.Table{Name: "signups"}, signup{Email: "ada@example.com"})
	fmt.Println(cols, vals, err)
	cols, vals, _ = sqlxbroker.MessageColumns(sqlxbroker.Table{Name: "signups", Attempt: "tries"}, map[string]any{"id": 7, "tries": 3})
	fmt.Println(cols, vals)
	// Output:
	// [email attempt] [ada@example.com 1] <nil>
	// [id tries] [7 3]
}

func TestMessageColumnsRefusesWhatPublishRefuses(t *testing.T) {
	type bad struct {
		Tags []string `db:"tags"`
	}
	for _, m := range []any{bad{}, 42, map[string]any{"bad name": 1}} {
		if _, _, err := sqlxbroker.MessageColumns(sqlxbroker.Table{Name: "t"}, m); err == nil {
			t.Errorf("MessageColumns(%#v) accepted it", m)
		} else if s := err.Error(); !strings.Contains(s, "tags") && !strings.Contains(s, "int") && !strings.Contains(s, "bad name") {
			t.Errorf("MessageColumns(%#v): %v; want the error to name the problem", m, err)
		}
	}
}
