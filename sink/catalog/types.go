package catalog

import (
	"github.com/jackc/pgx/v5/pgtype"
)

// NormalizeRow turns what pgx returns for infinite timestamps and dates
// (a bare InfinityModifier) into values pgx can write back.
func (t *Table) NormalizeRow(row []any) {
	if !t.HasInfinity {
		return
	}
	for i, v := range row {
		im, ok := v.(pgtype.InfinityModifier)
		if !ok {
			continue
		}
		switch t.Cols[i].OID {
		case pgtype.TimestamptzOID:
			row[i] = pgtype.Timestamptz{InfinityModifier: im, Valid: true}
		case pgtype.TimestampOID:
			row[i] = pgtype.Timestamp{InfinityModifier: im, Valid: true}
		case pgtype.DateOID:
			row[i] = pgtype.Date{InfinityModifier: im, Valid: true}
		}
	}
}
