package sink

import (
	"github.com/jackc/pgx/v5/pgtype"
)

// normalizeRow turns what pgx returns for infinite timestamps and dates
// (a bare InfinityModifier) into values pgx can write back.
func (t *table) normalizeRow(row []any) {
	if !t.hasInfinity {
		return
	}
	for i, v := range row {
		im, ok := v.(pgtype.InfinityModifier)
		if !ok {
			continue
		}
		switch t.cols[i].oid {
		case pgtype.TimestamptzOID:
			row[i] = pgtype.Timestamptz{InfinityModifier: im, Valid: true}
		case pgtype.TimestampOID:
			row[i] = pgtype.Timestamp{InfinityModifier: im, Valid: true}
		case pgtype.DateOID:
			row[i] = pgtype.Date{InfinityModifier: im, Valid: true}
		}
	}
}
