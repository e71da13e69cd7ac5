package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/scd2sink/scd2sink/config"
)

// command is what `scd2sink CMD --help` says about a command.
type command struct {
	name     string
	synopsis string // its arguments
	summary  string // one line, for the list of commands
	about    string // what it does, a paragraph
	example  string
	exits    [][2]string // exit code, what it means
}

// Exit codes every command shares.
var (
	exitConfig = [2]string{"2", "a flag or the configuration is wrong (the message names it)"}
	exitFailed = [2]string{"1", "it failed (the message says what)"}
)

var commands = []command{
	{name: "run", synopsis: "--config FILE [--leave-group]", summary: "consume continuously, keeping the history tables",
		about: "Reads the configured topics, orders each key's events by their sequence and keeps each target's SCD Type 2 history " +
			"in PostgreSQL, committing offsets only after PostgreSQL commits. Serves /metrics, /healthz, /readyz and the status page " +
			"(/ and /status.json) on http.addr. The first SIGINT or SIGTERM drains; a second one exits at once. With --leave-group a " +
			"static member (kafka.instance_id) also leaves the group when it stops (a scale-down).",
		example: "scd2sink run --config /etc/scd2sink/scd2sink.yaml",
		exits:   [][2]string{{"0", "stopped cleanly after a signal"}, exitFailed, exitConfig}},
	{name: "status", synopsis: "--config FILE [--json]", summary: "what each table is doing and what needs attention",
		about: "Prints, per target, its state (applying, caught_up, parked, rebuilding), lag, complete_through, versions, dead letters " +
			"by reason and held reconciliations, with the commands that put them right, and the group's members. It asks the running " +
			"instance at http.addr; when none answers it reads Kafka and PostgreSQL itself (then it cannot know which tables are " +
			"parked, and says so). --json prints the shape of /status.json.",
		example: "scd2sink status --config scd2sink.yaml",
		exits:   [][2]string{{"0", "no table needs attention"}, {"1", "a table is parked, has dead letters or a held reconciliation, or the status could not be read"}, exitConfig}},
	{name: "tables", synopsis: "--config FILE", summary: "every matched topic, its target, keys, tracked columns, versions, lag",
		about:   "Lists every topic the configuration matches with its target, key columns, tracked columns, versions, lag and complete_through, straight from Kafka and PostgreSQL; skipped topics say why.",
		example: "scd2sink tables --config scd2sink.yaml",
		exits:   [][2]string{{"0", "listed"}, exitFailed, exitConfig}},
	{name: "verify", synopsis: "--config FILE", summary: "check the history invariants",
		about: "Checks every configured history table: one current version per key, no overlaps or gaps the fold would not make, " +
			"valid_from <= valid_to, and that the table exists. Prints each violation, or `TABLE: ok`.",
		example: "scd2sink verify --config scd2sink.yaml",
		exits:   [][2]string{{"0", "every table is as the fold makes it"}, {"1", "a violation, or a configured table that does not exist"}, exitConfig}},
	{name: "history", synopsis: "--config FILE --table T --key V[,V...] [--at TIME]", summary: "print a key's versions",
		about:   "Prints the versions of one key (its values in key column order) of target T (or its topic), or with --at the version valid at TIME.",
		example: "scd2sink history --config scd2sink.yaml --table customers_history --key C1001 --at 2026-02-15",
		exits:   [][2]string{{"0", "printed"}, {"1", "the key has no version (at TIME), or it failed"}, exitConfig}},
	{name: "dead-letters list", synopsis: "--config FILE [--table T] [--since TIME]", summary: "the dead letters not replayed",
		about:   "Lists the dead letters not replayed yet: id, time, topic, partition, offset, key and error. On a database the service never wrote it says there are none.",
		example: "scd2sink dead-letters list --config scd2sink.yaml --table customers_history",
		exits:   [][2]string{{"0", "listed"}, exitFailed, exitConfig}},
	{name: "dead-letters replay", synopsis: "--config FILE (--id N[,N...] | --table T | --all)", summary: "apply dead letters again",
		about: "Applies dead letters again through the normal path, as late events of their keys, once their cause is fixed (a column " +
			"widened, a registry restored). Prints what was applied and what failed again; those stay dead letters with the new error.",
		example: "scd2sink dead-letters replay --config scd2sink.yaml --table customers_history",
		exits:   [][2]string{{"0", "every one applied"}, {"1", "some failed again, or it failed"}, exitConfig}},
	{name: "reconcile", synopsis: "--config FILE --table T --confirm", summary: "apply a held snapshot reconciliation",
		about: "Applies the snapshot reconciliation of T that the guard (snapshot_deletes_max_fraction) held because it would close " +
			"too many keys. Without --confirm it prints what it would close and changes nothing.",
		example: "scd2sink reconcile --config scd2sink.yaml --table customers_history --confirm",
		exits:   [][2]string{{"0", "applied"}, exitFailed, {"2", "without --confirm (what it would do is printed), or a wrong flag or configuration"}}},
	{name: "erase", synopsis: "--config FILE --table T (--key V[,V...] | --key-json JSON)... [--reason TEXT] [--lift]", summary: "remove every trace of keys",
		about: "Removes every trace of the keys from T (versions, side rows, repair audits, dead letters) and keeps them from coming " +
			"back; the erasure is recorded as a keyed hash (erasure_key_file). --lift allows the keys again. Use --key-json for values " +
			"holding commas.",
		example: "scd2sink erase --config scd2sink.yaml --table customers_history --key C1001 --reason 'GDPR request 2026-114'",
		exits:   [][2]string{{"0", "erased"}, exitFailed, exitConfig}},
	{name: "rebuild", synopsis: "--config FILE [--follow] [--from-scratch]", summary: "rebuild the history tables from Kafka",
		about: "Replays every topic from its earliest offset into fresh tables, carries over the live versions whose events Kafka no " +
			"longer holds, and swaps them in when caught up. --follow carries on as run; --from-scratch keeps only what Kafka holds.",
		example: "scd2sink rebuild --config scd2sink.yaml --follow",
		exits:   [][2]string{{"0", "swapped in (or stopped cleanly with --follow)"}, exitFailed, exitConfig}},
	{name: "import", synopsis: "--config FILE --table T --from SCHEMA.TABLE [--layout dbt | --valid-from COL --valid-to COL] [--dry-run]",
		summary: "seed a history from an SCD2 table kept elsewhere",
		about: "Seeds T's history from an SCD2 table kept elsewhere (a dbt snapshot, a MERGE's table). Refuses a table with " +
			"overlapping or inverted versions and lists them; idempotent; may run beside run.",
		example: "scd2sink import --config scd2sink.yaml --table customers_history --from analytics.customers_snapshot --layout dbt",
		exits:   [][2]string{{"0", "imported (or, with --dry-run, nothing invalid)"}, exitFailed, exitConfig}},
	{name: "init", synopsis: "--brokers B[,B...] [--registry URL] [--topics RE] [--dsn DSN] [--wait D]", summary: "write a first configuration",
		about: "Writes a first configuration for the cluster's Debezium topics to stdout, from one record of each (format, connector, " +
			"key, columns). The DSN's password is never written: the file names an environment variable for it.",
		example: "scd2sink init --brokers kafka:9092 --topics 'shop\\..*' > scd2sink.yaml",
		exits:   [][2]string{{"0", "written"}, exitFailed, {"2", "a wrong flag"}}},
	{name: "demo", synopsis: "[--serve | --once]", summary: "play a scripted scenario and show its history",
		about: "Plays a scripted scenario in-process (Kafka in memory, a local or embedded PostgreSQL) and prints the configuration it " +
			"uses, each step and the history it built. On a terminal it then keeps serving the status page and /metrics, and prints " +
			"the PostgreSQL DSN, until Ctrl-C; --serve and --once force either.",
		example: "scd2sink demo",
		exits:   [][2]string{{"0", "played"}, exitFailed}},
	{name: "version", summary: "the version, VCS revision and Go version (also --version)", example: "scd2sink version",
		exits: [][2]string{{"0", "printed"}}},
	{name: "help", synopsis: "[COMMAND]", summary: "this list, or a command's help (also -h, --help, COMMAND --help)", example: "scd2sink help history",
		exits: [][2]string{{"0", "printed"}}},
}

// lookup is the command named name.
func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// names are the commands' names, dead-letters once.
func names() []string {
	var out []string
	for _, c := range commands {
		n, _, _ := strings.Cut(c.name, " ")
		if len(out) == 0 || out[len(out)-1] != n {
			out = append(out, n)
		}
	}
	return out
}

// printUsage writes the list of commands.
func printUsage(w io.Writer) {
	fmt.Fprintln(w, "scd2sink keeps SCD Type 2 history tables in PostgreSQL from Debezium change events in Kafka.")
	fmt.Fprintln(w, "\nusage: scd2sink COMMAND [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-20s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\n`scd2sink COMMAND --help` explains a command, its flags and exit codes.")
	fmt.Fprintln(w, "--config defaults to $SCD2SINK_CONFIG, then scd2sink.yaml.")
}

// printHelp writes a command's help: what it does, its flags (from fs,
// when it has any), an example and its exit codes.
func printHelp(w io.Writer, c command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "scd2sink %s: %s\n\nusage: scd2sink %s %s\n", c.name, c.summary, c.name, c.synopsis)
	if c.about != "" {
		fmt.Fprintf(w, "\n%s\n", wrap(c.about, 76))
	}
	if fs != nil {
		first := true
		fs.VisitAll(func(f *flag.Flag) {
			if first {
				fmt.Fprintln(w, "\nflags:")
				first = false
			}
			name, usage := flag.UnquoteUsage(f)
			arg := "--" + f.Name
			if name != "" {
				arg += " " + name
			}
			if f.DefValue != "" && f.DefValue != "false" {
				usage += " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(w, "  %-22s %s\n", arg, usage)
		})
	}
	fmt.Fprintf(w, "\nexample:\n  %s\n\nexit codes:\n", c.example)
	for _, e := range c.exits {
		fmt.Fprintf(w, "  %s  %s\n", e[0], e[1])
	}
}

// wrap breaks text into lines of at most width characters.
func wrap(text string, width int) string {
	var b strings.Builder
	n := 0
	for _, word := range strings.Fields(text) {
		if n > 0 && n+1+len(word) > width {
			b.WriteByte('\n')
			n = 0
		} else if n > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}

// badUsage writes one line saying what is wrong with a command line and
// where help is, and returns exit code 2.
func badUsage(w io.Writer, cmd, msg string) int {
	hint := "scd2sink " + cmd + " --help"
	if cmd == "" {
		cmd, hint = "", "scd2sink help"
	} else {
		cmd = " " + cmd
	}
	fmt.Fprintf(w, "scd2sink%s: %s (see %s)\n", cmd, msg, hint)
	return 2
}

// unknownCommand is badUsage for a command that does not exist.
func unknownCommand(w io.Writer, name string) int {
	msg := fmt.Sprintf("unknown command %q", name)
	if near := config.Nearest(strings.TrimLeft(name, "-"), names()); near != "" {
		msg += fmt.Sprintf("; did you mean %s?", near)
	}
	return badUsage(w, "", msg)
}
