// Command scd2sink keeps SCD Type 2 history tables in PostgreSQL from
// Debezium change events in Kafka. `scd2sink help` lists its commands
// (help.go holds what each command's --help says); README.md and docs/
// are the manual.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/app"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// The garbage collector's defaults: a soft limit of 200 MiB
	// (GOMEMLIMIT), which the default buffers fit (the reorder buffer's 16
	// MiB, the sink's 32 MiB cache, three batches in flight), and, under
	// that limit of ours, no collection by growth (GOGC=off). The heap goes
	// to the limit in the first minute and stays there: the resident set
	// is flat from then on, however slowly the state cache fills (with
	// GOGC=200 it grew with the cache, by three times what the cache held,
	// for as long as new keys kept arriving: BenchmarkSoak), and the
	// collector runs less often than at any GOGC. GOGC and GOMEMLIMIT in
	// the environment override them; with GOMEMLIMIT set there (perhaps to
	// "off", or to the container's whole limit) and GOGC not, GOGC is 200:
	// growth, not only a limit someone else chose, starts the collections.
	gc := gcDefaults(os.Getenv)
	if gc.limit > 0 {
		debug.SetMemoryLimit(gc.limit)
	}
	if gc.setPercent {
		debug.SetGCPercent(gc.percent)
	}
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// gcSettings are the collector's settings main applies: a memory limit
// (0: the environment's) and a GOGC percentage when setPercent.
type gcSettings struct {
	limit      int64
	percent    int
	setPercent bool
}

// gcDefaults chooses them from the environment (see main).
func gcDefaults(getenv func(string) string) gcSettings {
	switch {
	case getenv("GOMEMLIMIT") == "":
		return gcSettings{limit: 200 << 20, percent: -1, setPercent: getenv("GOGC") == ""}
	case getenv("GOGC") == "":
		return gcSettings{percent: 200, setPercent: true}
	}
	return gcSettings{}
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stderr)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help", "-help":
		if len(rest) > 0 && cmd == "help" {
			return realMain(append(rest, "--help"), stdout, stderr) // help CMD: CMD --help
		}
		printUsage(stdout)
		return 0
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, versionLine())
		return 0
	case "dead-letters":
		if len(rest) == 0 || (rest[0] != "list" && rest[0] != "replay") {
			fmt.Fprintln(stderr, "scd2sink dead-letters: say list or replay (see scd2sink dead-letters list --help)")
			return 2
		}
		cmd, rest = cmd+" "+rest[0], rest[1:]
	}
	about, known := lookup(cmd)
	if !known {
		return unknownCommand(stderr, cmd)
	}
	fs := flag.NewFlagSet("scd2sink "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are said in one line, help on request (help.go)
	fs.Usage = func() {}
	var cfgPath *string
	if cmd != "init" && cmd != "demo" && cmd != "version" {
		cfgPath = fs.String("config", "", "the configuration `FILE` (default $SCD2SINK_CONFIG, then scd2sink.yaml)")
	}
	follow, leave, confirm, scratch := false, false, false, false
	if cmd == "run" {
		fs.BoolVar(&leave, "leave-group", false, "a static member leaves the group when it stops")
	}
	if cmd == "rebuild" {
		fs.BoolVar(&follow, "follow", false, "carry on as run after the swap")
		fs.BoolVar(&scratch, "from-scratch", false, "keep only what Kafka holds: carry none of the live tables' versions over")
	}
	var hq app.HistoryQuery
	var keyList string
	if cmd == "reconcile" {
		fs.StringVar(&hq.Table, "table", "", "the target `T` whose held reconciliation to apply")
		fs.BoolVar(&confirm, "confirm", false, "apply it")
	}
	var dq app.DeadLetterQuery
	var idList string
	if strings.HasPrefix(cmd, "dead-letters ") {
		fs.StringVar(&dq.Table, "table", "", "only the dead letters of target `T` (or of a topic)")
	}
	if cmd == "dead-letters list" {
		fs.StringVar(&dq.Since, "since", "", "only those written at or after this `TIME` (RFC 3339 or YYYY-MM-DD)")
	}
	if cmd == "dead-letters replay" {
		fs.StringVar(&idList, "id", "", "the dead letters' ids `N[,N...]`")
		fs.BoolVar(&dq.All, "all", false, "every dead letter not replayed")
	}
	if cmd == "history" {
		fs.StringVar(&hq.Table, "table", "", "a configured target `T`, or its topic")
		fs.StringVar(&keyList, "key", "", "the key's values `V[,V...]`, in key column order")
		fs.StringVar(&hq.At, "at", "", "print the version valid at this `TIME` (RFC 3339 or YYYY-MM-DD)")
	}
	var er app.EraseRequest
	if cmd == "erase" {
		fs.StringVar(&er.Table, "table", "", "the target `T`")
		fs.Func("key", "a key's values `V[,V...]`, in key column order (repeat for more keys)", func(v string) error {
			er.Keys = append(er.Keys, strings.Split(v, ","))
			return nil
		})
		fs.Func("key-json", "a key's values as a `JSON` array, for values holding commas: '[\"Smith, J\", 7]' (repeatable)", func(v string) error {
			key, err := jsonKey(v)
			if err == nil {
				er.Keys = append(er.Keys, key)
			}
			return err
		})
		fs.StringVar(&er.Reason, "reason", "", "why: a `TEXT` recorded with the erasure (never put the key here)")
		fs.BoolVar(&er.Lift, "lift", false, "allow the keys again instead of erasing them")
	}
	var iq app.ImportQuery
	if cmd == "import" {
		fs.StringVar(&iq.Table, "table", "", "the target `T` whose history to seed (or its topic)")
		fs.StringVar(&iq.From, "from", "", "the SCD2 table to import (`SCHEMA.TABLE`)")
		fs.StringVar(&iq.Layout, "layout", "", "`dbt`: a dbt snapshot (dbt_valid_from, dbt_valid_to, dbt_is_deleted)")
		fs.StringVar(&iq.ValidFrom, "valid-from", "", "another layout: the column `COL` where a version starts")
		fs.StringVar(&iq.ValidTo, "valid-to", "", "another layout: the column `COL` where a version ends (NULL while current)")
		fs.BoolVar(&iq.DryRun, "dry-run", false, "print what would be written and every invalid version; write nothing")
	}
	asJSON := false
	if cmd == "status" {
		fs.BoolVar(&asJSON, "json", false, "print /status.json's shape")
	}
	var initOpts app.InitOptions
	var brokers, topics string
	if cmd == "init" {
		fs.StringVar(&brokers, "brokers", "", "Kafka's bootstrap brokers `B[,B...]`")
		fs.StringVar(&initOpts.Registry, "registry", "", "the schema registry's `URL` (for Avro topics)")
		fs.StringVar(&topics, "topics", "", "only the topics this regular expression `RE` matches (whole names)")
		fs.StringVar(&initOpts.DSN, "dsn", "", "the warehouse's `DSN` (default: a placeholder to edit; its password is never written)")
		fs.DurationVar(&initOpts.Wait, "wait", 10*time.Second, "how long to wait for the topics' first records and the registry (a `DURATION` such as 10s)")
	}
	serve, once := false, false
	if cmd == "demo" {
		fs.BoolVar(&serve, "serve", false, "keep serving the status page after the story, even when the output is not a terminal")
		fs.BoolVar(&once, "once", false, "exit after the story, even on a terminal")
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout, about, fs)
			return 0
		}
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag --" + name
		}
		return badUsage(stderr, cmd, msg)
	}
	if fs.NArg() > 0 {
		return badUsage(stderr, cmd, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	switch cmd {
	case "demo":
		// Interrupted, it still stops the PostgreSQL it started; a second
		// Ctrl-C exits at once.
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sigs)
		go func() {
			if _, ok := <-sigs; !ok {
				return
			}
			stop()
			if _, ok := <-sigs; ok {
				os.Exit(1)
			}
		}()
		// On a terminal the demo keeps serving after its story; in a
		// script (output not a terminal) it exits. --serve, --once force.
		keep := serve || (!once && isTerminal(stdout))
		return exitCode(stderr, runDemo(ctx, stdout, keep))
	case "init":
		if brokers == "" {
			return badUsage(stderr, "init", "--brokers is required")
		}
		for _, b := range strings.Split(brokers, ",") {
			initOpts.Brokers = append(initOpts.Brokers, strings.TrimSpace(b))
		}
		if topics != "" {
			re, err := regexp.Compile("^(?:" + topics + ")$")
			if err != nil {
				return exitCode(stderr, &config.Error{Key: "--topics", Msg: err.Error()})
			}
			initOpts.Topics = re
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return exitCode(stderr, app.Init(ctx, initOpts, stdout))
	}
	cfg, err := config.Load(config.Path(*cfgPath))
	if err != nil {
		return exitCode(stderr, err)
	}
	log, err := newLogger(cfg.Log)
	if err != nil {
		return exitCode(stderr, err)
	}
	defer func() { _ = log.Sync() }()
	if cmd == "history" {
		if hq.Table == "" || keyList == "" {
			return badUsage(stderr, "history", "--table and --key are required")
		}
		hq.Key = strings.Split(keyList, ",")
		err := app.History(context.Background(), cfg, hq, stdout)
		if errors.Is(err, app.ErrNoVersions) {
			what := "no versions"
			if hq.At != "" {
				what = "no version valid at " + hq.At
			}
			fmt.Fprintf(stderr, "%s: key %s: %s\n", hq.Table, keyList, what)
			return 1
		}
		return exitCode(stderr, err)
	}
	if cmd == "dead-letters list" {
		return exitCode(stderr, app.ListDeadLetters(context.Background(), cfg, dq, stdout))
	}
	if cmd == "dead-letters replay" {
		for _, v := range strings.Split(idList, ",") {
			if v = strings.TrimSpace(v); v == "" {
				continue
			}
			id, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				fmt.Fprintf(stderr, "scd2sink dead-letters replay: --id %q is not a number\n", v)
				return 2
			}
			dq.IDs = append(dq.IDs, id)
		}
		return exitCode(stderr, app.ReplayDeadLetters(context.Background(), cfg, app.Options{Logger: log}, dq, stdout))
	}
	if cmd == "reconcile" {
		if hq.Table == "" {
			return badUsage(stderr, "reconcile", "--table is required")
		}
		return exitCode(stderr, app.Reconcile(context.Background(), cfg, app.Options{Logger: log}, hq.Table, confirm, stdout))
	}
	if cmd == "erase" {
		if er.Table == "" || len(er.Keys) == 0 {
			return badUsage(stderr, "erase", "--table and --key are required")
		}
		return exitCode(stderr, app.Erase(context.Background(), cfg, app.Options{Logger: log}, er, stdout))
	}
	if cmd == "import" {
		if iq.Table == "" || iq.From == "" {
			return badUsage(stderr, "import", "--table and --from are required")
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return exitCode(stderr, app.Import(ctx, cfg, app.Options{Logger: log}, iq, stdout))
	}
	if cmd == "status" {
		trouble, err := app.Status(context.Background(), cfg, app.Options{Logger: log, ConfigPath: config.Path(*cfgPath)}, asJSON, stdout)
		if err == nil && trouble {
			return 1
		}
		return exitCode(stderr, err)
	}
	if cmd == "tables" {
		return exitCode(stderr, app.Tables(context.Background(), cfg, app.Options{Logger: log}, stdout))
	}
	if cmd == "verify" {
		n, err := app.Verify(context.Background(), cfg, stdout)
		if err != nil {
			return exitCode(stderr, err)
		}
		if n > 0 {
			fmt.Fprintf(stderr, "%d violations\n", n)
			return 1
		}
		return 0
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		log.Info("signal received: draining", zap.String("signal", s.String()))
		cancel()
		s = <-sigs
		log.Warn("second signal: exiting at once", zap.String("signal", s.String()))
		os.Exit(1)
	}()
	if path := os.Getenv("SCD2SINK_CPUPROFILE"); path != "" {
		stop, err := cpuProfile(path)
		if err != nil {
			return exitCode(stderr, err)
		}
		defer stop()
	}
	if path := os.Getenv("SCD2SINK_MEMPROFILE"); path != "" {
		defer memProfile(path, log)
	}
	log.Info("starting", zap.String("command", cmd), zap.String("version", version), zap.Int("tables", len(cfg.Tables)))
	run := func() error {
		return app.Run(ctx, cfg, app.Options{Logger: log, LeaveGroup: leave, ConfigPath: config.Path(*cfgPath), Version: moduleVersion()})
	}
	if cmd == "rebuild" {
		run = func() error {
			return app.Rebuild(ctx, cfg, app.Options{Logger: log}, app.RebuildMode{Follow: follow, FromScratch: scratch})
		}
	}
	if err := run(); err != nil {
		log.Error("stopped", zap.Error(err))
		return exitCode(stderr, err)
	}
	log.Info("stopped cleanly")
	return 0
}

// cpuProfile writes a CPU profile of the whole run to path
// (SCD2SINK_CPUPROFILE, for benchmarks: BenchmarkPipeline reads it per
// stage); the returned func ends it.
func cpuProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("SCD2SINK_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("SCD2SINK_CPUPROFILE: %w", err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// memProfile writes the allocations of the whole run to path
// (SCD2SINK_MEMPROFILE, for benchmarks).
func memProfile(path string, log *zap.Logger) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		log.Warn("SCD2SINK_MEMPROFILE not written", zap.Error(err))
	}
}

// exitCode prints err and maps it to an exit code: 2 for configuration
// errors, 1 for anything else.
func exitCode(stderr io.Writer, err error) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "scd2sink:", err)
	var ce *config.Error
	if errors.As(err, &ce) {
		return 2
	}
	return 1
}

// newLogger is the service's logger on stderr: JSON (or console) lines
// whose times are ISO 8601 in UTC with milliseconds ("ts":
// "2026-12-07T10:54:44.908Z"), as log shippers and people read them.
func newLogger(l config.Log) (*zap.Logger, error) {
	return loggerTo(l, zapcore.Lock(os.Stderr))
}

func loggerTo(l config.Log, w zapcore.WriteSyncer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(l.Level)
	if err != nil {
		return nil, &config.Error{Key: "log.level", Msg: err.Error()}
	}
	ec := zap.NewProductionEncoderConfig()
	opts := []zap.Option{zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(w)}
	if l.Format == "console" {
		ec = zap.NewDevelopmentEncoderConfig()
		opts = opts[:1]
	}
	ec.EncodeTime = func(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
		enc.AppendString(t.UTC().Format("2006-01-02T15:04:05.000Z"))
	}
	enc := zapcore.NewJSONEncoder(ec)
	if l.Format == "console" {
		enc = zapcore.NewConsoleEncoder(ec)
	}
	// As zap's production configuration: the first 100 lines of a kind
	// each second, then every 100th.
	core := zapcore.NewSamplerWithOptions(zapcore.NewCore(enc, w, zap.NewAtomicLevelAt(level)), time.Second, 100, 100)
	return zap.New(core, opts...), nil
}

// jsonKey reads erase's --key-json: a JSON array of a key's values,
// strings as they are, numbers and booleans as their JSON text.
func jsonKey(v string) ([]string, error) {
	var vals []json.RawMessage
	if err := json.Unmarshal([]byte(v), &vals); err != nil || len(vals) == 0 {
		return nil, fmt.Errorf("want a JSON array of the key's values, e.g. [\"Smith, J\", 7]")
	}
	key := make([]string, len(vals))
	for i, raw := range vals {
		var s string
		switch {
		case string(raw) == "null": // before Unmarshal, which takes null for ""
			return nil, fmt.Errorf("value %d is null: a key has no null values", i+1)
		case json.Unmarshal(raw, &s) == nil:
			key[i] = s
		case raw[0] == '{' || raw[0] == '[':
			return nil, fmt.Errorf("value %d is %s: a key's values are strings, numbers or booleans", i+1, raw)
		default:
			key[i] = string(raw)
		}
	}
	return key, nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
