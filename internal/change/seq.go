package change

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// Seq is an event's position in its key's history, built from the configured
// sequence_by paths. It is an order-preserving byte encoding: comparing two
// Seqs with bytes.Compare (or PostgreSQL's bytea ordering) compares their
// components left to right, integers numerically, other values as strings,
// integers before strings, and a shorter prefix before its extensions.
type Seq []byte

const (
	// tagImported starts the sequence of an event imported from another
	// SCD2 table (ImportedSeq): before every tag a source's sequence
	// starts with, so an imported history comes before the key's first
	// Debezium event.
	tagImported = 0x01
	// ImportedTag is the first byte of every imported sequence.
	ImportedTag = tagImported
	tagNull     = 0x08 // a null inside an array component (source.sequence's first LSN)
	tagNeg      = 0x10
	tagPos      = 0x20
	tagStr      = 0x30
)

// Compare returns -1, 0 or +1 as s sorts before, equal to or after o.
func (s Seq) Compare(o Seq) int { return bytes.Compare(s, o) }

// SeqOf builds a Seq from sequence components. Each component may be an
// integer, a json.Number, a string (of digits or not), or a slice of those;
// a string that holds a JSON array (Debezium's source.sequence) is expanded.
// nil components are an error: a sequence must be fully known.
func SeqOf(parts ...any) (Seq, error) {
	var out []byte
	for i, p := range parts {
		var err error
		out, err = appendPart(out, p, 0)
		if err != nil {
			return nil, fmt.Errorf("sequence component %d: %w", i+1, err)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("sequence is empty")
	}
	return out, nil
}

// MustSeq is SeqOf for tests and constants; it panics on error.
func MustSeq(parts ...any) Seq {
	s, err := SeqOf(parts...)
	if err != nil {
		panic(err)
	}
	return s
}

func appendPart(out []byte, p any, depth int) ([]byte, error) {
	if depth > 2 {
		return nil, errors.New("sequence nested too deeply")
	}
	switch x := p.(type) {
	case nil:
		if depth > 0 {
			return append(out, tagNull), nil
		}
		return nil, errors.New("is null")
	case int:
		return appendInt(out, big.NewInt(int64(x))), nil
	case int32:
		return appendInt(out, big.NewInt(int64(x))), nil
	case int64:
		return appendInt(out, big.NewInt(x)), nil
	case uint64:
		return appendInt(out, new(big.Int).SetUint64(x)), nil
	case float64:
		if x == float64(int64(x)) {
			return appendInt(out, big.NewInt(int64(x))), nil
		}
		return appendStr(out, fmt.Sprint(x)), nil
	case json.Number:
		return appendNumeric(out, string(x)), nil
	case string:
		t := strings.TrimSpace(x)
		if strings.HasPrefix(t, "[") {
			var arr []any
			dec := json.NewDecoder(strings.NewReader(t))
			dec.UseNumber()
			if err := dec.Decode(&arr); err == nil {
				return appendPart(out, arr, depth+1)
			}
		}
		return appendNumeric(out, x), nil
	case []any:
		if len(x) == 0 {
			return nil, errors.New("is an empty array")
		}
		var err error
		for _, e := range x {
			if out, err = appendPart(out, e, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	case bool:
		return nil, errors.New("is a boolean, not a number or string")
	default:
		return nil, fmt.Errorf("has unsupported type %T", p)
	}
}

// AppendSeqInt appends an integer component to a sequence being built;
// it encodes exactly as SeqOf does, without allocating.
func AppendSeqInt(out []byte, n int64) []byte {
	neg := n < 0
	u := uint64(n)
	if neg {
		u = -u
	}
	var mag [8]byte
	k := 8
	for u > 0 {
		k--
		mag[k] = byte(u)
		u >>= 8
	}
	if !neg {
		out = append(out, tagPos, byte(8-k))
		return append(out, mag[k:]...)
	}
	out = append(out, tagNeg, byte(255-(8-k)))
	for _, b := range mag[k:] {
		out = append(out, ^b)
	}
	return out
}

// AppendSeqText appends a component given as text: an integer in decimal
// compares numerically, anything else as a string (as SeqOf does).
func AppendSeqText(out []byte, s string) []byte {
	if n, ok := smallInt(s); ok {
		return AppendSeqInt(out, n)
	}
	return appendNumeric(out, s)
}

// AppendSeqNull appends a null component; it sorts before every value.
func AppendSeqNull(out []byte) []byte { return append(out, tagNull) }

// smallInt parses an optionally signed decimal of at most 18 digits.
func smallInt(s string) (int64, bool) {
	d := s
	if len(d) > 0 && (d[0] == '-' || d[0] == '+') {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(d); i++ {
		c := d[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if s[0] == '-' {
		n = -n
	}
	return n, true
}

func appendNumeric(out []byte, s string) []byte {
	if n, ok := new(big.Int).SetString(s, 10); ok {
		return appendInt(out, n)
	}
	return appendStr(out, s)
}

func appendInt(out []byte, n *big.Int) []byte {
	mag := new(big.Int).Abs(n).Bytes()
	if len(mag) > 250 {
		mag = mag[len(mag)-250:]
	}
	if n.Sign() >= 0 {
		out = append(out, tagPos, byte(len(mag)))
		return append(out, mag...)
	}
	out = append(out, tagNeg, byte(255-len(mag)))
	for _, b := range mag {
		out = append(out, ^b)
	}
	return out
}

func appendStr(out []byte, s string) []byte {
	out = append(out, tagStr)
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			out = append(out, 0, 0xFF)
		} else {
			out = append(out, s[i])
		}
	}
	return append(out, 0)
}

// ImportedSeq is the sequence of an event imported from another SCD2 table
// (scd2sink import) at time t: it orders by t, and before every sequence
// a source gives (DESIGN.md section 13). Two events of one key at one
// time have the same sequence: import rejects such a table.
func ImportedSeq(t time.Time) Seq {
	out := make([]byte, 9)
	out[0] = tagImported
	binary.BigEndian.PutUint64(out[1:], uint64(t.UnixMicro())^(1<<63))
	return out
}

// Parts decodes the components of s (for logs and dead letters).
func (s Seq) Parts() []string {
	var parts []string
	for i := 0; i < len(s); {
		switch s[i] {
		case tagImported:
			if i+9 > len(s) {
				return append(parts, "?")
			}
			us := int64(binary.BigEndian.Uint64(s[i+1:i+9]) ^ (1 << 63))
			parts = append(parts, "imported "+time.UnixMicro(us).UTC().Format(time.RFC3339Nano))
			i += 9
		case tagNull:
			parts = append(parts, "null")
			i++
		case tagPos, tagNeg:
			if i+1 >= len(s) {
				return append(parts, "?")
			}
			n := int(s[i+1])
			neg := s[i] == tagNeg
			if neg {
				n = 255 - n
			}
			end := i + 2 + n
			if end > len(s) {
				return append(parts, "?")
			}
			mag := make([]byte, n)
			copy(mag, s[i+2:end])
			if neg {
				for j := range mag {
					mag[j] = ^mag[j]
				}
			}
			v := new(big.Int).SetBytes(mag)
			if neg {
				v.Neg(v)
			}
			parts = append(parts, v.String())
			i = end
		case tagStr:
			var b []byte
			j := i + 1
			for j < len(s) {
				if s[j] == 0 {
					if j+1 < len(s) && s[j+1] == 0xFF {
						b = append(b, 0)
						j += 2
						continue
					}
					j++
					break
				}
				b = append(b, s[j])
				j++
			}
			parts = append(parts, fmt.Sprintf("%q", b))
			i = j
		default:
			return append(parts, "?")
		}
	}
	return parts
}

// String renders the sequence as [a,b,...].
func (s Seq) String() string { return "[" + strings.Join(s.Parts(), ",") + "]" }
