package sqlxbroker

// MessageColumns returns the columns and values Publish inserts into t for
// the message m (a struct with `db` tags, a pointer to one, or a
// map[string]any), in Publish's order: the ID column left out when m's is
// zero, the attempt column 1 when m gives none. The ReadyAt column gets no
// value here unless m gives one (Publish writes the publish time). Values
// are as Publish binds them (a driver.Valuer is not yet called). A message
// Publish would refuse fails with the same error. For test helpers and
// tools that compare or build rows as Publish writes them.
func MessageColumns(t Table, m any) ([]string, []any, error) {
	return fieldsOf(&t, m)
}
