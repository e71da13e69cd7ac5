package history

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// StaleStatement reports whether err comes from a statement prepared, or a
// COPY's column types described, before a column's type changed: the plan
// PostgreSQL refuses (0A000 in RevalidateCachedQuery), binary data of the
// old type (22P03), or a value pgx cannot encode in the old type. Not the
// event's fault: never a dead letter.
func StaleStatement(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "22P03" || (pgErr.Code == "0A000" &&
			(pgErr.Routine == "RevalidateCachedQuery" || strings.Contains(pgErr.Message, "cached plan must not change result type")))
	}
	msg := err.Error()
	return strings.Contains(msg, "unable to encode") && strings.Contains(msg, "into binary format")
}
