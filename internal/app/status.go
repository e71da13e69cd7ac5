package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/status"
)

// Status prints the status report: a running instance's, read from its
// http.addr when one answers there, else one read from Kafka and
// PostgreSQL (without the states only a running process knows, which it
// says). With asJSON it prints /status.json's shape. It reports whether
// a target needs an operator: parked, dead letters pending, or a
// reconciliation held.
func Status(ctx context.Context, cfg *config.Config, opts Options, asJSON bool, out io.Writer) (bool, error) {
	rep, from, err := fromInstance(ctx, cfg)
	if err != nil {
		pool, perr := Pool(ctx, cfg)
		if perr != nil {
			return false, perr
		}
		defer pool.Close()
		adm, cl, kerr := opts.kafkaAdmin(cfg)
		if kerr != nil {
			return false, kerr
		}
		defer cl.Close()
		o := statusOptions(cfg, opts)
		o.Rebuilding = false
		rep = status.New(cfg, o, pool, adm, nil).Collect(ctx)
		rep.Note = fmt.Sprintf("no running instance answered at %s (%v): %s", statusURL(cfg), err, rep.Note)
		from = "Kafka and PostgreSQL"
	}
	trouble := rep.NeedsAttention()
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return trouble, enc.Encode(rep)
	}
	printStatus(out, rep, from)
	return trouble, nil
}

// statusOptions are the status report's options of cfg.
func statusOptions(cfg *config.Config, opts Options) status.Options {
	return status.Options{ConfigPath: opts.ConfigPath, Rebuilding: cfg.Rebuilding, RebuildGroup: cfg.Kafka.GroupID + RebuildSuffix,
		SampleEvery: opts.statusEvery}
}

// statusURL is where a running instance of cfg serves its report: its
// http.addr, a wildcard host read as loopback.
func statusURL(cfg *config.Config) string {
	addr := cfg.HTTPAddr()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/status.json"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/status.json"
}

// fromInstance reads a running instance's report, within 15 s (its own
// reads take at most 10).
func fromInstance(ctx context.Context, cfg *config.Config) (status.Report, string, error) {
	var rep status.Report
	if cfg.HTTPAddr() == "" {
		return rep, "", fmt.Errorf("http.addr is empty")
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	url := statusURL(cfg)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return rep, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return rep, "", fmt.Errorf("nothing listens")
	case errors.Is(err, context.DeadlineExceeded):
		return rep, "", fmt.Errorf("no answer within 15 s")
	case err != nil:
		return rep, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return rep, "", fmt.Errorf("it answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || rep.Source == "" {
		return rep, "", fmt.Errorf("what answers is not scd2sink's status")
	}
	if rep.Group.GroupID != cfg.Kafka.GroupID {
		return rep, "", fmt.Errorf("the instance there runs group %s, not %s", rep.Group.GroupID, cfg.Kafka.GroupID)
	}
	return rep, "the running instance at " + strings.TrimSuffix(url, "/status.json"), nil
}

// printStatus writes the report for people: a line per target, then what
// needs doing, then the group.
func printStatus(out io.Writer, rep status.Report, from string) {
	fmt.Fprintf(out, "group %s, read %s from %s\n", rep.Group.GroupID, rep.GeneratedAt.Format(time.RFC3339), from)
	if rep.Note != "" {
		fmt.Fprintf(out, "note: %s\n", rep.Note)
	}
	fmt.Fprintln(out)
	if len(rep.Targets) == 0 {
		fmt.Fprintln(out, "nothing yet: no table is configured, or none a pattern matches was applied")
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSTATE\tLAG\tCOMPLETE THROUGH\tVERSIONS\tDEAD LETTERS\tHELD")
	for _, t := range rep.Targets {
		lag := "?"
		if t.LagEvents != nil {
			lag = fmt.Sprint(*t.LagEvents)
		}
		through := "-"
		if t.CompleteThrough != nil {
			through = t.CompleteThrough.Format(time.RFC3339)
		}
		versions := "-"
		if t.Versions != nil {
			versions = fmt.Sprint(*t.Versions)
			if t.VersionsEstimated {
				versions = "~" + versions
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", t.Target, t.State, lag, through, versions, t.Pending(), t.HeldReconciliations)
	}
	_ = tw.Flush()
	first := true
	todo := func(format string, args ...any) {
		if first {
			fmt.Fprintln(out, "\nneeds attention:")
			first = false
		}
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}
	for _, e := range rep.Errors {
		todo("cannot read %s", e)
	}
	for _, target := range slices.Sorted(maps.Keys(rep.OtherDeadLetters)) {
		var n int64
		for _, c := range rep.OtherDeadLetters[target] {
			n += c
		}
		if target == "" {
			target = "(no target)"
		}
		todo("%d dead letters of %s, a table not listed here: %s", n, target, rep.OtherReplayCommand)
	}
	for _, t := range rep.Targets {
		if t.State == status.StateParked {
			todo("%s is parked: %s", t.Target, t.Reason)
		}
		if n := t.Pending(); n > 0 {
			var by []string
			for _, r := range slices.Sorted(maps.Keys(t.DeadLetters)) {
				by = append(by, fmt.Sprintf("%d %s", t.DeadLetters[r], r))
			}
			todo("%s has %d dead letters (%s); once their cause is fixed: %s", t.Target, n, strings.Join(by, ", "), t.ReplayCommand)
		}
		if t.HeldReconciliations > 0 {
			todo("%s has a snapshot reconciliation held (%s); to apply it: %s", t.Target, t.Held, t.ConfirmCommand)
		}
	}
	fmt.Fprintf(out, "\nmembers of group %s:", rep.Group.GroupID)
	if len(rep.Group.Members) == 0 {
		fmt.Fprint(out, " none running")
	}
	fmt.Fprintln(out)
	for _, m := range rep.Group.Members {
		var parts []string
		for _, tp := range m.Partitions {
			ps := make([]string, len(tp.Partitions))
			for i, p := range tp.Partitions {
				ps[i] = fmt.Sprint(p)
			}
			parts = append(parts, tp.Topic+"["+strings.Join(ps, ",")+"]")
		}
		fmt.Fprintf(out, "  %s (%s, %s): %s\n", m.ID, m.ClientID, m.Host, strings.Join(parts, " "))
	}
}
