package jsonscan

import "github.com/tidwall/gjson"

// ForEachMember hands the members of the JSON object s to fn in their
// order, as gjson.Result.ForEach does, until fn returns false; but it does
// not parse numbers (Num stays 0: read Raw), which is most of what gjson
// spends on a Debezium row. Each value's Type, Raw and Str are gjson's
// (TestForEachMemberMatchesGJSON). s must be valid JSON (gjson.Valid): the
// decoders validate a payload once, before its members are read; for
// anything but an object it does nothing, and on invalid JSON it stops
// somewhere without a panic.
func ForEachMember(s string, fn func(key string, v gjson.Result) bool) {
	forEachMember(s, true, fn)
}

// ForEachMemberLazy is ForEachMember without unescaping string values: an
// escaped string's Str is left empty, for Unescaped to fill in when the
// value is read. Most members a caller keeps are never read.
func ForEachMemberLazy(s string, fn func(key string, v gjson.Result) bool) {
	forEachMember(s, false, fn)
}

// Unescaped returns v with its Str filled in, if ForEachMemberLazy left it
// empty, and otherwise v.
func Unescaped(v gjson.Result) gjson.Result {
	if v.Type == gjson.String && len(v.Raw) != len(v.Str)+2 {
		v.Str = gjson.Parse(v.Raw).Str
	}
	return v
}

func forEachMember(s string, unescape bool, fn func(key string, v gjson.Result) bool) {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return
	}
	i++
	for {
		i = skipSpace(s, i)
		if i >= len(s) || s[i] != '"' {
			return // '}': the end
		}
		end, esc := stringEnd(s, i)
		if end < 0 {
			return
		}
		key := s[i+1 : end-1]
		if esc {
			key = gjson.Parse(s[i:end]).Str
		}
		i = skipSpace(s, end) + 1 // past ':'
		i = skipSpace(s, i)
		if i >= len(s) {
			return
		}
		var v gjson.Result
		switch c := s[i]; {
		case c == '"':
			if end, esc = stringEnd(s, i); end < 0 {
				return
			}
			v = gjson.Result{Type: gjson.String, Raw: s[i:end], Str: s[i+1 : end-1]}
			if esc {
				v.Str = ""
				if unescape {
					v.Str = gjson.Parse(v.Raw).Str
				}
			}
		case c == '{' || c == '[':
			end = nestedEnd(s, i)
			v = gjson.Result{Type: gjson.JSON, Raw: s[i:end]}
		case c == 't' || c == 'f' || c == 'n':
			end = i + 1
			for end < len(s) && s[end] >= 'a' && s[end] <= 'z' {
				end++
			}
			v = gjson.Result{Type: gjson.Null, Raw: s[i:end]}
			if c == 't' {
				v.Type = gjson.True
			} else if c == 'f' {
				v.Type = gjson.False
			}
		default: // a number: up to the next delimiter, as gjson cuts it
			end = i + 1
			for end < len(s) && s[end] > ' ' && s[end] != ',' && s[end] != ']' && s[end] != '}' {
				end++
			}
			v = gjson.Result{Type: gjson.Number, Raw: s[i:end]}
		}
		if !fn(key, v) {
			return
		}
		i = skipSpace(s, end)
		if i < len(s) && s[i] == ',' {
			i++
		}
	}
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index past the closing quote of the string that
// starts at s[i] (-1 if there is none), and whether it holds an escape.
func stringEnd(s string, i int) (int, bool) {
	esc := false
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			esc = true
			j++
		case '"':
			return j + 1, esc
		}
	}
	return -1, esc
}

// nestedEnd returns the index past the object or array that starts at s[i].
func nestedEnd(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '"':
			end, _ := stringEnd(s, j)
			if end < 0 {
				return len(s)
			}
			j = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(s)
}
