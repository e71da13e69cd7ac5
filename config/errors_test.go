package config

import (
	"errors"
	"strings"
	"testing"
)

// TestErrorsSpeak: a file with several mistakes is reported whole, each
// mistake with its key's path, its line, what was expected with an
// example, and for a misspelt key the key meant; no Go type is named.
func TestErrorsSpeak(t *testing.T) {
	file := `kafka:
  brokers: ["127.0.0.1:9092"]
  session_timeout: 45 sec
postgres:
  dsn: "postgres://u:s3cret@127.0.0.1/db"
sink:
  batch_max_events: lots
tables:
  - topic: shop.public.customers
    track_histroy: [email]
  - topic: shop.public.orders
    deletes: purge
`
	_, err := Parse([]byte(file), noEnv)
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("got %v, want Errors", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`kafka.session_timeout (line 3): want a duration such as 45s, 10m or 1h30m, got "45 sec"`,
		`sink.batch_max_events (line 7): want a whole number such as 500, got "lots"`,
		`tables[0].track_histroy (line 10): unknown key in tables[0]; did you mean track_history?`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the report lacks %q:\n%s", want, msg)
		}
	}
	for _, never := range []string{"time.Duration", "cannot unmarshal", "config.", "!!str", "s3cret"} {
		if strings.Contains(msg, never) {
			t.Errorf("the report says %q:\n%s", never, msg)
		}
	}
	var ce *Error
	if !errors.As(err, &ce) || ce.Key != "kafka.session_timeout" {
		t.Errorf("errors.As finds %v first, want kafka.session_timeout", ce)
	}

	// Once it decodes, every block's first mistake at once, with lines.
	file = strings.NewReplacer("45 sec", "45s", "lots", "500", "track_histroy", "track_history").Replace(file)
	_, err = Parse([]byte(file+"log:\n  level: loud\n"), noEnv)
	msg = err.Error()
	for _, want := range []string{"2 mistakes", `tables[1].deletes (line 12): "purge" is not one of`, "log.level (line 14)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the report lacks %q:\n%s", want, msg)
		}
	}
}

// TestErrorsOnOneLine: a configuration written as JSON on one line (as
// Helm's toJson writes it) names the right key and value, and never
// repeats a secret.
func TestErrorsOnOneLine(t *testing.T) {
	file := `{"kafka": {"brokers": ["127.0.0.1:9092"]}, "postgres": {"statement_timeout": "abc", "dsn": "postgres://u:s3cret@h/db"}, "tables": [{"topic": "a.b.c"}]}`
	_, err := Parse([]byte(file), noEnv)
	if err == nil || !strings.Contains(err.Error(), `postgres.statement_timeout (line 1): want a duration such as 45s, 10m or 1h30m, got "abc"`) {
		t.Fatalf("got %v", err)
	}
	_, err = Parse([]byte(`{"kafka": {"brokers": ["127.0.0.1:9092"]}, "postgres": {"dsn": ["s3cret"]}, "tables": [{"topic": "a.b.c"}]}`), noEnv)
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("got %v", err)
	}
	_, err = Parse([]byte("kafka: {brokers: [\"127.0.0.1:9092\"]}\npostgres:\n  dsn: {a: 1}\n  password: 7\ntables: [{topic: a.b.c}]\n"), noEnv)
	if err == nil || strings.Contains(err.Error(), "{a: 1}") {
		t.Fatalf("got %v", err)
	}
}

func TestNearestKey(t *testing.T) {
	known := []string{"target", "topic", "track_history", "type1_scope", "ignore_columns"}
	for in, want := range map[string]string{"targt": "target", "track_histroy": "track_history", "ignore": "ignore_columns", "colour": "", "TOPIC": "topic"} {
		if got := Nearest(in, known); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", in, got, want)
		}
	}
}
