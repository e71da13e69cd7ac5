package sink

import (
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// slabs hands out the states, versions and short lists one transaction
// works on, a slab at a time: one allocation per slab instead of one per
// key. Nothing keeps them past the transaction (the cache packs or
// detaches the states it keeps). A slabs belongs to one goroutine; a nil
// *slabs allocates each one apart.
type slabs struct {
	lats  []latest
	vers  []version
	lists []*version
	sides []fevent
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

func (m *slabs) latest() *latest {
	if m == nil {
		return new(latest)
	}
	return change.Take(&m.lats)
}

func (m *slabs) version() *version {
	if m == nil {
		return new(version)
	}
	return change.Take(&m.vers)
}

// versionList is an empty list with room for the versions most folds
// touch.
func (m *slabs) versionList() []*version {
	if m == nil {
		return nil
	}
	return room(&m.lists, 4, 1024)
}

// sideList is an empty list with room for the side rows most folds write.
func (m *slabs) sideList() []fevent {
	if m == nil {
		return nil
	}
	return room(&m.sides, 2, 128)
}

// setSideMaxT points l.sideMaxT at a copy of t that l holds itself.
func (l *latest) setSideMaxT(t time.Time) {
	l.sideT = t
	l.sideMaxT = &l.sideT
}
