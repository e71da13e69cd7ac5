package sink

import (
	"fmt"

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

// infinityCanon renders an infinite time value for canon; ok is false for
// finite values.
func infinityCanon(v any) (string, bool) {
	var im pgtype.InfinityModifier
	switch x := v.(type) {
	case pgtype.InfinityModifier:
		im = x
	case pgtype.Timestamptz:
		im = x.InfinityModifier
	case pgtype.Timestamp:
		im = x.InfinityModifier
	case pgtype.Date:
		im = x.InfinityModifier
	default:
		return "", false
	}
	if im == pgtype.Finite {
		return "", false
	}
	return fmt.Sprintf("Tinf%d", im), true
}
