// Package status assembles what an operator reads at a glance — per
// target its topics, state, lag, completeness, versions, dead letters by
// reason and held reconciliations, and the group's members with their
// partitions — and serves it as a page (GET /) and as JSON
// (GET /status.json); `scd2sink status` prints the same report.
//
// The report comes from Kafka (end offsets, the group's description) and
// PostgreSQL (the service's tables and the history tables), read only:
// nothing here writes, and on a database the service never wrote it says
// there is nothing yet instead of creating anything. A running process
// adds what only it knows (Live: which targets are parked and why) and
// keeps the last 15 minutes of each target's progress for the charts
// (Run). That is enough: every other figure is durable state, so a
// report read from outside a process agrees with one a process serves.
//
// Invariants: nothing on the report is an event's value, a dead letter's
// key or a secret. It holds names (targets, topics, members), counts,
// times and value-free error summaries (sink.Summary) only.
package status

import (
	"time"
)

// The states of a target.
const (
	StateApplying   = "applying"    // events wait to be applied
	StateCaughtUp   = "caught_up"   // everything in its topics is applied
	StateParked     = "parked"      // its writes fail; the other targets go on
	StateRebuilding = "rebuilding"  // a rebuild fills fresh tables from its topics
	StateNothingYet = "nothing_yet" // no history table and nothing to apply yet
	StateUnknown    = "unknown"     // PostgreSQL could not be read
)

// Report is the status of the service, in the shape of /status.json.
type Report struct {
	// GeneratedAt is when it was read.
	GeneratedAt time.Time `json:"generated_at"`
	// Source says where it comes from: a running instance, or Kafka and
	// PostgreSQL read from outside one (then without parked states).
	Source string `json:"source"`
	// Note says what the report cannot know, when anything.
	Note    string   `json:"note,omitempty"`
	Targets []Target `json:"targets"`
	Group   Group    `json:"group"`
	// Errors are what could not be read (a side down): the figures that
	// depend on it are null.
	Errors []string `json:"errors,omitempty"`
	// OtherDeadLetters counts, by target and reason, the dead letters not
	// replayed of targets the report does not list (no target, a table
	// no longer configured); OtherReplayCommand lists them.
	OtherDeadLetters   map[string]map[string]int64 `json:"other_dead_letters,omitempty"`
	OtherReplayCommand string                      `json:"other_command,omitempty"`
}

// NeedsAttention reports whether an operator is needed: a target in
// trouble, dead letters of other targets, or a side that cannot be read.
func (r Report) NeedsAttention() bool {
	for _, t := range r.Targets {
		if t.Trouble() {
			return true
		}
	}
	return len(r.OtherDeadLetters) > 0 || len(r.Errors) > 0
}

// Target is one history table's status.
type Target struct {
	Target string   `json:"target"`
	Topics []string `json:"topics"`
	// State is one of the State constants; Reason says why it is parked.
	State       string     `json:"state"`
	Reason      string     `json:"reason,omitempty"`
	ParkedSince *time.Time `json:"parked_since,omitempty"`
	// LagEvents is the records of its topics not applied yet: the logs'
	// ends less the offsets recorded in PostgreSQL.
	LagEvents *int64 `json:"lag_events"`
	// LagSeconds is how far complete_through trails the clock.
	LagSeconds      *float64   `json:"lag_seconds"`
	CompleteThrough *time.Time `json:"complete_through"`
	// Versions is the history table's row count; an estimate
	// (PostgreSQL's statistics) when VersionsEstimated, for big tables.
	Versions          *int64 `json:"versions"`
	VersionsEstimated bool   `json:"versions_estimated,omitempty"`
	// DeadLetters counts the dead letters not replayed, by reason;
	// ReplayCommand replays them once their cause is fixed.
	DeadLetters   map[string]int64 `json:"dead_letters"`
	ReplayCommand string           `json:"replay_command,omitempty"`
	// HeldReconciliations counts the snapshot reconciliations the guard
	// holds; Held says what they would do; ConfirmCommand applies them.
	HeldReconciliations int    `json:"held_reconciliations"`
	Held                string `json:"held,omitempty"`
	ConfirmCommand      string `json:"confirm_command,omitempty"`

	chart chart
}

// Trouble reports whether the target needs an operator: parked, dead
// letters pending or a reconciliation held.
func (t Target) Trouble() bool {
	return t.State == StateParked || t.State == StateUnknown || t.Pending() > 0 || t.HeldReconciliations > 0
}

// Pending is the number of its dead letters not replayed.
func (t Target) Pending() int64 {
	var n int64
	for _, c := range t.DeadLetters {
		n += c
	}
	return n
}

// Group is the consumer group and who holds which partitions.
type Group struct {
	GroupID string   `json:"group_id"`
	State   string   `json:"state,omitempty"`
	Members []Member `json:"members"`
}

// Member is one member of the group.
type Member struct {
	ID         string            `json:"id"`
	ClientID   string            `json:"client_id"`
	InstanceID string            `json:"instance_id,omitempty"`
	Host       string            `json:"host"`
	Partitions []TopicPartitions `json:"partitions"`
}

// TopicPartitions is a topic's partitions a member holds.
type TopicPartitions struct {
	Topic      string  `json:"topic"`
	Partitions []int32 `json:"partitions"`
}
