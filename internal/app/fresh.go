package app

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Commands that read (verify, history, dead-letters list, tables,
// status) and those that act on what the service wrote (reconcile,
// dead-letters replay) say "nothing yet" on a database the service never
// wrote, instead of PostgreSQL's "relation does not exist", and create
// nothing there: only run, rebuild, import and erase create tables.

// tableExists reports whether schema.name exists.
func tableExists(ctx context.Context, pool *pgxpool.Pool, schema, name string) (bool, error) {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, name}.Sanitize()).Scan(&ok); err != nil {
		return false, fmt.Errorf("looking up %s.%s: %w", schema, name, err)
	}
	return ok, nil
}

// notWrittenYet says that the service has not written what is asked for.
func notWrittenYet(schema string) string {
	return fmt.Sprintf("scd2sink has not written to schema %s yet (is postgres.schema right?)", schema)
}
