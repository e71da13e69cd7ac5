package debezium

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// appendSeq appends one sequence component: a number, a string (of digits
// or not; one holding a JSON array, as source.sequence does, is expanded),
// or an array of those, whose elements may be null.
func appendSeq(seq []byte, v gjson.Result) ([]byte, error) {
	switch v.Type {
	case gjson.Number:
		return change.AppendSeqText(seq, v.Raw), nil
	case gjson.String:
		if t := trimSpace(v.Str); len(t) > 0 && t[0] == '[' && gjson.Valid(t) {
			return appendSeqArray(seq, gjson.Parse(t))
		}
		return change.AppendSeqText(seq, v.Str), nil
	case gjson.JSON:
		if v.IsArray() {
			return appendSeqArray(seq, v)
		}
		return nil, errors.New("is an object, not a number or string")
	case gjson.True, gjson.False:
		return nil, errors.New("is a boolean, not a number or string")
	}
	return nil, errMissing
}

// errMissing: a sequence path is absent or null.
var errMissing = errors.New("is missing")

func appendSeqArray(seq []byte, arr gjson.Result) ([]byte, error) {
	n := 0
	var err error
	arr.ForEach(func(_, e gjson.Result) bool {
		n++
		switch e.Type {
		case gjson.Null:
			seq = change.AppendSeqNull(seq)
		case gjson.Number:
			seq = change.AppendSeqText(seq, e.Raw)
		case gjson.String:
			seq = change.AppendSeqText(seq, e.Str)
		default:
			err = fmt.Errorf("has an array element %s that is not a number or string", clip(e.Raw))
		}
		return err == nil
	})
	if err == nil && n == 0 {
		err = errors.New("is an empty array")
	}
	return seq, err
}

// validFrom reads the configured time: a number of milliseconds
// (microseconds for paths ending in _us, nanoseconds for _ns), an RFC 3339
// string, or a column of the after image (typed by its schema).
func validFrom(r *rule, env *jsonEnvelope, row *rowSchema, standIn *bool) (time.Time, error) {
	v := env.get(r.vfPath)
	if !v.Exists() || v.Type == gjson.Null {
		if a := env.field("after"); r.imageTime() && (env.flat == flatDelete || env.flat == notFlat && (!a.Exists() || a.Type == gjson.Null)) {
			v = env.get(sourceTsMs) // a delete: no row to take the time from
			*standIn = true
		}
		if v.Type != gjson.Number {
			return time.Time{}, fmt.Errorf("valid_from path %s is missing", r.ValidFrom)
		}
		return time.UnixMilli(v.Int()).UTC(), nil
	}
	if len(r.vfPath) == 2 && (r.vfPath[0] == "after" || r.vfPath[0] == "before") && row != nil {
		if c := row.byName[r.vfPath[1]]; c != nil {
			tv, err := c.value(v)
			if err != nil {
				return time.Time{}, fmt.Errorf("valid_from %s: %w", r.ValidFrom, err)
			}
			if t, ok := tv.(time.Time); ok {
				return t, nil
			}
			return time.Time{}, fmt.Errorf("valid_from %s is a %s column, not a time", r.ValidFrom, c.pgType)
		}
	}
	switch v.Type {
	case gjson.Number:
		n, err := strconv.ParseInt(v.Raw, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("valid_from %s: %s is not an integer", r.ValidFrom, clip(v.Raw))
		}
		return r.epochTime(n), nil
	case gjson.String:
		return r.isoTime(v.Str)
	}
	return time.Time{}, fmt.Errorf("valid_from %s: %s is not a time", r.ValidFrom, clip(v.Raw))
}

// sourceTsMs is the envelope path of the connector's event time.
var sourceTsMs = []string{"source", "ts_ms"}

// imageTime says whether valid_from is a column of the row (after.<col>):
// an event without an after image (a delete) then takes source.ts_ms.
func (r *rule) imageTime() bool { return len(r.vfPath) == 2 && r.vfPath[0] == "after" }

// docTime reads valid_from after.<field> from a MongoDB document.
func docTime(r *rule, rs *rowSchema, vals []any) (time.Time, error) {
	for i, c := range rs.columns {
		if c.Name == r.vfPath[1] {
			if t, ok := vals[i].(time.Time); ok {
				return t, nil
			}
			return time.Time{}, fmt.Errorf("valid_from %s is a %s field, not a date", r.ValidFrom, c.PGType)
		}
	}
	return time.Time{}, fmt.Errorf("valid_from path %s is missing", r.ValidFrom)
}

// epochTime reads a valid_from number: milliseconds, or microseconds for
// paths ending in _us, nanoseconds for _ns.
func (r *rule) epochTime(n int64) time.Time {
	switch {
	case strings.HasSuffix(r.ValidFrom, "_us"):
		return time.UnixMicro(n).UTC()
	case strings.HasSuffix(r.ValidFrom, "_ns"):
		return time.Unix(0, n).UTC()
	}
	return time.UnixMilli(n).UTC()
}

// isoTime reads a valid_from string.
func (r *rule) isoTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("valid_from %s: %q is not an RFC 3339 time", r.ValidFrom, clip(s))
	}
	return t, nil
}
