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
				for _, c := range cols {
					v := e.After[c]
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
				if live != nil && (e.Op == change.OpCreate || !sameValues(after, live.row, tracked)) {
					closeLive(t)
				}
				if live == nil {
					live = &Version{key: change.KeyID(key), seq: string(e.Seq), row: CopyMap(after), from: t, current: true}
					versions = append(versions, live)
				} else {
					for _, c := range type1 {
						live.row[c] = after[c]
					}
				}
			case change.OpDelete:
				if spec.Deletes != sink.DeletesIgnore && live != nil {
					closeLive(t)
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

func sameValues(a, b map[string]any, cols map[string]bool) bool {
	for c, on := range cols {
		if on && change.Canon(a[c]) != change.Canon(b[c]) {
			return false
		}
	}
	return true
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
