package jsonscan

import (
	"bytes"
	"encoding/json"
	"slices"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"
)

// AppendCanon appends Canon(raw) to dst without decoding raw into
// maps: whitespace dropped, object keys sorted, numbers and literals kept as
// they are written, strings written as encoding/json writes them. It covers
// the JSON PostgreSQL's jsonb prints (TestCanonJSONFast): ok is false, and
// dst unchanged, for anything it leaves to CanonSlow: invalid JSON, escapes
// other than \" \\ \/ \n \r \t, invalid UTF-8, U+2028 and U+2029, keys with
// escapes, duplicate keys, nesting deeper than 64. (Unchanged is dst's
// length: its spare capacity may have been written.)
func AppendCanon(dst, raw []byte) ([]byte, bool) {
	c := canonizer{src: raw}
	start := len(dst)
	c.space()
	out, ok := c.value(dst, 0)
	if c.space(); !ok || c.pos != len(raw) {
		return dst[:start], false
	}
	return out, true
}

// canonizer reads src from pos; members is a stack of object members,
// shared by nested objects.
type canonizer struct {
	src     []byte
	pos     int
	members []member
}

// member is an object member: its key in src (no escapes), and its
// canonical "key":value text in the output, from at to end.
type member struct {
	keyFrom, keyTo int
	at, end        int
}

func (c *canonizer) space() {
	for c.pos < len(c.src) {
		switch c.src[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonizer) value(dst []byte, depth int) ([]byte, bool) {
	if depth > 64 || c.pos >= len(c.src) {
		return dst, false
	}
	switch ch := c.src[c.pos]; {
	case ch == '{':
		return c.object(dst, depth)
	case ch == '[':
		return c.array(dst, depth)
	case ch == '"':
		return c.str(dst, false)
	case ch == 't':
		return c.literal(dst, "true")
	case ch == 'f':
		return c.literal(dst, "false")
	case ch == 'n':
		return c.literal(dst, "null")
	case ch == '-' || (ch >= '0' && ch <= '9'):
		return c.number(dst)
	}
	return dst, false
}

func (c *canonizer) literal(dst []byte, lit string) ([]byte, bool) {
	if !bytes.HasPrefix(c.src[c.pos:], []byte(lit)) {
		return dst, false
	}
	c.pos += len(lit)
	return append(dst, lit...), true
}

// number copies a JSON number as it is written: encoding/json keeps a
// json.Number's text.
func (c *canonizer) number(dst []byte) ([]byte, bool) {
	s, i := c.src, c.pos
	digits := func() bool {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i > j
	}
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case !digits():
		return dst, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return dst, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return dst, false
		}
	}
	dst = append(dst, s[c.pos:i]...)
	c.pos = i
	return dst, true
}

// str writes the string at pos as encoding/json writes it (HTML characters
// escaped). A key (key true) must have no escapes: keys are sorted by their
// text in src.
func (c *canonizer) str(dst []byte, key bool) ([]byte, bool) {
	s := c.src
	i := c.pos + 1
	dst = append(dst, '"')
	for i < len(s) {
		ch := s[i]
		switch {
		case ch == '"':
			c.pos = i + 1
			return append(dst, '"'), true
		case ch < 0x20:
			return dst, false
		case ch == '\\':
			if key || i+1 >= len(s) {
				return dst, false
			}
			switch s[i+1] {
			case '"':
				dst = append(dst, '\\', '"')
			case '\\':
				dst = append(dst, '\\', '\\')
			case '/':
				dst = append(dst, '/')
			case 'n':
				dst = append(dst, '\\', 'n')
			case 'r':
				dst = append(dst, '\\', 'r')
			case 't':
				dst = append(dst, '\\', 't')
			default:
				return dst, false
			}
			i += 2
			continue
		case ch == '<':
			dst = append(dst, `\u003c`...)
		case ch == '>':
			dst = append(dst, `\u003e`...)
		case ch == '&':
			dst = append(dst, `\u0026`...)
		case ch < utf8.RuneSelf:
			dst = append(dst, ch)
		default:
			r, n := utf8.DecodeRune(s[i:])
			if (r == utf8.RuneError && n == 1) || r == '\u2028' || r == '\u2029' {
				return dst, false
			}
			dst = append(dst, s[i:i+n]...)
			i += n
			continue
		}
		i++
	}
	return dst, false
}

func (c *canonizer) array(dst []byte, depth int) ([]byte, bool) {
	c.pos++
	dst = append(dst, '[')
	c.space()
	if c.pos < len(c.src) && c.src[c.pos] == ']' {
		c.pos++
		return append(dst, ']'), true
	}
	for {
		var ok bool
		if dst, ok = c.value(dst, depth+1); !ok {
			return dst, false
		}
		c.space()
		if c.pos >= len(c.src) {
			return dst, false
		}
		switch c.src[c.pos] {
		case ',':
			c.pos++
			dst = append(dst, ',')
			c.space()
		case ']':
			c.pos++
			return append(dst, ']'), true
		default:
			return dst, false
		}
	}
}

// object writes its members as they come, then again in key order after
// them, and moves that copy down over the first.
func (c *canonizer) object(dst []byte, depth int) ([]byte, bool) {
	c.pos++
	start := len(dst)
	base := len(c.members)
	defer func() { c.members = c.members[:base] }()
	c.space()
	if c.pos < len(c.src) && c.src[c.pos] == '}' {
		c.pos++
		return append(dst, '{', '}'), true
	}
	for {
		if c.pos >= len(c.src) || c.src[c.pos] != '"' {
			return dst, false
		}
		m := member{keyFrom: c.pos + 1, at: len(dst)}
		var ok bool
		if dst, ok = c.str(dst, true); !ok {
			return dst, false
		}
		m.keyTo = c.pos - 1
		c.space()
		if c.pos >= len(c.src) || c.src[c.pos] != ':' {
			return dst, false
		}
		c.pos++
		c.space()
		dst = append(dst, ':')
		if dst, ok = c.value(dst, depth+1); !ok {
			return dst, false
		}
		m.end = len(dst)
		c.members = append(c.members, m)
		c.space()
		if c.pos >= len(c.src) {
			return dst, false
		}
		if c.src[c.pos] == '}' {
			c.pos++
			break
		}
		if c.src[c.pos] != ',' {
			return dst, false
		}
		c.pos++
		c.space()
	}
	ms := c.members[base:]
	key := func(m member) []byte { return c.src[m.keyFrom:m.keyTo] }
	slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(key(a), key(b)) })
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(key(ms[i-1]), key(ms[i])) {
			return dst, false // the last one wins in encoding/json: left to it
		}
	}
	mid := len(dst)
	dst = append(dst, '{')
	for i, m := range ms {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, dst[m.at:m.end]...)
	}
	dst = append(dst, '}')
	n := copy(dst[start:], dst[mid:])
	return dst[:start+n], true
}

// AppendNumeric appends the text pgtype.Numeric.MarshalJSON gives for n
// (TestNumericJSON), without its allocations.
func AppendNumeric(dst []byte, n pgtype.Numeric) []byte {
	switch {
	case !n.Valid:
		return append(dst, "null"...)
	case n.NaN:
		return append(dst, `"NaN"`...)
	case n.InfinityModifier == pgtype.Infinity:
		return append(dst, `"Infinity"`...)
	case n.InfinityModifier == pgtype.NegativeInfinity:
		return append(dst, `"-Infinity"`...)
	case n.Int == nil:
		return append(dst, '0')
	}
	var buf [48]byte
	digits := n.Int.Append(buf[:0], 10)
	if len(digits) > 0 && digits[0] == '-' {
		dst = append(dst, '-')
		digits = digits[1:]
	}
	switch exp := int(n.Exp); {
	case exp > 0:
		dst = append(dst, digits...)
		for range exp {
			dst = append(dst, '0')
		}
	case exp < 0 && len(digits) <= -exp:
		dst = append(dst, '0', '.')
		for range -exp - len(digits) {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	case exp < 0:
		dp := len(digits) + exp
		dst = append(dst, digits[:dp]...)
		dst = append(dst, '.')
		dst = append(dst, digits[dp:]...)
	default:
		dst = append(dst, digits...)
	}
	return dst
}

// Canon renders JSON text canonically, as jsonb compares it: no
// insignificant whitespace, object keys sorted (the last of duplicates
// kept), numbers and strings with their exact value. Invalid JSON is
// returned as it is.
func Canon(raw []byte) []byte {
	if out, ok := AppendCanon(nil, raw); ok {
		return out
	}
	return CanonSlow(raw)
}

// CanonSlow is Canon by way of encoding/json, for what AppendCanon
// leaves to it.
func CanonSlow(raw []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}
