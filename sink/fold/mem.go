package fold

import (
	"github.com/scd2sink/scd2sink/internal/change"
)

// Mem hands out the states, versions and short lists one transaction
// works on, a slab at a time: one allocation per slab instead of one per
// key. Nothing keeps them past the transaction (the cache packs or
// detaches the states it keeps). A Mem belongs to one goroutine; a nil
// *Mem allocates each one apart.
type Mem struct {
	lats  []Latest
	vers  []Version
	lists []*Version
	sides []Event
	// Boxes holds the values of the rows the transaction writes (one
	// goroutine at a time: the transaction's, or pgx's COPY while it
	// waits).
	Boxes change.Boxes
}

// room returns an empty slice with room for n elements, from the slab:
// capped, so that an append past n moves it to the heap rather than into
// the next one's room.
func room[T any](slab *[]T, n, limit int) []T {
	if cap(*slab)-len(*slab) < n {
		*slab = make([]T, 0, limit)
	}
	at := len(*slab)
	*slab = (*slab)[:at+n]
	return (*slab)[at : at : at+n]
}

// Latest returns a zero Latest from m.
func (m *Mem) Latest() *Latest {
	if m == nil {
		return new(Latest)
	}
	return change.Take(&m.lats)
}

// Version returns a zero Version from m.
func (m *Mem) Version() *Version {
	if m == nil {
		return new(Version)
	}
	return change.Take(&m.vers)
}

// VersionList is an empty list with room for the versions most folds
// touch.
func (m *Mem) VersionList() []*Version {
	if m == nil {
		return nil
	}
	return room(&m.lists, 4, 1024)
}

// SideList is an empty list with room for the side rows most folds write.
func (m *Mem) SideList() []Event {
	if m == nil {
		return nil
	}
	return room(&m.sides, 2, 128)
}

// Row returns a copy of r that its caller may write, from m's boxes (nil
// m: the heap).
func (m *Mem) Row(r []any) []any {
	if m == nil || r == nil {
		return append([]any(nil), r...)
	}
	c := m.Boxes.Anys(len(r))
	copy(c, r)
	return c
}
