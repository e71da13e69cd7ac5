package pgcodec

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// CopyIn writes n rows, each built by fill, to table's columns cols with
// COPY ... FROM STDIN (FORMAT binary), as pgx's CopyFrom does, but with
// the values of the common column types encoded here, without a plan
// lookup per value, and rows encoded straight into the buffer the
// connection sends from, without a pipe. Other values go to pgx's type
// map exactly as CopyFrom would hand them (AppendCopyValue,
// TestCopyValueMatchesPgx). The columns' types come from a description of
// the table in the same transaction, every time: its lock (ACCESS SHARE,
// held to the end) keeps them from changing before the COPY, and a type
// changed by another instance (a widened column) is never sent in its
// old binary form, which for bigint to numeric PostgreSQL would take
// without an error.
//
// known, when not nil, holds the table's column types as read after the
// same lock earlier in the transaction (package history's Prefetch): then no describe is
// needed, unless a column is missing from it or of a domain type (0).
func CopyIn(ctx context.Context, tx pgx.Tx, table pgx.Identifier, cols []string, known map[string]uint32, n int, fill func(i int, row []any) []any) (int64, error) {
	quoted := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	list := strings.Join(quoted, ", ")
	types := knownTypes(known, cols)
	if types == nil {
		sd, err := tx.Conn().PgConn().Prepare(ctx, "", fmt.Sprintf("SELECT %s FROM %s", list, table.Sanitize()), nil)
		if err != nil {
			return 0, fmt.Errorf("describing %s: %w", table.Sanitize(), err)
		}
		types = make([]uint32, len(sd.Fields))
		for i, f := range sd.Fields {
			types[i] = f.DataTypeOID
		}
	}
	bp := copyBufs.Get().(*[]byte)
	r := &copyReader{n: n, fill: fill, oids: types, m: tx.Conn().TypeMap(), row: make([]any, 0, len(cols)), buf: (*bp)[:0]}
	r.buf = append(r.buf, "PGCOPY\n\377\r\n\000"...)
	r.buf = binary.BigEndian.AppendUint32(r.buf, 0) // flags
	r.buf = binary.BigEndian.AppendUint32(r.buf, 0) // header extension
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, r, fmt.Sprintf("COPY %s ( %s ) FROM STDIN BINARY", table.Sanitize(), list))
	if err != nil {
		return 0, err // the buffer is not reused: on some errors the reader may still be running
	}
	if cap(r.buf) <= 1<<20 { // a buffer grown by one huge row is not kept
		*bp = r.buf[:0]
		copyBufs.Put(bp)
	}
	return tag.RowsAffected(), nil
}

// knownTypes returns the types of cols from known, or nil if one is not
// there or is a domain's (0: a describe reports its base type).
func knownTypes(known map[string]uint32, cols []string) []uint32 {
	if known == nil {
		return nil
	}
	types := make([]uint32, len(cols))
	for i, c := range cols {
		if types[i] = known[c]; types[i] == 0 {
			return nil
		}
	}
	return types
}

// copyBufs are copyReaders' buffers, about one read of the connection
// (64 KiB) each: a batch over many tables makes a COPY per table, and a
// fresh buffer for each was a fifth of a steady load's COPY CPU (zeroed
// on allocation). pgconn.CopyFrom has read the reader to its end, or
// given up on it, when it returns without an error: the buffer is free
// again then.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1<<16); return &b }}

// copyReader encodes rows as the connection reads them (on the
// connection's goroutine, while CopyIn's caller waits).
type copyReader struct {
	n, i int
	fill func(i int, row []any) []any
	row  []any
	oids []uint32
	m    *pgtype.Map
	buf  []byte // encoded, not read yet from off
	off  int
	done bool // the trailer is in buf
}

func (r *copyReader) Read(p []byte) (int, error) {
	for len(r.buf)-r.off < len(p) && !r.done {
		if r.off > 0 { // keep what is left at the front: buf stays about one read long
			r.buf = r.buf[:copy(r.buf, r.buf[r.off:])]
			r.off = 0
		}
		if r.i == r.n {
			r.buf = binary.BigEndian.AppendUint16(r.buf, 0xffff) // the trailer: -1 fields
			r.done = true
			break
		}
		row := r.fill(r.i, r.row[:0])
		r.i++
		if len(row) != len(r.oids) {
			return 0, fmt.Errorf("row %d has %d values for %d columns", r.i, len(row), len(r.oids))
		}
		r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(len(row)))
		var err error
		for j, v := range row {
			if r.buf, err = AppendCopyValue(r.m, r.buf, r.oids[j], v); err != nil {
				return 0, fmt.Errorf("row %d, column %d: %w", r.i, j+1, err)
			}
		}
	}
	if r.off == len(r.buf) && r.done {
		return 0, io.EOF
	}
	k := copy(p, r.buf[r.off:])
	r.off += k
	return k, nil
}

// AppendCopyValue appends v, for a column of type oid, as a field of a
// binary COPY: its length and bytes, or -1 for NULL. The common pairs of
// Go type and column type are encoded here; the rest by m, as pgx's
// CopyFrom encodes them.
func AppendCopyValue(m *pgtype.Map, buf []byte, oid uint32, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return binary.BigEndian.AppendUint32(buf, math.MaxUint32), nil
	case string:
		if IsText(oid) {
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(x)))
			return append(buf, x...), nil
		}
	case []byte:
		if oid == pgtype.ByteaOID {
			if x == nil {
				return binary.BigEndian.AppendUint32(buf, math.MaxUint32), nil
			}
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(x)))
			return append(buf, x...), nil
		}
	case int64:
		if oid == pgtype.Int8OID {
			buf = binary.BigEndian.AppendUint32(buf, 8)
			return binary.BigEndian.AppendUint64(buf, uint64(x)), nil
		}
	case int32:
		if oid == pgtype.Int4OID {
			buf = binary.BigEndian.AppendUint32(buf, 4)
			return binary.BigEndian.AppendUint32(buf, uint32(x)), nil
		}
	case int16:
		if oid == pgtype.Int2OID {
			buf = binary.BigEndian.AppendUint32(buf, 2)
			return binary.BigEndian.AppendUint16(buf, uint16(x)), nil
		}
	case bool:
		if oid == pgtype.BoolOID {
			buf = binary.BigEndian.AppendUint32(buf, 1)
			if x {
				return append(buf, 1), nil
			}
			return append(buf, 0), nil
		}
	case float64:
		if oid == pgtype.Float8OID {
			buf = binary.BigEndian.AppendUint32(buf, 8)
			return binary.BigEndian.AppendUint64(buf, math.Float64bits(x)), nil
		}
	case pgtype.Numeric:
		if oid == pgtype.NumericOID { // the fast codec's encoding, without its plan's lookup
			at := len(buf)
			if out, ok := appendNumeric(binary.BigEndian.AppendUint32(buf, 0), x); ok {
				binary.BigEndian.PutUint32(out[at:], uint32(len(out)-at-4))
				return out, nil
			}
			buf = buf[:at]
		}
	case json.RawMessage:
		if x != nil && (oid == pgtype.JSONOID || oid == pgtype.JSONBOID) {
			n := len(x)
			if oid == pgtype.JSONBOID {
				n++
			}
			buf = binary.BigEndian.AppendUint32(buf, uint32(n))
			if oid == pgtype.JSONBOID {
				buf = append(buf, 1) // jsonb's binary format: version 1, then the text
			}
			return append(buf, x...), nil
		}
	case time.Time:
		switch oid {
		case pgtype.TimestamptzOID:
			buf = binary.BigEndian.AppendUint32(buf, 8)
			return timestamptzBinary{}.Encode(x, buf)
		case pgtype.TimestampOID:
			buf = binary.BigEndian.AppendUint32(buf, 8)
			return timestampBinary{}.Encode(x, buf)
		case pgtype.DateOID:
			buf = binary.BigEndian.AppendUint32(buf, 4)
			return dateBinary{}.Encode(x, buf)
		}
	}
	return encodeCopyValue(m, buf, oid, v)
}

// encodeCopyValue is how pgx's CopyFrom encodes a value: by m, in binary;
// a value m cannot encode in binary is taken as text, scanned as the
// column's type and encoded from that (pgx's fallback).
func encodeCopyValue(m *pgtype.Map, buf []byte, oid uint32, v any) ([]byte, error) {
	at := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, math.MaxUint32)
	out, err := m.Encode(oid, pgtype.BinaryFormatCode, v, buf)
	if err != nil {
		s, ok := v.(string)
		if !ok {
			text, terr := m.Encode(oid, pgtype.TextFormatCode, v, nil)
			if terr != nil {
				return nil, err
			}
			s = string(text)
		}
		var scanned any
		if typ, ok := m.TypeForOID(oid); ok {
			if _, ok := typ.Codec.(*pgtype.ArrayCodec); ok { // an array keeps its dimensions
				var arr pgtype.Array[any]
				if m.Scan(oid, pgtype.TextFormatCode, []byte(s), &arr) == nil {
					scanned = arr
				}
			}
		}
		if scanned == nil {
			if serr := m.Scan(oid, pgtype.TextFormatCode, []byte(s), &scanned); serr != nil {
				return nil, err
			}
		}
		var ferr error
		if out, ferr = m.Encode(oid, pgtype.BinaryFormatCode, scanned, buf); ferr != nil {
			return nil, err
		}
	}
	if out == nil { // NULL: the -1 written above stays
		return buf, nil
	}
	binary.BigEndian.PutUint32(out[at:], uint32(len(out)-at-4))
	return out, nil
}
