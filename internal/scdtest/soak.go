package scdtest

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Soak is an endless stream of real-shaped changes over many tables of
// the benchmark customers' shape (SoakSource), for runs of hours: each
// Next is a create of a new key (NewKeys of the time while the
// population grows), a tracked update (55 %), a Type-1-only update
// (25 %), a delete with its tombstone (5 %) or the re-create of a deleted
// key. A key's state is two counters, so an hour of new keys (a million
// or more) costs the generator little; its row is derived from them.
type Soak struct {
	rng    *rand.Rand
	srcs   []*Source
	keys   [][]soakKey // per table
	fixed  int         // key population per table (0: new keys keep arriving)
	lsn    int64
	tx     int64
	events int64
}

type soakKey struct {
	tracked, type1 int32 // versions of the tracked and the Type 1 columns
	deleted        bool
}

// NewKeys is the share of a growing population's changes that create a
// key never seen before.
const NewKeys = 0.15

// SoakSource is the soak's table i: the benchmark customers' columns in
// table t<i>, topic bench.public.t<i>. Tracked: BenchTracked["customers"].
func SoakSource(i int) *Source {
	s := BenchCustomers()
	s.Table = fmt.Sprintf("t%02d", i)
	return s
}

// NewSoak returns a stream over tables tables; fixed > 0 holds each
// table's key population at fixed keys (created first, then only
// changed, deleted and re-created), 0 lets new keys arrive all the time.
func NewSoak(rng *rand.Rand, tables, fixed int) *Soak {
	s := &Soak{rng: rng, keys: make([][]soakKey, tables), fixed: fixed, lsn: 1 << 24, tx: 1000}
	for i := range tables {
		s.srcs = append(s.srcs, SoakSource(i))
	}
	return s
}

// Sources are the stream's tables.
func (s *Soak) Sources() []*Source { return s.srcs }

// Next is the stream's next change (a delete is followed by its
// tombstone: two records), committed at at.
func (s *Soak) Next(at time.Time) []BenchRecord {
	t := s.rng.IntN(len(s.srcs))
	keys := s.keys[t]
	s.lsn += 56
	s.tx++
	s.events++
	c := Change{LSN: s.lsn, PrevLSN: s.lsn - 56, TxID: s.tx, Commit: at}
	grow := len(keys) == 0 || (s.fixed == 0 && s.rng.Float64() < NewKeys) || (s.fixed > 0 && len(keys) < s.fixed)
	if grow {
		s.keys[t] = append(keys, soakKey{})
		c.Op, c.After = "c", soakRow(len(keys), soakKey{}, s.events)
		return []BenchRecord{{Src: s.srcs[t], Change: c}}
	}
	k := s.rng.IntN(len(keys))
	st := &keys[k]
	r := s.rng.IntN(100)
	switch {
	case st.deleted:
		st.deleted = false
		st.tracked++
		c.Op, c.After = "c", soakRow(k, *st, s.events)
	case r < 5:
		st.deleted = true
		c.Op, c.Before = "d", Row{"id": k}
		return []BenchRecord{{Src: s.srcs[t], Change: c}, {Src: s.srcs[t], Change: c, Tombstone: true}}
	case r < 30:
		st.type1++
		c.Op, c.After = "u", soakRow(k, *st, s.events)
	default:
		st.tracked++
		c.Op, c.After = "u", soakRow(k, *st, s.events)
	}
	return []BenchRecord{{Src: s.srcs[t], Change: c}}
}

// soakRow is key k's row at state st; n varies the Type 1 columns'
// values.
func soakRow(k int, st soakKey, n int64) Row {
	at := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(k) * time.Minute)
	v := int(st.tracked)
	return Row{"id": k, "name": fmt.Sprintf("customer %d v%d", k, st.type1), "plan": benchPlans[(k+v)%4],
		"city": benchCities[(k+v/4)%5], "score": v,
		"balance": DecimalB64(strconv.Itoa(k*137%1000000 - 500000)), "birth": 3000 + k%20000, "signed_up": Zoned(at),
		"attrs": fmt.Sprintf(`{"tier": %d, "tags": ["a", "b"], "seen": %d}`, k%5, n),
		"bio":   strings.Repeat(fmt.Sprintf("Customer %d likes long walks. ", k), 10)}
}
