package config

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// Topic resolution (DESIGN.md section 3) lives here, and only here: which
// tables entry a topic belongs to and which target it writes.
//
//   - An exact `topic` entry wins over any pattern.
//   - Otherwise the topic must match exactly one `topic_pattern` (anchored
//     at both ends); two is an error naming both.
//   - Debezium's and Kafka's own topics never match a pattern: names
//     starting with "__" (heartbeats, __consumer_offsets), transaction
//     metadata ("<prefix>.transaction"), schema changes ("<prefix>", no
//     dot), Kafka Connect's default internal topics and the Schema
//     Registry's.
//   - A pattern's target is its template with {topic} (the whole name),
//     {table} (its last dot-separated part) and {schema} (the part before
//     it); it must be a valid target, and no two topics may write one
//     target: the first resolved keeps it.

// ErrNoMatch is returned for a topic that no tables entry names.
var ErrNoMatch = errors.New("no tables entry matches it")

// ErrBadTarget marks a topic whose pattern's template gives a target that
// cannot be one (too long): the topic is skipped, at start too (DESIGN.md
// section 4), never truncated into a collision.
var ErrBadTarget = errors.New("the topic is skipped")

// Internal are regular expressions of the topics no pattern ever matches.
// Kafka's and Kafka Connect's own, which are never consumed; Debezium's
// transaction metadata (<prefix>.transaction) and schema changes
// (<prefix>, no dot) are matched by no pattern either (internal).
var Internal = []string{`^__.*`, `^connect-(offsets|configs|status)$`, `^_schemas$`}

var internal = regexp.MustCompile("(" + strings.Join(append([]string{`^[^.]+\.transaction$`, `^[^.]+$`}, Internal...), ")|(") + ")")

// templateVar is a placeholder of a target template.
var templateVar = regexp.MustCompile(`\{(table|schema|topic)\}`)

// anchored makes a topic_pattern match whole topic names only.
func anchored(p string) string { return "^(?:" + p + ")$" }

// Router resolves topics to tables entries, remembering what it resolved
// so that two topics never write one target. Safe for concurrent use.
type Router struct {
	exact    map[string]Table
	patterns []pattern
	mu       sync.Mutex
	routes   map[string]route  // by topic
	owners   map[string]string // target → topic
	// exactTargets are the exact entries' targets (target → topic).
	exactTargets map[string]string
}

type pattern struct {
	re    *regexp.Regexp
	index int
	table Table
}

type route struct {
	table Table
	err   error
}

// NewRouter returns the router of a validated configuration.
func NewRouter(c *Config) *Router {
	r := &Router{exact: map[string]Table{}, routes: map[string]route{}, owners: map[string]string{}, exactTargets: map[string]string{}}
	for i, t := range c.Tables {
		if t.TopicPattern == "" {
			r.exact[t.Topic] = t
			r.owners[t.Target] = t.Topic
			r.exactTargets[t.Target] = t.Topic
			continue
		}
		r.patterns = append(r.patterns, pattern{re: regexp.MustCompile(anchored(t.TopicPattern)), index: i, table: t})
	}
	return r
}

// Patterns returns the anchored regular expressions of the topic_pattern
// entries.
func (r *Router) Patterns() []string {
	var out []string
	for _, p := range r.patterns {
		out = append(out, p.re.String())
	}
	return out
}

// HasPatterns reports whether any entry is a topic_pattern.
func (r *Router) HasPatterns() bool { return len(r.patterns) > 0 }

// Resolve returns the tables entry of topic, with Topic and Target filled
// in. The error says why the topic is skipped: ErrNoMatch, two patterns,
// a target that is not valid or that another topic writes already. The
// answer for a topic changes only when Own hands its target to another.
func (r *Router) Resolve(topic string) (Table, error) {
	if t, ok := r.exact[topic]; ok {
		return t, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rt, ok := r.routes[topic]; ok {
		return rt.table, rt.err
	}
	t, err := r.resolve(topic)
	if err == nil {
		if other, taken := r.owners[t.Target]; taken && other != topic {
			err = fmt.Errorf("topic %s would write target %s, which topic %s writes already", topic, t.Target, other)
		} else {
			r.owners[t.Target] = topic
		}
	}
	r.routes[topic] = route{table: t, err: err}
	return t, err
}

func (r *Router) resolve(topic string) (Table, error) {
	if internal.MatchString(topic) {
		return Table{}, ErrNoMatch
	}
	var hits []pattern
	for _, p := range r.patterns {
		if p.re.MatchString(topic) {
			hits = append(hits, p)
		}
	}
	switch len(hits) {
	case 0:
		return Table{}, ErrNoMatch
	case 1:
	default:
		return Table{}, fmt.Errorf("topic %s matches both tables[%d].topic_pattern and tables[%d].topic_pattern", topic, hits[0].index, hits[1].index)
	}
	t := hits[0].table
	t.Topic = topic
	t.Target = Target(t.Target, topic)
	if err := validName(fmt.Sprintf("tables[%d].target", hits[0].index), t.Target, MaxTargetBytes, ""); err != nil {
		return Table{}, fmt.Errorf("topic %s: %w (%w)", topic, err, ErrBadTarget)
	}
	return t, nil
}

// Target fills a target template for topic.
func Target(template, topic string) string {
	parts := strings.Split(topic, ".")
	table, schema := parts[len(parts)-1], ""
	if len(parts) > 1 {
		schema = parts[len(parts)-2]
	}
	return templateVar.ReplaceAllStringFunc(template, func(v string) string {
		switch v {
		case "{table}":
			return table
		case "{schema}":
			return schema
		}
		return topic
	})
}

// Match resolves topic as Resolve does, except that the topic a pattern
// resolves may write a target another pattern-matched topic writes: for
// whoever settles that elsewhere (the claims in PostgreSQL) and tells Own.
// A target of an exact entry stays that entry's.
func (r *Router) Match(topic string) (Table, error) {
	if t, ok := r.exact[topic]; ok {
		return t, nil
	}
	t, err := r.resolve(topic)
	if err != nil {
		return t, err
	}
	if other, ok := r.exactTargets[t.Target]; ok {
		return Table{}, fmt.Errorf("topic %s would write target %s, which topic %s writes already", topic, t.Target, other)
	}
	return t, nil
}

// Own records that topic, matched by a pattern, writes target: from now
// on Resolve refuses other topics on target, even one it had accepted.
func (r *Router) Own(target, topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.exactTargets[target]; ok || r.owners[target] == topic {
		return
	}
	r.owners[target] = topic
	for other, rt := range r.routes {
		if other != topic && rt.err == nil && rt.table.Target == target {
			r.routes[other] = route{table: rt.table, err: fmt.Errorf("topic %s would write target %s, which topic %s writes already", other, target, topic)}
		}
	}
	delete(r.routes, topic)
}

// ByTarget returns the tables entry that writes target: an exact entry,
// or the topic a pattern resolved to it.
func (r *Router) ByTarget(target string) (Table, bool) {
	r.mu.Lock()
	topic, ok := r.owners[target]
	r.mu.Unlock()
	if !ok {
		return Table{}, false
	}
	t, err := r.Resolve(topic)
	return t, err == nil
}

// Check resolves the given topics (those in Kafka at start) and returns
// every conflict among them as one configuration error (exit 2); topics no
// entry matches, and topics whose target would be too long (skipped,
// logged and counted once consumed), are not errors.
func (r *Router) Check(topics []string) error {
	sort.Strings(topics)
	var msgs []string
	for _, topic := range topics {
		if _, err := r.Resolve(topic); err != nil && !errors.Is(err, ErrNoMatch) && !errors.Is(err, ErrBadTarget) {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) > 0 {
		return &Error{Key: "tables", Msg: strings.Join(msgs, "; ")}
	}
	return nil
}
