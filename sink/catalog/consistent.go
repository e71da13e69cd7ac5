package catalog

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A report that joins two history tables at an instant must see a state
// that existed at the source. scd2sink_consistent_through(targets)
// returns the least complete_through over the targets named (every
// target the watermarks know when NULL): NULL while any of them is not
// known complete. Each history table gets a view <target>_consistent: its
// versions as of that instant, what <target>_as_of returns for it. The
// view reads the instant once per statement, in a subquery the planner
// keeps apart (OFFSET 0): folded into the scan's filter, a STABLE
// function is called again for every row.

// ConsistentFunction is the function's name, in the service's schema.
const ConsistentFunction = "scd2sink_consistent_through"

// consistentNote marks the function's definition: it is replaced when the
// definition changes, never at a plain restart.
const consistentNote = "scd2sink consistent_through v1"

// consistentFunction renders the function's DDL in schema, reading the
// watermark view there.
func consistentFunction(schema string) string {
	s := pgx.Identifier{schema}.Sanitize()
	body := fmt.Sprintf(` SELECT CASE WHEN count(*) = 0 OR bool_or(w.complete_through IS NULL)
			OR count(*) < coalesce(cardinality(targets), 0) THEN NULL ELSE min(w.complete_through) END
		FROM %s.%s w WHERE targets IS NULL OR w.target = ANY(targets)`, s, WatermarkView)
	// PARALLEL SAFE: a query over the _consistent views keeps its
	// parallel plans.
	return fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s.%s(targets text[] DEFAULT NULL) RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS %s;
		COMMENT ON FUNCTION %s.%s(text[]) IS %s`,
		s, ConsistentFunction, dollarQuote(body), s, ConsistentFunction, QuoteLiteral(consistentNote))
}

// consistentView renders the DDL of a target's _consistent view over
// hist, with the function of the service's schema; deleted: the table has
// scd_deleted (deletes: new_record), whose deleted versions it hides as
// _as_of does.
func consistentView(create string, view, hist pgx.Identifier, serviceSchema string, deleted bool) string {
	cond := ""
	if deleted {
		cond = " AND NOT h.scd_deleted"
	}
	return fmt.Sprintf(`%s VIEW %s AS SELECT h.* FROM (SELECT %s.%s() AS at OFFSET 0) c
		JOIN %s h ON h.valid_from <= c.at AND (h.valid_to IS NULL OR c.at < h.valid_to)%s`,
		create, view.Sanitize(), pgx.Identifier{serviceSchema}.Sanitize(), ConsistentFunction, hist.Sanitize(), cond)
}

// consistentID is t's _consistent view.
func (t *Table) consistentID() pgx.Identifier {
	return pgx.Identifier{t.Spec.Schema, NamesOf(t.Spec.Target).Consistent}
}

// consistentView renders the DDL of t's _consistent view as the table is.
func (t *Table) consistentView(create string) string {
	service := t.Spec.ServiceSchema
	if service == "" {
		service = t.Spec.Schema
	}
	return consistentView(create, t.consistentID(), t.Hist, service, t.DeletedCol)
}
