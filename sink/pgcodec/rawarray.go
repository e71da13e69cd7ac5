package pgcodec

import (
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"
)

// Arrays for statements over unnest, in PostgreSQL's binary form.
//
// A table's small share of a batch, its closes and its Type 1 updates go
// to PostgreSQL as statements over unnest of one array per column. pgx
// encodes an array element by element, each through its type map (a
// type check, a plan, a nil check by reflection); at a steady load that
// was the largest part of sending them. RawArray is such an array encoded
// here instead, each element exactly as a binary COPY encodes a field of
// the column's type (AppendCopyValue: the field is the element's length
// and bytes, -1 for NULL, which is also an array element's form), and
// sent by pgx as it is: Register installs, on each connection's type map,
// an encode plan for RawArray ahead of pgx's own.
//
// The statement names the array's type (a cast, $n::bigint[]), so
// PostgreSQL reads the elements as the type the array says, which is the
// cast's: a column widened since by another instance takes them by an
// assignment cast, as it takes pgx's arrays.

// RawArray is a one-dimensional array in PostgreSQL's binary format
// (array_recv), built by NewRawArray. A struct, not a []byte: a type map
// without Register refuses it (pgx would send a byte slice as an array of
// its bytes).
type RawArray struct{ b []byte }

// Bytes returns the array's binary form.
func (r RawArray) Bytes() []byte { return r.b }

// NewRawArray encodes n values, get(i) for each, as a one-dimensional
// array of elements of type elem (a column type's OID, as CopyIn would
// encode them into a column of that type; RawArrayFits).
func NewRawArray(m *pgtype.Map, elem uint32, n int, get func(int) any) (RawArray, error) {
	buf := make([]byte, 0, 20+n*32) // most fields are short: a few grow it
	buf = binary.BigEndian.AppendUint32(buf, 1)
	nulls := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n)) // 0: empty, as pgx sends it
	buf = binary.BigEndian.AppendUint32(buf, 1)         // the lower bound
	for i := range n {
		v := get(i)
		at := len(buf)
		var err error
		if buf, err = AppendCopyValue(m, buf, elem, v); err != nil {
			return RawArray{}, fmt.Errorf("element %d (%T): %w", i, v, err)
		}
		if int32(binary.BigEndian.Uint32(buf[at:])) == -1 {
			binary.BigEndian.PutUint32(buf[nulls:], 1)
		}
	}
	return RawArray{buf}, nil
}

// RawArrayFits reports whether values of type elem can travel as a
// RawArray: pgx knows the type and has a binary form of it (not, for
// example, of jsonpath or aclitem, which it sends as text: NewRawArray
// would write their text where PostgreSQL reads a binary form).
func RawArrayFits(m *pgtype.Map, elem uint32) bool {
	t, ok := m.TypeForOID(elem)
	return ok && t.Codec.FormatSupported(pgtype.BinaryFormatCode)
}

// rawArrayPlan sends a RawArray's bytes as they are.
type rawArrayPlan struct{}

func (rawArrayPlan) SetNext(pgtype.EncodePlan) {}

func (rawArrayPlan) Encode(value any, buf []byte) ([]byte, error) {
	return append(buf, value.(RawArray).b...), nil
}

// tryRawArray is the encode plan of a RawArray, for any array type in
// binary: a wrapper plan (pgx's extension point for values its codecs do
// not take) whose next plan, an empty array of the same type, it never
// calls.
func tryRawArray(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if _, ok := value.(RawArray); ok {
		return rawArrayPlan{}, pgtype.FlatArray[any](nil), true
	}
	return nil, nil, false
}
