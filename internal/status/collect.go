package status

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/kafkaerr"
	"github.com/twmb/franz-go/pkg/kadm"
)

// Kafka is what the report reads from Kafka (a *kadm.Client).
type Kafka interface {
	ListEndOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	ListStartOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	DescribeGroups(ctx context.Context, groups ...string) (kadm.DescribedGroups, error)
}

// Live is what only a running process knows: the targets parked now and
// why (a *consumer.Health). Its methods are safe for concurrent use.
type Live interface {
	Parked() map[string]consumer.Parking
}

// Options are a Collector's settings.
type Options struct {
	// ConfigPath is the configuration file named in the commands shown.
	ConfigPath string
	// Rebuilding: the process is a rebuild (its targets are rebuilding).
	Rebuilding bool
	// RebuildGroup is the consumer group of a rebuild of these targets:
	// while it has members, they are rebuilding.
	RebuildGroup string
	// Timeout bounds one report's reads (default 10 s).
	Timeout time.Duration
	// SampleEvery is how often Run samples for the charts (default
	// SampleEvery).
	SampleEvery time.Duration
	// ExactBelow is the size under which versions are counted exactly
	// (default 100,000); a bigger table shows PostgreSQL's estimate.
	ExactBelow int64
}

// Collector reads reports (on its own small pool: a page never takes the
// writer's connections). Live may be nil (outside a running process).
// Its methods are safe for concurrent use.
type Collector struct {
	cfg    *config.Config
	router *config.Router
	opts   Options
	pool   *pgxpool.Pool
	kafka  Kafka
	live   Live

	mu     sync.Mutex
	charts map[string]*series // target -> the last 15 minutes (Run)
}

// New returns a Collector of cfg's targets.
func New(cfg *config.Config, opts Options, pool *pgxpool.Pool, kafka Kafka, live Live) *Collector {
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.SampleEvery <= 0 {
		opts.SampleEvery = SampleEvery
	}
	if opts.ExactBelow <= 0 {
		opts.ExactBelow = 100_000
	}
	return &Collector{cfg: cfg, router: config.NewRouter(cfg), opts: opts, pool: pool, kafka: kafka, live: live, charts: map[string]*series{}}
}

// Collect reads a report. It never fails: what cannot be read (Kafka or
// PostgreSQL down, a statement timed out) is named in Report.Errors and
// its figures are null. PostgreSQL and Kafka have half of
// Options.Timeout each: one side away does not eat the other's time.
func (c *Collector) Collect(ctx context.Context) Report {
	r := Report{GeneratedAt: time.Now().UTC(), Source: "running instance", Group: Group{GroupID: c.cfg.Kafka.GroupID, Members: []Member{}}}
	if c.live == nil {
		r.Source = "kafka and postgresql"
		r.Note = "read from Kafka and PostgreSQL, not from a running instance: whether a table is parked is known only to the instance applying it"
	}
	pctx, cancel := context.WithTimeout(ctx, c.opts.Timeout/2)
	pg, err := c.readPostgres(pctx, false)
	cancel()
	if err != nil {
		r.Errors = append(r.Errors, "PostgreSQL: "+err.Error())
	}
	for _, e := range pg.soft {
		r.Errors = append(r.Errors, "PostgreSQL: "+e)
	}
	targets := c.targets(pg.appliedTopics)
	var topics []string
	for _, t := range targets {
		topics = append(topics, t.Topics...)
	}
	kctx, cancel := context.WithTimeout(ctx, c.opts.Timeout/2)
	ks, err := c.readOffsets(kctx, topics)
	if err != nil {
		r.Errors = append(r.Errors, "Kafka: "+err.Error())
	}
	var rebuilding bool
	r.Group, rebuilding, err = c.readGroup(kctx)
	cancel()
	if err != nil {
		r.Errors = append(r.Errors, "Kafka: "+err.Error())
	}
	var parked map[string]consumer.Parking
	if c.live != nil {
		parked = c.live.Parked()
		if len(r.Group.Members) > 1 {
			r.Note = "parked states are this instance's; another member's tables are parked or not on its own page"
		}
	}
	listed := map[string]bool{}
	for i := range targets {
		t := &targets[i]
		listed[t.Target] = true
		c.fill(t, pg, ks, r.GeneratedAt)
		if rebuilding && t.State != StateUnknown {
			t.State = StateRebuilding
		}
		if p, ok := parked[t.Target]; ok {
			t.State, t.Reason = StateParked, p.Reason
			since := p.Since.UTC()
			t.ParkedSince = &since
		}
		c.mu.Lock()
		if s := c.charts[t.Target]; s != nil {
			t.chart = s.chart()
		}
		c.mu.Unlock()
	}
	for target, byReason := range pg.dead {
		if !listed[target] {
			if r.OtherDeadLetters == nil {
				r.OtherDeadLetters = map[string]map[string]int64{}
			}
			r.OtherDeadLetters[target] = byReason
		}
	}
	if len(r.OtherDeadLetters) > 0 {
		r.OtherReplayCommand = c.command("dead-letters list")
	}
	r.Targets = targets
	return r
}

// targets are the configured exact entries and the topics a
// topic_pattern entry resolved to that the group has applied, by target.
func (c *Collector) targets(applied []string) []Target {
	byTarget := map[string]*Target{}
	add := func(target, topic string) {
		t := byTarget[target]
		if t == nil {
			t = &Target{Target: target, DeadLetters: map[string]int64{}}
			byTarget[target] = t
		}
		if !slices.Contains(t.Topics, topic) {
			t.Topics = append(t.Topics, topic)
		}
	}
	for _, t := range c.cfg.Tables {
		if t.TopicPattern == "" {
			add(t.Target, t.Topic)
		}
	}
	for _, topic := range applied {
		if t, err := c.router.Resolve(topic); err == nil && t.TopicPattern != "" {
			add(t.Target, topic)
		}
	}
	out := make([]Target, 0, len(byTarget))
	for _, k := range slices.Sorted(maps.Keys(byTarget)) {
		t := byTarget[k]
		sort.Strings(t.Topics)
		out = append(out, *t)
	}
	return out
}

// fill sets t's figures from what was read.
func (c *Collector) fill(t *Target, pg pgState, ks *kafkaState, now time.Time) {
	if n, ok := pg.versions[t.Target]; ok {
		t.Versions = &n
		t.VersionsEstimated = pg.estimated[t.Target]
	}
	if at, ok := pg.marks[t.Target]; ok {
		at = at.UTC()
		t.CompleteThrough = &at
		lag := max(now.Sub(at).Seconds(), 0)
		t.LagSeconds = &lag
	}
	if dl := pg.dead[t.Target]; len(dl) > 0 {
		t.DeadLetters = dl
		t.ReplayCommand = c.command("dead-letters replay", "--table", t.Target)
	}
	if h, ok := pg.held[t.Target]; ok {
		t.HeldReconciliations = h.n
		t.Held = fmt.Sprintf("would close %d of %d live keys", h.closing, h.live)
		t.ConfirmCommand = c.command("reconcile", "--table", t.Target, "--confirm")
	}
	if ks != nil {
		var lag int64
		known := true
		for _, topic := range t.Topics {
			parts, ok := ks.ends[topic]
			if !ok {
				known = false
				continue
			}
			for p, end := range parts {
				next, ok := pg.offsets[topic][p]
				if !ok {
					next = ks.starts[topic][p]
				}
				lag += max(end-next, 0)
			}
		}
		if known && pg.ok {
			t.LagEvents = &lag
		}
	}
	switch {
	case !pg.ok:
		t.State = StateUnknown // PostgreSQL could not be read: nothing is known to be fine
	case c.opts.Rebuilding:
		t.State = StateRebuilding
	case t.Versions == nil && (t.LagEvents == nil || *t.LagEvents == 0) && len(t.DeadLetters) == 0:
		t.State = StateNothingYet
	case t.LagEvents != nil && *t.LagEvents == 0:
		t.State = StateCaughtUp
	default:
		t.State = StateApplying
	}
}

// command is a command line an operator runs, with the configuration.
func (c *Collector) command(cmd string, args ...string) string {
	line := "scd2sink " + cmd
	if c.opts.ConfigPath != "" {
		line += " --config " + quoteArg(c.opts.ConfigPath)
	}
	for _, a := range args {
		line += " " + quoteArg(a)
	}
	return line
}

// quoteArg quotes a for a POSIX shell when it needs it.
func quoteArg(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,@") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

// kafkaState is the topics' offsets, by topic and partition: the logs'
// ends, and their starts (for partitions never applied).
type kafkaState struct {
	ends, starts map[string]map[int32]int64
}

// readOffsets lists the topics' start and end offsets.
func (c *Collector) readOffsets(ctx context.Context, topics []string) (*kafkaState, error) {
	if c.kafka == nil {
		return nil, errors.New("no client")
	}
	ks := &kafkaState{ends: map[string]map[int32]int64{}, starts: map[string]map[int32]int64{}}
	if len(topics) == 0 {
		return ks, nil
	}
	for _, l := range []struct {
		list func(context.Context, ...string) (kadm.ListedOffsets, error)
		into map[string]map[int32]int64
		what string
	}{{c.kafka.ListEndOffsets, ks.ends, "end"}, {c.kafka.ListStartOffsets, ks.starts, "start"}} {
		listed, err := l.list(ctx, topics...)
		if err != nil {
			return nil, fmt.Errorf("listing the topics' %s offsets: %w", l.what, kafkaerr.Plain(err))
		}
		listed.Each(func(o kadm.ListedOffset) {
			if o.Err != nil {
				return
			}
			if l.into[o.Topic] == nil {
				l.into[o.Topic] = map[int32]int64{}
			}
			l.into[o.Topic][o.Partition] = o.Offset
		})
	}
	return ks, nil
}

// readGroup describes the consumer group: its members and partitions;
// and whether a rebuild's group (RebuildGroup) has members.
func (c *Collector) readGroup(ctx context.Context) (Group, bool, error) {
	g := Group{GroupID: c.cfg.Kafka.GroupID, Members: []Member{}}
	if c.kafka == nil {
		return g, false, errors.New("no client")
	}
	groups := []string{g.GroupID}
	if c.opts.RebuildGroup != "" {
		groups = append(groups, c.opts.RebuildGroup)
	}
	described, err := c.kafka.DescribeGroups(ctx, groups...)
	if d, ok := described[g.GroupID]; err == nil && ok && d.Err != nil {
		err = d.Err // the rebuild's group, mostly absent, may fail alone
	}
	if err != nil {
		return g, false, fmt.Errorf("describing consumer group %s: %w", g.GroupID, kafkaerr.Plain(err))
	}
	rebuilding := c.opts.RebuildGroup != "" && len(described[c.opts.RebuildGroup].Members) > 0
	d, ok := described[g.GroupID]
	if !ok {
		return g, rebuilding, nil
	}
	g.State = d.State
	for _, m := range d.Members {
		mm := Member{ID: m.MemberID, ClientID: m.ClientID, Host: strings.TrimPrefix(m.ClientHost, "/"), Partitions: []TopicPartitions{}}
		if m.InstanceID != nil {
			mm.InstanceID = *m.InstanceID
		}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				ps := slices.Clone(t.Partitions)
				slices.Sort(ps)
				mm.Partitions = append(mm.Partitions, TopicPartitions{Topic: t.Topic, Partitions: ps})
			}
			sort.Slice(mm.Partitions, func(i, j int) bool { return mm.Partitions[i].Topic < mm.Partitions[j].Topic })
		}
		g.Members = append(g.Members, mm)
	}
	sort.Slice(g.Members, func(i, j int) bool { return g.Members[i].ID < g.Members[j].ID })
	return g, rebuilding, nil
}

// quoteIdent is name as a PostgreSQL identifier.
func quoteIdent(parts ...string) string { return pgx.Identifier(parts).Sanitize() }
