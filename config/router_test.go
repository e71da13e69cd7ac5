package config

import (
	"errors"
	"strings"
	"testing"
)

const patterned = `
kafka:
  brokers: ["127.0.0.1:9092"]
postgres:
  dsn: "postgres://u@127.0.0.1:5432/db"
tables:
  - topic: shop.public.customers
    target: customers_scd
    track_history: [plan]
  - topic_pattern: 'shop\.public\..*'
    track_history: [status]
  - topic_pattern: 'shop\.sales\..*'
    target: "sales_{table}"
  - topic_pattern: 'shop\.(sales|hr)\.pay.*'
    target: "{schema}_{table}_hist"
  - topic_pattern: 'crm\..*'
    target: "crm_{topic}"
`

func TestRouter(t *testing.T) {
	c, err := Parse([]byte(patterned), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRouter(c)
	for _, tc := range []struct {
		topic, target, err string
		track              string
	}{
		{topic: "shop.public.customers", target: "customers_scd", track: "plan"}, // the exact entry wins
		{topic: "shop.public.orders", target: "orders_history", track: "status"},
		{topic: "shop.sales.invoices", target: "sales_invoices"},
		{topic: "shop.sales.payments", err: "matches both tables[2].topic_pattern and tables[3].topic_pattern"},
		{topic: "shop.hr.payroll", target: "hr_payroll_hist"},
		{topic: "shop.public", err: ErrNoMatch.Error()},                       // a pattern matches the whole name only
		{topic: "xshop.public.orders", err: ErrNoMatch.Error()},               // anchored at the start
		{topic: "crm.transaction", err: ErrNoMatch.Error()},                   // Debezium's transaction metadata
		{topic: "crm.sales.transaction", target: "crm_crm.sales.transaction"}, // a table named transaction
		{topic: "__debezium-heartbeat.shop", err: ErrNoMatch.Error()},
		{topic: "crm.a", target: "crm_crm.a"},
		{topic: "crm." + strings.Repeat("x", 60), err: "bytes"}, // a target too long
		{topic: "shop.public.orders_history", target: "orders_history_history"},
	} {
		t.Run(tc.topic, func(t *testing.T) {
			tb, err := r.Resolve(tc.topic)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error containing %q", tb, err, tc.err)
				}
				return
			}
			if err != nil || tb.Target != tc.target || tb.Topic != tc.topic {
				t.Fatalf("got %s → %s, %v; want %s", tb.Topic, tb.Target, err, tc.target)
			}
			if tc.track != "" && strings.Join(tb.TrackHistory, ",") != tc.track {
				t.Errorf("track_history %v, want %s", tb.TrackHistory, tc.track)
			}
		})
	}
	t.Run("two topics on one target", func(t *testing.T) {
		c, err := Parse([]byte(strings.Replace(patterned, `target: "sales_{table}"`, `target: "{table}_history"`, 1)), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		r := NewRouter(c)
		if _, err := r.Resolve("shop.public.invoices"); err != nil {
			t.Fatal(err)
		}
		_, err = r.Resolve("shop.sales.invoices")
		if err == nil || !strings.Contains(err.Error(), "which topic shop.public.invoices writes already") {
			t.Fatalf("got %v", err)
		}
		if tb, ok := r.ByTarget("invoices_history"); !ok || tb.Topic != "shop.public.invoices" {
			t.Errorf("ByTarget: %+v %v", tb, ok)
		}
		// At start the conflicts among the topics in Kafka are one error.
		err = NewRouter(c).Check([]string{"shop.sales.invoices", "shop.public.invoices", "shop.sales.payments", "other", "crm." + strings.Repeat("x", 60)})
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != "tables" || !strings.Contains(err.Error(), "shop.sales.invoices would write target invoices_history") ||
			!strings.Contains(err.Error(), "shop.sales.payments matches both") {
			t.Fatalf("Check: %v", err)
		}
		if strings.Contains(err.Error(), "crm.xxx") {
			t.Errorf("Check: a target too long is skipped, not a configuration error: %v", err)
		}
		if err := NewRouter(c).Check([]string{"crm." + strings.Repeat("x", 60)}); err != nil {
			t.Errorf("Check with a target too long alone: %v, want the topic skipped", err)
		}
	})
	t.Run("an exact entry's target is taken", func(t *testing.T) {
		c, err := Parse([]byte(strings.Replace(patterned, "target: customers_scd", "target: orders_history", 1)), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := NewRouter(c).Resolve("shop.public.orders"); err == nil || !strings.Contains(err.Error(), "topic shop.public.customers writes already") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestPatternConfigErrors(t *testing.T) {
	base := "kafka: {brokers: [\"k:9092\"]}\npostgres: {dsn: \"postgres://u@h/db\"}\ntables:\n"
	for _, tc := range []struct{ name, entry, key string }{
		{"both", "  - {topic: a.b.c, topic_pattern: 'a\\..*'}\n", "tables[0].topic_pattern"},
		{"bad regex", "  - {topic_pattern: 'a.(b'}\n", "tables[0].topic_pattern"},
		{"unknown placeholder", "  - {topic_pattern: 'a\\..*', target: '{database}_h'}\n", "tables[0].target"},
		{"no placeholder", "  - {topic_pattern: 'a\\..*', target: 'all_history'}\n", "tables[0].target"},
		{"views", "  - {topic_pattern: 'a\\..*', views: [{name: v}]}\n", "tables[0].views"},
		{"neither", "  - {target: x}\n", "tables[0].topic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(base+tc.entry), noEnv)
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != tc.key {
				t.Fatalf("got %v, want an error naming %s", err, tc.key)
			}
		})
	}
	c, err := Parse([]byte(base+"  - {topic_pattern: 'a\\..*'}\n"), noEnv)
	if err != nil || c.Tables[0].Target != "{table}_history" || c.Kafka.MetadataMaxAge.Seconds() != 30 {
		t.Fatalf("defaults: %+v %v", c, err)
	}
}

// TestRouterOwn: Match leaves a contested target to whoever settles it
// (the claims in PostgreSQL); Own hands it over, after which Resolve
// refuses the other topic even though it had accepted it; an exact
// entry's target is never handed over.
func TestRouterOwn(t *testing.T) {
	c, err := Parse([]byte(patterned), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRouter(c)
	if _, err := r.Resolve("crm.a.orders"); err != nil { // crm_{topic}: its own target
		t.Fatal(err)
	}
	first, err := r.Resolve("shop.public.invoices")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Resolve("shop.public.x.invoices"); err == nil {
		t.Fatal("Resolve gave a second topic the target invoices_history")
	}
	m, err := r.Match("shop.public.x.invoices")
	if err != nil || m.Target != first.Target {
		t.Fatalf("Match: %v, %v", m, err)
	}
	r.Own(first.Target, "shop.public.x.invoices")
	if _, err := r.Resolve("shop.public.invoices"); err == nil || !strings.Contains(err.Error(), "shop.public.x.invoices writes already") {
		t.Errorf("after Own, Resolve of the former owner: %v", err)
	}
	if got, err := r.Resolve("shop.public.x.invoices"); err != nil || got.Target != first.Target {
		t.Errorf("after Own, Resolve of the new owner: %v, %v", got, err)
	}
	if got, ok := r.ByTarget(first.Target); !ok || got.Topic != "shop.public.x.invoices" {
		t.Errorf("ByTarget after Own: %v %v", got, ok)
	}
	// customers_scd is the exact entry's: Own ignores it.
	r.Own("customers_scd", "shop.sales.customers_scd")
	if got, ok := r.ByTarget("customers_scd"); !ok || got.Topic != "shop.public.customers" {
		t.Errorf("an exact entry's target was handed over: %v %v", got, ok)
	}
}
