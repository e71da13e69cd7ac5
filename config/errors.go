package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Errors are every mistake found in a configuration file, in the order of
// its lines: a file is reported whole, not one mistake per try. Each is
// an *Error (errors.As finds the first).
type Errors []*Error

// Error lists the mistakes, one per line.
func (es Errors) Error() string {
	if len(es) == 1 {
		return es[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "configuration: %d mistakes:", len(es))
	for _, e := range es {
		b.WriteString("\n  " + strings.TrimPrefix(e.Error(), "configuration: "))
	}
	return b.String()
}

// Unwrap returns each mistake.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

var (
	yamlUnknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type config\.(\w+)$`)
	yamlTypeMismatch = regexp.MustCompile("^line (\\d+): cannot unmarshal !!(\\w+) `(.*)` into (\\S+)$")
	yamlAnyLine      = regexp.MustCompile(`^line (\d+): (.*)$`)
)

// yamlErrors turns the YAML decoder's errors into mistakes naming the
// key's path, its line, and what was expected with an example; unknown
// keys get the nearest known key as a suggestion. keys maps lines to key
// paths, values lines to the values written there.
func yamlErrors(err error, keys map[int]string, values map[int][]lineValue) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if m := yamlAnyLine.FindStringSubmatch(msg); m != nil {
			line := atoi(m[1])
			if key := keyAt(keys, line, ""); key != "" {
				return &Error{Key: key, Line: line, Msg: m[2]} // a value's own check (a size)
			}
			return &Error{Line: line, Msg: "this is not valid YAML: " + m[2]}
		}
		return &Error{Msg: "this is not valid YAML: " + msg}
	}
	var out Errors
	for _, msg := range te.Errors {
		switch m := yamlUnknownField.FindStringSubmatch(msg); {
		case m != nil:
			line := atoi(m[1])
			e := &Error{Key: keyAt(keys, line, m[2]), Line: line, Msg: "unknown key"}
			if block := parentKey(e.Key); block != "" {
				e.Msg += " in " + block
			}
			if near := Nearest(m[2], knownKeys(m[3])); near != "" {
				e.Msg += fmt.Sprintf("; did you mean %s?", near)
			} else {
				e.Msg += fmt.Sprintf("; the keys there are %s", strings.Join(knownKeys(m[3]), ", "))
			}
			out = append(out, e)
			continue
		}
		if m := yamlTypeMismatch.FindStringSubmatch(msg); m != nil {
			line := atoi(m[1])
			key, got := valueAt(keys, values, line, m[3])
			e := &Error{Key: key, Line: line, Msg: fmt.Sprintf("want %s, got %q", expectation(m[4]), got)}
			if secretKey(key) {
				e.Msg = fmt.Sprintf("want %s (the value is a secret: not shown)", expectation(m[4]))
			}
			out = append(out, e)
			continue
		}
		if m := yamlAnyLine.FindStringSubmatch(msg); m != nil {
			line := atoi(m[1])
			out = append(out, &Error{Key: keyAt(keys, line, ""), Line: line, Msg: strings.ReplaceAll(m[2], "!!str ", "")})
			continue
		}
		out = append(out, &Error{Msg: msg})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Line < out[j].Line })
	return out
}

// valueAt is the key and the full value of the scalar on line that the
// decoder quoted as shown (it shortens long values): on a line with
// several values, the one shown picks the key.
func valueAt(keys map[int]string, values map[int][]lineValue, line int, shown string) (string, string) {
	prefix := strings.TrimSuffix(shown, "...")
	var match []lineValue
	for _, v := range values[line] {
		if v.value == shown || (prefix != shown && strings.HasPrefix(v.value, prefix)) {
			match = append(match, v)
		}
	}
	if len(match) == 1 {
		return match[0].path, match[0].value
	}
	if len(values[line]) > 1 {
		return "", shown // several keys on the line, none sure
	}
	return keyAt(keys, line, ""), shown
}

// secretKey reports whether key holds a secret, whose value an error
// never repeats.
func secretKey(key string) bool {
	last := key[strings.LastIndex(key, ".")+1:]
	return last == "dsn" || strings.Contains(last, "password") || strings.Contains(last, "secret") || strings.Contains(last, "token")
}

// keyAt is the path of the key on line, or name when none is known.
func keyAt(keys map[int]string, line int, name string) string {
	k := keys[line]
	if name == "" {
		return k
	}
	for ; k != ""; k = parentKey(k) {
		if k == name || strings.HasSuffix(k, "."+name) {
			return k
		}
	}
	return name
}

func atoi(s string) int {
	n := 0
	fmt.Sscan(s, &n)
	return n
}

// expectation says what a value of a Go type is written as, with an
// example.
func expectation(goType string) string {
	switch goType {
	case "time.Duration":
		return "a duration such as 45s, 10m or 1h30m"
	case "int", "int32", "int64", "uint32", "uint64":
		return "a whole number such as 500"
	case "float64":
		return "a number such as 0.5"
	case "bool":
		return "true or false"
	case "string":
		return "a text value"
	case "[]string":
		return "a list such as [a, b]"
	}
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "a list of entries (- key: value ...)"
	case strings.HasPrefix(goType, "map["):
		return "a block of name: value pairs"
	case strings.HasPrefix(goType, "config.") || strings.HasPrefix(goType, "*config."):
		return "a block of keys (key: value, one per line below it)"
	}
	return "a value of another kind"
}

// knownKeys are the keys a block (by its Go type's name) accepts.
func knownKeys(goType string) []string {
	var found reflect.Type
	var walk func(t reflect.Type)
	seen := map[reflect.Type]bool{}
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] || found != nil {
			return
		}
		seen[t] = true
		if t.Name() == goType && t.PkgPath() == reflect.TypeFor[Config]().PkgPath() {
			found = t
			return
		}
		for i := 0; i < t.NumField(); i++ {
			walk(t.Field(i).Type)
		}
	}
	walk(reflect.TypeFor[Config]())
	if found == nil {
		return nil
	}
	var keys []string
	for i := 0; i < found.NumField(); i++ {
		tag, _, _ := strings.Cut(found.Field(i).Tag.Get("yaml"), ",")
		if tag != "" && tag != "-" {
			keys = append(keys, tag)
		}
	}
	sort.Strings(keys)
	return keys
}

// Nearest is the known word (a key, a command) closest to name: within
// two edits, or one that contains it or is contained in it; "" when none
// is.
func Nearest(name string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		d := distance(strings.ToLower(name), k)
		if d < bestD || (bestD > 2 && len(name) > 3 && (strings.Contains(k, name) || strings.Contains(name, k))) {
			best, bestD = k, min(d, 2)
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// withLines sets each mistake's line from the key's path (the first line
// of that key or, for a key not written, of the nearest block written).
func withLines(err error, lines map[string]int) error {
	var es Errors
	var one *Error
	switch {
	case errors.As(err, &es):
	case errors.As(err, &one):
		es = Errors{one}
	default:
		return err
	}
	for _, e := range es {
		if e.Line != 0 || e.Key == "" {
			continue
		}
		for k := e.Key; k != ""; k = parentKey(k) {
			if n, ok := lines[k]; ok {
				e.Line = n
				break
			}
		}
	}
	if len(es) == 1 {
		return es[0]
	}
	return es
}

// parentKey is the path above key: tables[0].views[1].name ->
// tables[0].views[1] -> tables[0].views -> tables[0] -> tables -> "".
func parentKey(key string) string {
	if i := strings.LastIndexAny(key, ".["); i > 0 {
		return key[:i]
	}
	return ""
}
