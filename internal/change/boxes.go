package change

import (
	"encoding/json"
	"math/big"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgtype"
)

// Boxes gives values their interface form from typed slabs: one allocation
// per slab of a type instead of one per value, and a slab is a single
// object for the collector to mark. A row of typed values is then a view
// of a few column-typed arrays, not a dozen separate objects.
//
// A slab lives while any value from it does, so one Boxes serves values
// that die together (the rows of the batches a Prepare converts), never
// long-lived ones (a state the sink keeps is packed or detached first). A
// Boxes belongs to one goroutine. A nil *Boxes boxes values the ordinary
// way. The values handed out are read-only: nothing may write through the
// byte slices, json.RawMessage values or big.Int words it
// hands out, or through a boxed pgtype.Numeric's Int. A row from Anys is
// its caller's alone: it may write its elements.
type Boxes struct {
	strs  []string
	jsons []json.RawMessage
	bytes [][]byte
	i64s  []int64
	i32s  []int32
	i16s  []int16
	times []time.Time
	nums  []pgtype.Numeric
	ints  []big.Int
	words []big.Word
	text  []byte
	anys  []any
}

const slabLen = 256

// eface is the layout of an empty interface: its type and a pointer to its
// value (for every type below, which is not pointer-shaped).
type eface struct {
	typ, data unsafe.Pointer
}

func typeOf(v any) unsafe.Pointer { return (*eface)(unsafe.Pointer(&v)).typ }

var (
	stringType  = typeOf("")
	numberType  = typeOf(json.Number(""))
	int64Type   = typeOf(int64(0))
	int32Type   = typeOf(int32(0))
	int16Type   = typeOf(int16(0))
	timeType    = typeOf(time.Time{})
	jsonType    = typeOf(json.RawMessage(nil))
	bytesType   = typeOf([]byte(nil))
	numericType = typeOf(pgtype.Numeric{})
)

// boxAt returns the interface of type typ whose value is at p.
func boxAt(typ, p unsafe.Pointer) (v any) {
	e := (*eface)(unsafe.Pointer(&v))
	e.typ, e.data = typ, p
	return v
}

// Take returns the slab's next free slot (zero), starting a new slab when
// full: twice as long as the last one, from 8 up to 256, so that a slab
// used for a few values allocates little. The slots of a slab live as long
// as any of them is referenced: for values that die together.
func Take[T any](slab *[]T) *T {
	if n := cap(*slab); len(*slab) == n {
		*slab = make([]T, 0, min(max(8, 2*n), slabLen))
	}
	*slab = (*slab)[:len(*slab)+1]
	return &(*slab)[len(*slab)-1]
}

// String returns s as an interface.
func (b *Boxes) String(s string) any {
	if b == nil || s == "" {
		return s
	}
	p := Take(&b.strs)
	*p = s
	return boxAt(stringType, unsafe.Pointer(p))
}

// Number returns n as an interface (a json.Number shares a string's
// layout, and its slab).
func (b *Boxes) Number(n json.Number) any {
	if b == nil || n == "" {
		return n
	}
	p := Take(&b.strs)
	*p = string(n)
	return boxAt(numberType, unsafe.Pointer(p))
}

// Copy returns a copy of s, from a slab when it is short, capped at its
// length so that an append to it copies it again.
func (b *Boxes) Copy(s string) []byte {
	if b == nil || len(s) > slabLen*4 {
		return []byte(s)
	}
	if cap(b.text)-len(b.text) < len(s) {
		b.text = make([]byte, 0, slabLen*16)
	}
	n := len(b.text)
	b.text = append(b.text, s...)
	return b.text[n : n+len(s) : n+len(s)]
}

// CopyBytes is Copy for a byte slice.
func (b *Boxes) CopyBytes(p []byte) []byte {
	if b == nil || len(p) > slabLen*4 {
		return append([]byte(nil), p...)
	}
	if cap(b.text)-len(b.text) < len(p) {
		b.text = make([]byte, 0, slabLen*16)
	}
	n := len(b.text)
	b.text = append(b.text, p...)
	return b.text[n : n+len(p) : n+len(p)]
}

// Anys returns a slice of n nil values, from a slab when n is small,
// capped at n so that an append to it copies it.
func (b *Boxes) Anys(n int) []any {
	if b == nil || n == 0 || n > slabLen/4 {
		return make([]any, n)
	}
	if cap(b.anys)-len(b.anys) < n {
		b.anys = make([]any, 0, slabLen*2)
	}
	m := len(b.anys)
	b.anys = b.anys[:m+n]
	return b.anys[m : m+n : m+n]
}

// JSON returns j as an interface.
func (b *Boxes) JSON(j json.RawMessage) any {
	if b == nil {
		return j
	}
	p := Take(&b.jsons)
	*p = j
	return boxAt(jsonType, unsafe.Pointer(p))
}

// Bytes returns v as an interface.
func (b *Boxes) Bytes(v []byte) any {
	if b == nil {
		return v
	}
	p := Take(&b.bytes)
	*p = v
	return boxAt(bytesType, unsafe.Pointer(p))
}

// Int64 returns n as an interface.
func (b *Boxes) Int64(n int64) any {
	if b == nil || (n >= 0 && n < 256) { // the runtime boxes these without allocating
		return n
	}
	p := Take(&b.i64s)
	*p = n
	return boxAt(int64Type, unsafe.Pointer(p))
}

// Int32 returns n as an interface.
func (b *Boxes) Int32(n int32) any {
	if b == nil || (n >= 0 && n < 256) {
		return n
	}
	p := Take(&b.i32s)
	*p = n
	return boxAt(int32Type, unsafe.Pointer(p))
}

// Int16 returns n as an interface.
func (b *Boxes) Int16(n int16) any {
	if b == nil || (n >= 0 && n < 256) {
		return n
	}
	p := Take(&b.i16s)
	*p = n
	return boxAt(int16Type, unsafe.Pointer(p))
}

// Time returns t as an interface.
func (b *Boxes) Time(t time.Time) any {
	if b == nil {
		return t
	}
	p := Take(&b.times)
	*p = t
	return boxAt(timeType, unsafe.Pointer(p))
}

// Numeric returns n as an interface.
func (b *Boxes) Numeric(n pgtype.Numeric) any {
	if b == nil {
		return n
	}
	p := Take(&b.nums)
	*p = n
	return boxAt(numericType, unsafe.Pointer(p))
}

// BigInt returns a zero big.Int with room for words words, from the slabs
// (new(big.Int) for a nil Boxes). Its value is read-only once boxed.
func (b *Boxes) BigInt(words int) *big.Int {
	if b == nil {
		return new(big.Int)
	}
	z := Take(&b.ints)
	if words > 0 && words <= slabLen/4 {
		if cap(b.words)-len(b.words) < words {
			b.words = make([]big.Word, 0, slabLen)
		}
		n := len(b.words)
		b.words = b.words[:n+words]
		z.SetBits(b.words[n : n : n+words]) // room, no value: SetBytes fills it in place
	}
	return z
}
