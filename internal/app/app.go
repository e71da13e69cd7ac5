// Package app assembles the pipeline from a configuration: the sink on a
// PostgreSQL pool, the consumer on a franz-go client, and the HTTP endpoint,
// run under one errgroup. cmd/scd2sink and the demo both run it.
package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	saslaws "github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/consumer/txlog"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/apicurio"
	"github.com/scd2sink/scd2sink/internal/retry"
	"github.com/scd2sink/scd2sink/internal/status"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/txns"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// Options are the parts a caller may supply.
type Options struct {
	Logger *zap.Logger
	// KafkaOpts are extra franz-go options (the demo and tests).
	KafkaOpts []kgo.Opt
	// ConfigPath is the configuration file, named in the commands the
	// status page shows; Version is shown at its foot.
	ConfigPath, Version string
	// LeaveGroup makes a static member (kafka.instance_id) leave the
	// group when it stops (run --leave-group).
	LeaveGroup bool
	// beforeCarry, when set (tests), is called as each try of a
	// rebuild's carryOver starts; afterEraseRound after each round of
	// Erase; retentionFirst and retentionEvery, when set, replace run's
	// retention schedule (retention.go).
	// statusEvery, when set (tests), is how often the status page's
	// charts sample.
	statusEvery                    time.Duration
	beforeCarry                    func()
	afterEraseRound                func(round int)
	retentionFirst, retentionEvery time.Duration
	// transactionWait replaces how long after its END was read a
	// transaction missing events waits at least (txns.Reads.ReadWait).
	transactionWait time.Duration
}

// SinkConfig turns the configuration's tables into the sink's: the exact
// entries, in order (topic_pattern entries resolve later, see Route).
func SinkConfig(cfg *config.Config, log *zap.Logger) sink.Config {
	sc := sink.Config{Schema: cfg.Postgres.Schema, DeadLetterTable: cfg.Sink.DeadLetterTable,
		ConsumerGroup: cfg.Kafka.GroupID, Logger: log, MaxRetries: 5, ReorderWindow: cfg.Sequencer.ReorderWindow,
		ApplyWorkers: cfg.Sink.ApplyWorkers, ErasureSecret: cfg.ErasureKey}
	if cfg.Rebuilding {
		sc.ErasureAlias = RebuildTarget
	}
	for _, t := range cfg.Tables {
		if t.TopicPattern == "" {
			sc.Tables = append(sc.Tables, tableSpec(cfg, t))
		}
	}
	return sc
}

// tableSpec is the sink's spec of one resolved tables entry.
func tableSpec(cfg *config.Config, t config.Table) sink.TableSpec {
	return sink.TableSpec{Target: t.Target, Schema: cfg.Postgres.Schema, Topic: t.Topic, Keys: t.Keys,
		TrackHistory: t.TrackHistory, IgnoreColumns: t.IgnoreColumns,
		Type1Scope: sink.Type1Scope(t.Type1Scope), Deletes: sink.DeletesMode(t.Deletes), Views: viewSpecs(t.Views),
		SnapshotDeletes: t.SnapshotDeletes == "close", MaxCloseFraction: fraction(t.SnapshotDeletesMaxFraction),
		FailOnSchemaChange: t.SchemaChanges == "fail", Retention: t.RetentionPeriod, Partitioning: partitioning(t.Partitioning),
		NoOverlap: t.HistoryConstraint == "no_overlap"}
}

func partitioning(p *config.Partitioning) sink.Partitioning {
	if p == nil {
		return sink.Partitioning{}
	}
	return sink.Partitioning{Interval: p.Interval, Ahead: *p.Ahead}
}

func fraction(f *float64) float64 {
	if f == nil {
		return config.DefaultSnapshotDeletesMaxFraction
	}
	return *f
}

// rule is the decoder's rule of one resolved tables entry.
func rule(t config.Table) debezium.Rule {
	return debezium.Rule{Topic: t.Topic, Target: t.Target, Keys: t.Keys,
		SequenceBy: t.SequenceBy, ValidFrom: t.ValidFrom, Format: t.Format, Connector: t.Connector,
		TransactionTopic: t.TransactionTopic}
}

// Route gives the decoder and the sink what a topic_pattern entry resolves
// to, from the one router: a topic's rule, a target's spec.
func Route(cfg *config.Config, router *config.Router, dec *debezium.Decoder, sc *sink.Config) {
	if !router.HasPatterns() {
		return
	}
	dec.SetResolver(func(topic string) (debezium.Rule, bool) {
		t, err := router.Resolve(topic)
		return rule(t), err == nil
	})
	sc.Resolve = func(target string) (sink.TableSpec, bool) {
		t, ok := router.ByTarget(target)
		return tableSpec(cfg, t), ok
	}
}

func viewSpecs(vs []config.View) []sink.ViewSpec {
	var out []sink.ViewSpec
	for _, v := range vs {
		out = append(out, sink.ViewSpec{Name: v.Name, Columns: v.Columns, Day: v.Grain == "day", TimeZone: v.TimeZone,
			Inclusive: v.End == "inclusive", CurrentEnd: v.CurrentEnd, HideDeleted: v.Deleted == "hide"})
	}
	return out
}

// keyDecoder reads message keys as dec does (sink.Config.DecodeKey).
func keyDecoder(dec *debezium.Decoder) func(ctx context.Context, topic string, key []byte, hs []sink.Header) ([]any, []string, error) {
	return func(ctx context.Context, topic string, key []byte, hs []sink.Header) ([]any, []string, error) {
		dh := make([]debezium.Header, len(hs))
		for i, h := range hs {
			dh[i] = debezium.Header{Key: h.Key, Value: h.Value}
		}
		return dec.DecodeKey(ctx, topic, key, dh)
	}
}

// Rules turns the configuration's tables into the decoder's rules.
func Rules(cfg *config.Config) []debezium.Rule {
	var rules []debezium.Rule
	for _, t := range cfg.Tables {
		if t.TopicPattern == "" {
			rules = append(rules, rule(t))
		}
	}
	return rules
}

// Decoder builds the record decoder, with a schema registry client when a
// table uses format debezium-avro.
func Decoder(cfg *config.Config, log *zap.Logger) (*debezium.Decoder, error) {
	var reg debezium.Registry
	if cfg.SchemaRegistry.URL != "" {
		cl, err := registryClient(cfg)
		if err != nil {
			return nil, err
		}
		reg = cl
	}
	d := debezium.New(Rules(cfg), reg, log)
	d.SetLookupTimeout(cfg.SchemaRegistry.LookupTimeout)
	switch r := cfg.SchemaRegistry; {
	case r.Kind == "apicurio" && r.UseID == "contentId":
		d.SetWireIDs(debezium.ApicurioContentIDs)
	case r.Kind == "apicurio":
		d.SetWireIDs(debezium.ApicurioGlobalIDs)
	}
	return d, nil
}

// registryClient is the schema registry's client, of its kind: basic auth
// or a bearer token read from token_file (again when the file changes),
// TLS with the configured CA and client certificate.
func registryClient(cfg *config.Config) (debezium.Registry, error) {
	r := cfg.SchemaRegistry
	var auth func(*http.Request) error
	switch {
	case r.TokenFile != "":
		token := &fileSecret{path: r.TokenFile}
		auth = func(req *http.Request) error {
			t, err := token.get()
			if err != nil {
				return fmt.Errorf("schema_registry.token_file: %w", err)
			}
			req.Header.Set("Authorization", "Bearer "+t)
			return nil
		}
	case r.Username != "":
		auth = func(req *http.Request) error {
			req.SetBasicAuth(r.Username, r.Password)
			return nil
		}
	}
	var hc *http.Client
	if u, err := url.Parse(r.URL); err == nil && strings.EqualFold(u.Scheme, "https") { // schemes compare case-insensitively
		tc, err := tlsConfig("schema_registry.tls", r.TLS.CAFile, r.TLS.CertFile, r.TLS.KeyFile)
		if err != nil {
			return nil, err
		}
		hc = &http.Client{Timeout: 30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 4}}
	}
	if r.Kind == "apicurio" {
		cl, err := apicurio.New(r.URL, apicurio.Options{HTTPClient: hc, Auth: auth})
		if err != nil {
			return nil, &config.Error{Key: "schema_registry.url", Msg: "cannot be used: " + err.Error()}
		}
		return cl, nil
	}
	opts := []sr.ClientOpt{sr.URLs(r.URL), sr.UserAgent("scd2sink")}
	if auth != nil {
		opts = append(opts, sr.PreReq(auth))
	}
	if hc != nil {
		opts = append(opts, sr.HTTPClient(hc))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, &config.Error{Key: "schema_registry.url", Msg: "cannot be used: " + err.Error()}
	}
	return cl, nil
}

// Pool opens a PostgreSQL pool. Errors never quote the DSN.
func Pool(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, error) {
	pc, err := poolConfig(cfg)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, pc)
}

// statusPool is the status page's own pool: two connections, statements
// of at most 5 s, so that a page never takes the writer's connections
// nor runs long.
func statusPool(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, error) {
	pc, err := poolConfig(cfg)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = 2, 0
	pc.ConnConfig.RuntimeParams["statement_timeout"] = fmt.Sprint(min(cfg.Postgres.StatementTimeout, 5*time.Second).Milliseconds())
	pc.ConnConfig.RuntimeParams["application_name"] += " status"
	return pgxpool.NewWithConfig(ctx, pc)
}

// poolConfig is the pool's configuration from cfg: the DSN and the
// session settings every connection of the service has.
func poolConfig(cfg *config.Config) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(cfg.Postgres.DSN)
	if err != nil {
		return nil, &config.Error{Key: "postgres.dsn", Msg: "is not a valid PostgreSQL connection string"}
	}
	if pc.ConnConfig.RuntimeParams["application_name"] == "" {
		pc.ConnConfig.RuntimeParams["application_name"] = "scd2sink" // unless the DSN names the instance
	}
	// Every statement waits at most lock_timeout for a lock: readers of
	// the history are never queued behind the service for longer.
	pc.ConnConfig.RuntimeParams["lock_timeout"] = fmt.Sprint(cfg.Postgres.LockTimeout.Milliseconds())
	pc.ConnConfig.RuntimeParams["statement_timeout"] = fmt.Sprint(cfg.Postgres.StatementTimeout.Milliseconds())
	// A transaction left open by a process that stopped (SIGSTOP, a paused
	// VM) past its Kafka session holds its partitions' advisory locks; the
	// member that took them over must not wait for it longer than that.
	pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(cfg.Kafka.SessionTimeout.Milliseconds())
	// The service's statements are short, and their planner estimates
	// over small or empty service tables are wild: with JIT on (the
	// default where PostgreSQL is built with LLVM) a statement whose
	// estimate passes jit_above_cost compiles for 200-300 ms before it
	// runs a millisecond (BenchmarkImport: 14,000 versions/s against
	// 64,000 with it off). Unless the DSN says otherwise.
	if _, ok := pc.ConnConfig.RuntimeParams["jit"]; !ok {
		pc.ConnConfig.RuntimeParams["jit"] = "off"
	}
	// Each history table has its own handful of prepared statements (the
	// read-ahead, the closing update, the COPYs' describes): past pgx's
	// 512 a connection re-prepares, and PostgreSQL plans afresh, every
	// statement of every batch once tables number a hundred or more.
	// Unless the DSN says otherwise (statement_cache_capacity).
	if !strings.Contains(cfg.Postgres.DSN, "statement_cache_capacity") {
		pc.ConnConfig.StatementCacheCapacity = statementCache
	}
	return pc, nil
}

// quietAfter is sequencer.quiet_after as the consumer takes it: 0 for
// its default, negative for never.
func quietAfter(q *time.Duration) time.Duration {
	switch {
	case q == nil:
		return 0
	case *q == 0:
		return -1
	}
	return *q
}

// statementCache is how many prepared statements each of the service's
// connections keeps (docs/operations.md): about a dozen per history table
// for 300 tables.
const statementCache = 4096

// Run runs the pipeline until ctx ends, then drains within the configured
// shutdown timeout. It returns nil after a clean shutdown.
func Run(ctx context.Context, cfg *config.Config, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	tlsCfg, err := kafkaTLS(cfg)
	if err != nil {
		return err
	}
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := consumer.NewMetrics(reg)
	health := &consumer.Health{}

	for _, t := range cfg.Tables {
		if p := t.Partitioning; p != nil && p.By == "valid_from" {
			log.Warn("partitioning.by: valid_from is served as scd2sink partitions every history table: current versions in one partition, "+
				"closed versions by the interval of their valid_to (a partition by valid_from would hold current versions in every old interval, "+
				"and retention could never drop it); write by: valid_to", zap.String("table", t.Target))
		}
	}
	router := config.NewRouter(cfg)
	if err := checkTopics(ctx, cfg, opts, router, log); err != nil {
		return err
	}
	dec, err := Decoder(cfg, log.Named("decoder"))
	if err != nil {
		return err
	}
	dec.SetStreamHook(func(topic, stream, other string) {
		metrics.Streams.WithLabelValues(topic).Inc()
		log.Warn("events of a topic carry GTIDs of a second stream: GTIDs of different MariaDB domains or MySQL source servers do not order each other, "+
			"and scd2sink orders such events by stream (docs/sources.md)", zap.String("topic", topic), zap.String("stream", stream), zap.String("seen_before", other))
	})
	warnPositionOnly(cfg, log)
	sc := SinkConfig(cfg, log.Named("sink"))
	Route(cfg, router, dec, &sc)
	sc.DecodeKey = keyDecoder(dec)
	sc.OnRetry = func(stage, what string, err error) {
		if err == nil {
			health.Wait(stage, "") // the step is over
			return
		}
		metrics.Retries.WithLabelValues(sink.SQLState(err)).Inc()
		health.Wait(stage, fmt.Sprintf("%s: retrying: %s", what, sink.Summary(err)))
	}
	s, err := sink.New(sc, pool)
	if err != nil {
		return &config.Error{Msg: err.Error()}
	}
	reg.MustRegister(heldGauge(s))
	g, gctx := errgroup.WithContext(ctx)
	if addr := cfg.HTTPAddr(); addr != "" {
		adm, cl, err := opts.kafkaAdmin(cfg)
		if err != nil {
			return err
		}
		defer cl.Close()
		spool, err := statusPool(ctx, cfg)
		if err != nil {
			return err
		}
		defer spool.Close()
		coll := status.New(cfg, statusOptions(cfg, opts), spool, adm, health)
		srv, err := newHTTP(addr, reg, health, status.NewServer(coll, opts.Version))
		if err != nil {
			return err
		}
		g.Go(func() error { return srv.run(gctx) })
		g.Go(func() error { return coll.Run(gctx) })
	}
	g.Go(func() error {
		if err := initSink(gctx, s, log, health, metrics); err != nil {
			if gctx.Err() != nil {
				return nil // stopped before PostgreSQL came up: a clean stop
			}
			return err
		}
		health.Postgres.Store(true)
		if topics := transactionTopics(cfg); len(topics) > 0 && !cfg.Rebuilding {
			reads := txns.NewReads(pool, cfg.Postgres.Schema, cfg.Kafka.GroupID)
			if opts.transactionWait > 0 {
				reads.ReadWait = opts.transactionWait
			}
			if err := beginTransactions(gctx, reads, topics, cfg.Kafka.StartOffset == "latest", log); err != nil {
				return nil // stopped first
			}
			tr := txlog.New(txlog.Config{Topics: topics, Logger: log.Named("transactions"),
				Awaited: txlog.AwaitedBy(func(topic string) (string, bool) {
					t, err := router.Resolve(topic)
					return t.TransactionTopic, err == nil
				}),
				Client:    func(extra ...kgo.Opt) (*kgo.Client, error) { return opts.kafkaClient(cfg, extra...) },
				ID:        func(topic, id string) string { return debezium.TransactionID(transactionConnector(cfg, topic), id) },
				OnGivenUp: func(topic string, _ txns.GivenUp) { metrics.TransactionsGivenUp.WithLabelValues(topic).Inc() },
			}, reads, dec)
			g.Go(func() error { return tr.Run(gctx) })
		}
		if !cfg.Rebuilding {
			r := &retainer{s: s, log: log.Named("retention"), metrics: metrics, health: health, now: time.Now, first: opts.retentionFirst, every: opts.retentionEvery}
			g.Go(func() error { return r.Run(gctx) })
		}
		c, err := consumer.New(consumer.Config{
			Brokers: cfg.Kafka.Brokers, GroupID: cfg.Kafka.GroupID, ClientID: cfg.Kafka.ClientID,
			StartOffset: cfg.Kafka.StartOffset, SessionTimeout: cfg.Kafka.SessionTimeout, IsolationLevel: cfg.Kafka.IsolationLevel, OnOffsetLost: cfg.Kafka.OnOffsetLost, InstanceID: cfg.Kafka.InstanceID, LeaveOnStop: opts.LeaveGroup, TLS: tlsCfg, SASL: kafkaSASL(cfg), Rules: Rules(cfg), Decoder: dec,
			Patterns: router.Patterns(), Exclude: config.Internal, MetadataMaxAge: cfg.Kafka.MetadataMaxAge,
			Route:         routeFunc(router, s),
			ReorderWindow: cfg.Sequencer.ReorderWindow, QuietAfter: quietAfter(cfg.Sequencer.QuietAfter), MaxBufferedEvents: cfg.Sequencer.MaxBufferedEvents,
			MaxBufferedBytes: int64(cfg.Sequencer.MaxBufferedBytes), BatchMaxBytes: int64(cfg.Sink.BatchMaxBytes),
			BatchMaxEvents: cfg.Sink.BatchMaxEvents, BatchMaxWait: cfg.Sink.BatchMaxWait,
			Logger: log.Named("consumer"), Metrics: metrics, Opts: opts.KafkaOpts,
		}, s, health)
		if err != nil {
			return err
		}
		return c.Run(gctx, cfg.ShutdownTimeout)
	})
	err = g.Wait()
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// beginTransactions records where each transaction topic met for the first
// time is read from, before the group applies anything (txns.Reads.Begin),
// retrying while PostgreSQL fails; it fails only when ctx ends.
func beginTransactions(ctx context.Context, reads *txns.Reads, topics []string, latest bool, log *zap.Logger) error {
	backoff := 200 * time.Millisecond
	for _, topic := range topics {
		for {
			err := reads.Begin(ctx, topic, latest)
			if err == nil {
				break
			}
			log.Warn("recording where a transaction topic is read from failed; retrying", zap.String("topic", topic), zap.Error(err))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 10*time.Second)
		}
	}
	return nil
}

// transactionConnector is the connector of the tables that name the
// transaction topic.
func transactionConnector(cfg *config.Config, topic string) string {
	for _, t := range cfg.Tables {
		if t.TransactionTopic == topic {
			return t.Connector
		}
	}
	return ""
}

// transactionTopics are the transaction topics the tables name, each once.
func transactionTopics(cfg *config.Config) []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range cfg.Tables {
		if t.TransactionTopic != "" && !seen[t.TransactionTopic] {
			seen[t.TransactionTopic] = true
			out = append(out, t.TransactionTopic)
		}
	}
	return out
}

// initSink creates the tables, retrying with capped backoff while
// PostgreSQL is unreachable, and slowly, with one clear error, while it
// refuses (a missing grant, a table changed by hand): never a crash loop.
func initSink(ctx context.Context, s *sink.Sink, log *zap.Logger, health *consumer.Health, metrics *consumer.Metrics) error {
	var lastBlocked string
	p := retry.Policy{Backoff: 200 * time.Millisecond, Max: 10 * time.Second, BlockedMax: 30 * time.Second,
		Classify: func(err error) retry.Class {
			if errors.Is(err, sink.ErrErasureKey) {
				return retry.Fatal
			}
			return sink.Classify(err)
		},
		OnRetry: func(attempt int, class retry.Class, err error, _ time.Duration) {
			metrics.Retries.WithLabelValues(sink.SQLState(err)).Inc()
			health.Wait("init", fmt.Sprintf("preparing PostgreSQL: retrying: %s", sink.Summary(err)))
			if class == sink.Blocked {
				if msg := err.Error(); msg != lastBlocked {
					lastBlocked = msg
					log.Error("PostgreSQL refuses what the service needs; waiting for a fix", zap.String("hint", sink.Hint(err)), zap.Error(err))
				}
			} else if attempt%10 == 0 {
				log.Warn("PostgreSQL unreachable, retrying", zap.Error(err))
			}
		}}
	_, err := p.Do(ctx, s.Init)
	switch {
	case err == nil:
		health.Wait("init", "")
		return nil
	case errors.Is(err, sink.ErrErasureKey):
		return &config.Error{Key: "erasure_key_file", Msg: strings.TrimPrefix(err.Error(), sink.ErrErasureKey.Error()+": ")}
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("preparing PostgreSQL: %w", err)
}

func kafkaTLS(cfg *config.Config) (*tls.Config, error) {
	t := cfg.Kafka.TLS
	if !t.Enabled {
		return nil, nil
	}
	return tlsConfig("kafka.tls", t.CAFile, t.CertFile, t.KeyFile)
}

// tlsConfig builds a client TLS configuration: the system's roots or the
// CA in caFile, and a client certificate when certFile is set. Errors name
// the key under prefix.
func tlsConfig(prefix, caFile, certFile, keyFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, &config.Error{Key: prefix + ".ca_file", Msg: err.Error()}
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &config.Error{Key: prefix + ".ca_file", Msg: "holds no PEM certificate"}
		}
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, &config.Error{Key: prefix + ".cert_file", Msg: err.Error()}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func kafkaSASL(cfg *config.Config) sasl.Mechanism {
	s := cfg.Kafka.SASL
	switch s.Mechanism {
	case "PLAIN":
		return plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		return scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism()
	case "OAUTHBEARER":
		// The token is read for each new connection's authentication, so
		// a token rotated in its file is picked up without a restart.
		token := &fileSecret{path: s.TokenFile}
		return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			t, err := token.get()
			if err != nil {
				return oauth.Auth{}, fmt.Errorf("kafka.sasl.token_file: %w", err)
			}
			return oauth.Auth{Token: t}, nil
		})
	case "AWS_MSK_IAM":
		// Credentials from the standard AWS chain (environment, shared
		// config and credentials files, web identity, ECS and EC2 roles),
		// refreshed by the SDK as they expire.
		region := s.AWSRegion
		creds := &awsCredentials{region: region}
		return saslaws.ManagedStreamingIAM(func(ctx context.Context) (saslaws.Auth, error) {
			cr, err := creds.retrieve(ctx)
			if err != nil {
				return saslaws.Auth{}, err
			}
			return saslaws.Auth{AccessKey: cr.AccessKeyID, SecretKey: cr.SecretAccessKey, SessionToken: cr.SessionToken, UserAgent: "scd2sink"}, nil
		})
	}
	return nil
}

// Verify checks every configured table's invariants, writes each violation
// to out, and returns how many it found.
func Verify(ctx context.Context, cfg *config.Config, out io.Writer) (int, error) {
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	router := config.NewRouter(cfg)
	tables, err := resolvedTables(ctx, pool, cfg, router)
	if err != nil {
		return 0, err
	}
	sc := SinkConfig(cfg, zap.NewNop())
	Route(cfg, router, debezium.New(nil, nil, nil), &sc)
	s, err := sink.New(sc, pool)
	if err != nil {
		return 0, &config.Error{Msg: err.Error()}
	}
	n := 0
	for _, t := range tables {
		if ok, err := tableExists(ctx, pool, cfg.Postgres.Schema, t.Target); err != nil {
			return n, err
		} else if !ok {
			fmt.Fprintf(out, "%s: no such table in schema %s (the service creates it at the table's first event; is postgres.schema right?)\n", t.Target, cfg.Postgres.Schema)
			n++
			continue
		}
		vs, err := s.Verify(ctx, t.Target)
		if err != nil {
			return n, err
		}
		for _, v := range vs {
			fmt.Fprintln(out, v.String())
			if v.More > 0 {
				n += int(v.More) // a line that counts those not listed
			} else {
				n++
			}
		}
		if len(vs) == 0 {
			fmt.Fprintf(out, "%s: ok\n", t.Target)
		}
	}
	return n, nil
}

// checkTopics resolves the topics in Kafka at start: conflicts among them
// (a topic matched by two patterns, two topics on one target, a target too
// long) are a configuration error, exit 2. When Kafka cannot be asked
// within a few seconds the check is skipped: topics then resolve as they
// come, the first keeping a contested target.
func checkTopics(ctx context.Context, cfg *config.Config, opts Options, router *config.Router, log *zap.Logger) error {
	if !router.HasPatterns() {
		return nil
	}
	adm, cl, err := opts.kafkaAdmin(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	listed, err := adm.ListTopics(lctx)
	if err != nil {
		log.Warn("listing Kafka's topics to check the topic patterns failed; topics are resolved as they come", zap.Error(err))
		return nil
	}
	return router.Check(listed.Names())
}

// awsCredentials loads the AWS configuration once (the standard chain)
// and hands out its credentials through the SDK's own cache, which
// refreshes them before they expire: every connection's SASL handshake
// does not load the configuration again. A failed load is tried again at
// the next handshake.
type awsCredentials struct {
	region string
	mu     sync.Mutex
	cfg    *aws.Config
}

func (a *awsCredentials) retrieve(ctx context.Context) (aws.Credentials, error) {
	a.mu.Lock()
	if a.cfg == nil {
		opts := []func(*awsconfig.LoadOptions) error{}
		if a.region != "" {
			opts = append(opts, awsconfig.WithRegion(a.region))
		}
		ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			a.mu.Unlock()
			return aws.Credentials{}, fmt.Errorf("loading AWS credentials: %w", err)
		}
		a.cfg = &ac
	}
	provider := a.cfg.Credentials // an aws.CredentialsCache: safe for concurrent use
	a.mu.Unlock()
	if provider == nil {
		return aws.Credentials{}, fmt.Errorf("retrieving AWS credentials: no credentials in the AWS chain")
	}
	cr, err := provider.Retrieve(ctx)
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("retrieving AWS credentials: %w", err)
	}
	return cr, nil
}

// warnPositionOnly warns of tables ordered by MySQL binlog positions
// alone (connector: mysql's default): exact on one server, wrong after a
// primary failover (docs/sources.md, MySQL).
func warnPositionOnly(cfg *config.Config, log *zap.Logger) {
	var tables []string
	for _, t := range cfg.Tables {
		if t.Connector == "mysql" && slices.Equal(t.SequenceBy, config.DefaultSequenceBy["mysql"]) {
			tables = append(tables, t.Target)
		}
	}
	if len(tables) > 0 {
		log.Warn("sequence_by is binlog positions only (connector: mysql's default): exact on one server, but a primary failover "+
			"starts new positions and the history goes wrong; with GTIDs on, set sequence_by: [source.ts_us, source.file, source.pos, source.row] "+
			"(MySQL) or use connector: mariadb (MariaDB); docs/sources.md", zap.Strings("tables", tables))
	}
}
