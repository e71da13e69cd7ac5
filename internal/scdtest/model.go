// Package scdtest holds what the tests of several packages share: the
// reference fold of DESIGN.md section 5 and readers that render history
// tables and model histories alike, line by line, for comparison.
package scdtest

import (
	"sort"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// Version is one version of the reference model.
type Version struct {
	key     string
	seq     string // change.Seq bytes
	row     map[string]any
	from    time.Time
	to      *time.Time
	current bool
	carried map[string]bool // the columns the opening event carried
	// deleted: a version opened by a delete under deletes: new_record.
	deleted bool
}

// Fold is the reference fold of DESIGN.md section 5, written as plainly
// as possible: group by key, drop exact duplicates, sort by sequence, fold.
// Truncates (events with a nil key) apply to every key: they close what is
// live and then move the key's time on.
func Fold(spec sink.TableSpec, cols []string, evs []*change.Event) []Version {
	tracked := map[string]bool{}
	if len(spec.TrackHistory) > 0 {
		for _, c := range spec.TrackHistory {
			tracked[c] = true
		}
	} else {
		for _, c := range cols {
			tracked[c] = !contains(spec.Keys, c)
		}
	}
	var type1 []string
	for _, c := range cols {
		if !tracked[c] && !contains(spec.Keys, c) {
			type1 = append(type1, c)
		}
	}
	byKey := map[string][]*change.Event{}
	var truncs []*change.Event
	seen := map[string]bool{}
	for _, e := range evs {
		if e.Table != spec.Target {
			continue
		}
		id := e.KeyID() + "\x00" + string(e.Seq)
		if seen[id] {
			continue // duplicates (the generator makes no conflicts)
		}
		seen[id] = true
		if e.Op == change.OpTruncate {
			truncs = append(truncs, e)
			continue
		}
		byKey[e.KeyID()] = append(byKey[e.KeyID()], e)
	}
	if spec.SnapshotDeletes {
		addSnapshotDeletes(spec, byKey, truncs, evs)
	}
	var out []Version
	for _, list := range byKey {
		list = append(list, truncs...)
		sort.SliceStable(list, func(i, j int) bool { return list[i].Seq.Compare(list[j].Seq) < 0 })
		var key []any
		for _, e := range list {
			if e.Key != nil {
				key = e.Key
				break
			}
		}
		var versions []*Version
		var live *Version
		var prevT time.Time
		hasPrev := false
		var prevAfter, lastAfter map[string]any
		closeLive := func(t time.Time) {
			tt := t
			live.to, live.current, live = &tt, false, nil
		}
		for _, e := range list {
			t := e.ValidFrom
			if hasPrev && prevT.After(t) {
				t = prevT
			}
			if e.Op == change.OpTruncate {
				if live != nil {
					closeLive(t)
					prevT, hasPrev = t, true
				}
				continue
			}
			prevT, hasPrev = t, true
			switch e.Op {
			case change.OpCreate, change.OpRead, change.OpUpdate:
				after := map[string]any{}
				carried := map[string]bool{}
				for _, c := range cols {
					v, ok := e.After[c]
					carried[c] = ok || contains(spec.Keys, c)
					if s, ok := v.(string); ok && s == change.Unavailable {
						v = nil
						if prevAfter != nil {
							v = prevAfter[c]
						}
					}
					after[c] = v
				}
				for i, k := range spec.Keys {
					after[k] = key[i]
				}
				prevAfter, lastAfter = after, after
				if live != nil && (live.deleted || e.Op == change.OpCreate || !sameCarried(after, carried, live, tracked)) {
					closeLive(t)
				}
				if live == nil {
					live = &Version{key: change.KeyID(key), seq: string(e.Seq), row: CopyMap(after), from: t, current: true, carried: CopyBools(carried)}
					versions = append(versions, live)
				} else {
					for _, c := range type1 {
						live.row[c] = after[c]
					}
					// A tracked column the version does not know (added
					// at the source since it opened) takes the value of
					// the first event that carries it; its next change
					// opens a version.
					for c, on := range tracked {
						if on && carried[c] && !live.carried[c] {
							live.row[c], live.carried[c] = after[c], true
						}
					}
				}
			case change.OpDelete:
				if spec.Deletes != sink.DeletesIgnore && live != nil && !live.deleted {
					closed := live
					closeLive(t)
					if spec.Deletes == sink.DeletesNewRecord {
						// A version marked deleted, with the closed
						// version's values, until the key comes back.
						live = &Version{key: closed.key, seq: string(e.Seq), row: CopyMap(closed.row), from: t, current: true,
							carried: CopyBools(closed.carried), deleted: true}
						versions = append(versions, live)
					}
				}
			}
		}
		if spec.Type1Scope != sink.CurrentVersion && lastAfter != nil {
			for _, v := range versions {
				for _, c := range type1 {
					v.row[c] = lastAfter[c]
				}
			}
		}
		for _, v := range versions {
			out = append(out, *v)
		}
	}
	return out
}

// addSnapshotDeletes adds, for every completed full snapshot of the table
// (an event with SnapshotEnd, at sequence S), a delete at S with the
// snapshot's time to each key the snapshot did not read whose events
// before S leave a version live (DESIGN.md section 5). Snapshots are taken
// in sequence order: a delete added for one counts for the next.
func addSnapshotDeletes(spec sink.TableSpec, byKey map[string][]*change.Event, truncs, evs []*change.Event) {
	var ends []*change.Event
	for _, e := range evs {
		if e.Table == spec.Target && e.SnapshotEnd {
			ends = append(ends, e)
		}
	}
	sort.SliceStable(ends, func(i, j int) bool { return ends[i].Seq.Compare(ends[j].Seq) < 0 })
	done := map[string]bool{}
	for _, end := range ends {
		s := end.Seq
		if done[string(s)] {
			continue
		}
		done[string(s)] = true
		for id, list := range byKey {
			live, read := false, false
			all := append(append([]*change.Event(nil), list...), truncs...)
			sort.SliceStable(all, func(i, j int) bool { return all[i].Seq.Compare(all[j].Seq) < 0 })
			var key []any
			for _, e := range all {
				if e.Key != nil && key == nil {
					key = e.Key
				}
				switch c := e.Seq.Compare(s); {
				case c == 0 && e.Key != nil:
					read = true
				case c < 0:
					switch e.Op {
					case change.OpCreate, change.OpRead, change.OpUpdate:
						live = true
					case change.OpDelete:
						// (Under new_record the version it opens is
						// marked deleted: not live.)
						live = live && spec.Deletes == sink.DeletesIgnore
					case change.OpTruncate:
						live = false
					}
				}
			}
			if live && !read {
				byKey[id] = append(list, &change.Event{Table: spec.Target, Key: key, Seq: s, Op: change.OpDelete, ValidFrom: end.ValidFrom})
			}
		}
	}
}

// sameCarried compares an image with the live version's over the tracked
// columns both carry (DESIGN.md section 11: tracking is by value; a column
// dropped or added alone opens no version).
func sameCarried(a map[string]any, carried map[string]bool, live *Version, cols map[string]bool) bool {
	for c, on := range cols {
		if on && carried[c] && live.carried[c] && change.Canon(a[c]) != change.Canon(live.row[c]) {
			return false
		}
	}
	return true
}

// CopyBools returns a copy of m.
func CopyBools(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// CopyMap returns a shallow copy of m.
func CopyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Retained returns the versions retention keeps at horizon: all but those
// closed before it (DESIGN.md section 12).
func Retained(vs []Version, horizon time.Time) []Version {
	var out []Version
	for _, v := range vs {
		if v.to == nil || !v.to.Before(horizon) {
			out = append(out, v)
		}
	}
	return out
}
