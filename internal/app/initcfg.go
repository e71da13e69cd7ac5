package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// InitOptions are `scd2sink init`'s flags.
type InitOptions struct {
	Brokers  []string
	Registry string         // schema registry URL, for Avro topics
	Topics   *regexp.Regexp // only topics matching it (whole names); nil: all
	DSN      string         // the warehouse ("" writes a placeholder to edit)
	Wait     time.Duration  // how long to wait for each topic's first record
}

// initTopic is one Debezium data topic as its first record describes it.
type initTopic struct {
	name string
	debezium.Description
}

// Init writes a first configuration for the cluster's Debezium topics
// (docs/configuration.md): it lists the topics, reads the first record of
// each, keeps the data topics (heartbeats, transaction metadata, schema
// changes and other topics are named in a comment), and writes one
// tables entry per topic, or one topic_pattern entry for topics of one
// prefix, connector, format and key. The result passes run's validation.
func Init(ctx context.Context, o InitOptions, out io.Writer) error {
	hadPassword, err := initSecrets(&o)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...))
	if err != nil {
		return &config.Error{Key: "--brokers", Msg: err.Error()}
	}
	defer cl.Close()
	listed, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		return fmt.Errorf("listing the cluster's topics: %w", err)
	}
	var names []string
	for _, t := range listed.Sorted() {
		if t.IsInternal || strings.HasPrefix(t.Topic, "__") || (o.Topics != nil && !o.Topics.MatchString(t.Topic)) {
			continue
		}
		names = append(names, t.Topic)
	}
	if len(names) == 0 {
		return errors.New("no topics to look at (none matches --topics, or the cluster has none)")
	}
	firsts, err := firstRecords(ctx, o.Brokers, names, o.Wait)
	if err != nil {
		return err
	}
	cfg := &config.Config{SchemaRegistry: config.SchemaRegistry{URL: o.Registry}}
	for _, r := range firsts {
		for _, h := range r.Headers {
			if h.Key == debezium.ApicurioValueGlobalID || h.Key == debezium.ApicurioValueContentID {
				cfg.SchemaRegistry.Kind = "apicurio" // the header names its id's kind
			}
		}
	}
	if cfg.SchemaRegistry.URL != "" {
		if cfg.SchemaRegistry.Kind == "" {
			cfg.SchemaRegistry.Kind = "confluent"
		}
		if cfg.SchemaRegistry.Kind == "apicurio" {
			cfg.SchemaRegistry.UseID = "globalId"
		}
	}
	dec, err := Decoder(cfg, nil)
	if err != nil {
		return err
	}
	var data []initTopic
	var skipped []string
	for _, name := range names {
		r, ok := firsts[name]
		if !ok {
			skipped = append(skipped, name+": no record within "+o.Wait.String())
			continue
		}
		var hs []debezium.Header
		for _, h := range r.Headers {
			hs = append(hs, debezium.Header{Key: h.Key, Value: h.Value})
		}
		dctx, cancel := context.WithTimeout(ctx, o.Wait) // a registry that does not answer
		d, err := dec.Describe(dctx, r.Key, r.Value, hs...)
		cancel()
		switch {
		case err != nil && o.Registry == "" && len(r.Value) > 0 && r.Value[0] != '{':
			skipped = append(skipped, name+": Avro, and no --registry to read it")
		case err != nil:
			skipped = append(skipped, name+": "+err.Error())
		case d.Kind != "data":
			skipped = append(skipped, name+": "+d.Kind)
		default:
			data = append(data, initTopic{name: name, Description: d})
		}
	}
	if len(data) == 0 {
		return fmt.Errorf("no Debezium data topic found (%s)", strings.Join(skipped, "; "))
	}
	var txnTopics []string // Debezium's transaction metadata, named by the entries of its connector
	for _, name := range names {
		if strings.HasSuffix(name, ".transaction") {
			txnTopics = append(txnTopics, name)
		}
	}
	text := renderInit(o, hadPassword, cfg.SchemaRegistry, data, skipped, txnTopics)
	parsed, err := config.Parse([]byte(text), func(string) (string, bool) { return "", false })
	if err == nil {
		err = config.NewRouter(parsed).Check(names) // what run checks at start
	}
	if err != nil {
		return fmt.Errorf("the configuration written does not pass validation (a bug): %w\n%s", err, text)
	}
	_, err = io.WriteString(out, text)
	return err
}

// firstRecords reads the first record that is not a tombstone of each
// topic, waiting at most wait for those still empty.
func firstRecords(ctx context.Context, brokers, topics []string, wait time.Duration) (map[string]*kgo.Record, error) {
	c, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	out := map[string]*kgo.Record{}
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for len(out) < len(topics) && fctx.Err() == nil {
		fs := c.PollFetches(fctx)
		fs.EachRecord(func(r *kgo.Record) {
			if _, ok := out[r.Topic]; !ok && len(r.Value) > 0 {
				out[r.Topic] = r
			}
		})
		for _, e := range fs.Errors() {
			if !errors.Is(e.Err, context.DeadlineExceeded) && !errors.Is(e.Err, context.Canceled) {
				return nil, fmt.Errorf("reading %s: %w", e.Topic, e.Err)
			}
		}
	}
	return out, ctx.Err()
}

// initGroup is topics that one tables entry takes; target is a lone
// topic's.
type initGroup struct {
	prefix string
	topics []initTopic
	target string
}

// quoteAll writes names as YAML's double-quoted strings.
func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// renderInit writes the configuration.
func renderInit(o InitOptions, hadPassword bool, reg config.SchemaRegistry, data []initTopic, skipped, txnTopics []string) string {
	var b strings.Builder
	quoted := make([]string, len(o.Brokers))
	for i, br := range o.Brokers {
		quoted[i] = fmt.Sprintf("%q", br)
	}
	fmt.Fprintf(&b, "# Written by `scd2sink init` from %s: %d Debezium topics.\n", strings.Join(o.Brokers, ","), len(data))
	b.WriteString("# Every key: docs/configuration.md. Check it with `scd2sink tables --config FILE`: it writes\n" +
		"# nothing, and lists each topic it matches in Kafka with its target, keys and tracked columns\n" +
		"# (a bad key exits 2, naming it). Then start it with `scd2sink run --config FILE`.\n")
	for _, s := range skipped {
		fmt.Fprintf(&b, "# Left out: %s\n", s)
	}
	fmt.Fprintf(&b, "kafka:\n  brokers: [%s]\n", strings.Join(quoted, ", "))
	dsn, note := o.DSN, ""
	switch {
	case dsn == "":
		dsn, note = "postgres://scd2sink@127.0.0.1:5432/warehouse", "   # edit: the warehouse (or SCD2SINK_POSTGRES_DSN)"
	case hadPassword:
		note = "   # its password is left out: set SCD2SINK_POSTGRES_DSN to the whole DSN, or replace dsn with dsn_file: FILE (or use PGPASSWORD, ~/.pgpass)"
	}
	fmt.Fprintf(&b, "postgres:\n  dsn: %q%s\n", dsn, note)
	b.WriteString("  # schema: history   # the schema of the least-privilege role (deploy/least-privilege.sql); default public\n")
	avro := false
	for _, t := range data {
		avro = avro || t.Format == debezium.FormatAvro
	}
	if avro {
		fmt.Fprintf(&b, "schema_registry:\n  kind: %s\n  url: %q\n", reg.Kind, reg.URL)
		if reg.Kind == "apicurio" {
			b.WriteString("  use_id: globalId   # contentId for Apicurio 3.x converters (apicurio.registry.use-id)\n")
		}
	}
	b.WriteString("tables:\n")
	for _, g := range groupTopics(data, skipped) {
		t := g.topics[0]
		connector := t.Connector
		if !slices.Contains(config.Connectors, connector) {
			fmt.Fprintf(&b, "  # The records name no connector scd2sink knows (%q): postgresql is assumed; set connector.\n", connector)
			connector = "postgresql"
		}
		if len(g.topics) > 1 {
			fmt.Fprintf(&b, "  # %d topics of one connector under %s.:\n", len(g.topics), g.prefix)
			for _, t := range g.topics {
				fmt.Fprintf(&b, "  #   %s: key %s; columns %s\n", t.name, strings.Join(t.Keys, ", "), strings.Join(t.Columns, ", "))
			}
			b.WriteString("  # Every non-key column is tracked (Type 2). To track fewer for one table, give it an entry of its own\n")
			b.WriteString("  # with track_history, and leave it out of the pattern.\n")
			fmt.Fprintf(&b, "  - topic_pattern: %q\n    target: \"{table}_history\"\n", regexp.QuoteMeta(g.prefix)+`\.[^.]+`)
		} else {
			fmt.Fprintf(&b, "  - topic: %q\n    target: %q\n", t.name, g.target)
			if connector != "mongodb" && len(t.Keys) > 0 {
				fmt.Fprintf(&b, "    keys: [%s]   # the message key's fields\n", quoteAll(t.Keys))
			}
			var tracked []string
			for _, c := range t.Columns {
				if !slices.Contains(t.Keys, c) && c != "_id" {
					tracked = append(tracked, c)
				}
			}
			if len(tracked) > 0 {
				b.WriteString("    # Type 2: a change to one of these opens a version. Remove a column to make it Type 1\n")
				b.WriteString("    # (overwritten in place), or list it in ignore_columns to keep it out.\n")
				fmt.Fprintf(&b, "    track_history: [%s]\n", quoteAll(tracked))
			}
		}
		if t.Format == debezium.FormatAvro {
			b.WriteString("    format: debezium-avro\n")
		}
		fmt.Fprintf(&b, "    connector: %s\n", connector)
		if txn := transactionTopicOf(t.name, txnTopics); txn != "" {
			fmt.Fprintf(&b, "    transaction_topic: %q   # the connector's transaction metadata: complete_through is exact (docs/history-tables.md)\n", txn)
		}
		fmt.Fprintf(&b, "    sequence_by: [%s]   # connector %s's default (docs/sources.md)\n",
			strings.Join(config.DefaultSequenceBy[connector], ", "), connector)
	}
	return b.String()
}

// transactionTopicOf returns the transaction topic (<topic.prefix>.transaction)
// whose prefix is the longest that prefixes topic ("" none).
func transactionTopicOf(topic string, txnTopics []string) string {
	best := ""
	for _, t := range txnTopics {
		if prefix := strings.TrimSuffix(t, "transaction"); strings.HasPrefix(topic, prefix) && len(t) > len(best) {
			best = t
		}
	}
	return best
}

// groupTopics groups the topics of one prefix (the name up to its last
// dot) under a topic_pattern when they share connector and format, and no
// other topic of that prefix (of another connector or format, or left out)
// would be caught by the pattern, and their targets ({table}_history) are
// nobody else's; the others get entries of their own, with targets that
// are unique (the whole topic name when the table's is taken).
func groupTopics(data []initTopic, skipped []string) []initGroup {
	prefixOf := func(name string) string {
		if i := strings.LastIndexByte(name, '.'); i > 0 {
			return name[:i]
		}
		return name
	}
	tableOf := func(name string) string { return name[strings.LastIndexByte(name, '.')+1:] }
	kinds := map[string]map[string]bool{} // prefix → connector/format kinds
	for _, t := range data {
		p := prefixOf(t.name)
		if kinds[p] == nil {
			kinds[p] = map[string]bool{}
		}
		kinds[p][t.Connector+"/"+t.Format] = true
	}
	for _, s := range skipped { // "topic: why"
		name, _, _ := strings.Cut(s, ": ")
		if kinds[prefixOf(name)] != nil {
			kinds[prefixOf(name)]["left out"] = true
		}
	}
	byPrefix := map[string][]initTopic{}
	var prefixes []string
	for _, t := range data {
		p := prefixOf(t.name)
		if byPrefix[p] == nil {
			prefixes = append(prefixes, p)
		}
		byPrefix[p] = append(byPrefix[p], t)
	}
	sort.Strings(prefixes)
	var out []initGroup
	var lone []initTopic
	taken := map[string]bool{}
	for _, p := range prefixes {
		ts := byPrefix[p]
		ok := len(ts) > 1 && len(kinds[p]) == 1
		for _, t := range ts {
			ok = ok && !taken[tableOf(t.name)+"_history"]
		}
		if !ok {
			lone = append(lone, ts...)
			continue
		}
		for _, t := range ts {
			taken[tableOf(t.name)+"_history"] = true
		}
		out = append(out, initGroup{prefix: p, topics: ts})
	}
	for _, t := range lone {
		target := tableOf(t.name) + "_history"
		if taken[target] || len(target) > config.MaxTargetBytes {
			target = strings.NewReplacer(".", "_", "-", "_").Replace(t.name) + "_history"
		}
		taken[target] = true
		out = append(out, initGroup{prefix: prefixOf(t.name), topics: []initTopic{t}, target: target})
	}
	return out
}
