package statecache

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/scd2sink/scd2sink/sink/fold"
)

func TestStateCacheBounds(t *testing.T) {
	const tbl = 1
	entry := func(bio int) *fold.Latest {
		return &fold.Latest{V: &fold.Version{Key: []any{int64(1)}, Row: []any{strings.Repeat("x", bio), int64(2)}}}
	}
	tests := []struct {
		name             string
		keys, bytes, bio int
		puts             int
		wantMaxBytes     int
	}{
		{"bounded by bytes", 1000, 64 << 10, 1000, 500, 64 << 10},
		{"bounded by keys", 100, 0, 1000, 500, 100 * 1500},
		{"small rows, keys bind first", 100, 1 << 20, 10, 500, 1 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := New(tc.keys, tc.bytes)
			for i := range tc.puts {
				c.Put(Key{tbl, fmt.Sprint(i)}, entry(tc.bio))
				if n := len(c.m); n > tc.keys {
					t.Fatalf("after %d puts: %d keys, bound %d", i+1, n, tc.keys)
				}
				if b := c.bytes; b > tc.wantMaxBytes {
					t.Fatalf("after %d puts: %d bytes, bound %d", i+1, b, tc.wantMaxBytes)
				}
			}
			// The newest keys hit; the books match the entries.
			last := Key{tbl, fmt.Sprint(tc.puts - 1)}
			if _, ok := c.Get(last); !ok {
				t.Fatal("the newest key missed")
			}
			sum := 0
			for _, e := range c.m {
				sum += int(e.size)
			}
			if sum != c.bytes {
				t.Fatalf("entries hold %d bytes, books say %d", sum, c.bytes)
			}
			c.Drop(last)
			if _, ok := c.Get(last); ok {
				t.Fatal("a dropped key hit")
			}
		})
	}
}

// TestStateCacheKeepsItsOwnKeys: the cache's map keeps copies of the key
// identities it is given, which share a batch's memory (the sink's
// tablePlan.intern): neither a new entry nor one stored over an
// existing entry, nor one stored while others are forgotten, keeps the
// batch's bytes alive.
func TestStateCacheKeepsItsOwnKeys(t *testing.T) {
	const tbl = 1
	l := &fold.Latest{V: &fold.Version{Key: []any{int64(1)}, Row: []any{"x"}}}
	var given []*byte
	batchKey := func() Key {
		arena := []byte("batch: key-1") // a batch's identities share its memory
		id := unsafe.String(&arena[7], 5)
		given = append(given, unsafe.StringData(id))
		return Key{tbl, id}
	}
	c := New(4, 0)
	check := func(when string) {
		t.Helper()
		for k, e := range c.m {
			if unsafe.StringData(k.ID) != unsafe.StringData(e.key()) {
				t.Fatalf("%s: the map's key is not the entry's own copy", when)
			}
			if e.blob() != nil && unsafe.Add(unsafe.Pointer(unsafe.StringData(e.key())), len(e.key())) != unsafe.Pointer(unsafe.SliceData(e.blob())) {
				t.Fatalf("%s: a packed entry's key is not in its blob's allocation (an older entry's memory stays alive)", when)
			}
			for _, g := range given {
				if unsafe.StringData(k.ID) == g {
					t.Fatalf("%s: the cache's key is a batch's bytes", when)
				}
			}
		}
	}
	c.Put(batchKey(), l)
	check("new entry")
	c.Put(batchKey(), l)
	check("stored over an entry")
	// A state that cannot be packed (an array) over a packed one: its
	// key must not be the packed entry's, whose blob would stay alive.
	packedKey := c.m[Key{tbl, "key-1"}].key()
	c.Put(batchKey(), &fold.Latest{V: &fold.Version{Key: []any{int64(1)}, Row: []any{[]any{"x"}}}})
	if e := c.m[Key{tbl, "key-1"}]; e.blob() != nil || unsafe.StringData(e.key()) == unsafe.StringData(packedKey) {
		t.Fatalf("an unpacked state kept the packed entry's key (packed: %v)", e.blob() != nil)
	}
	c.Put(batchKey(), l)
	check("packed again")
	for i := range 20 { // the cache of 4 forgets keys to make room
		c.Put(Key{tbl, fmt.Sprint(i)}, l)
		c.Put(batchKey(), l)
		check("stored while others are forgotten")
	}
	if _, ok := c.Entry(batchKey()); !ok {
		t.Fatal("key-1, the newest, missed")
	}
}

// TestStateCacheCycle: a backlog that cycles through more keys than the
// cache holds (Debezium's snapshot, then rounds of updates over the same
// keys) still hits about in proportion to the cache's size. A cache
// forgetting its least recently used keys, or its older generation as a
// whole, misses nearly every time on it (under 10 % in this cycle).
func TestStateCacheCycle(t *testing.T) {
	const keys, capacity = 5000, 4000
	c := New(capacity, 0)
	l := &fold.Latest{V: &fold.Version{Key: []any{int64(1)}, Row: []any{"x"}}}
	var hits, n int
	for round := range 13 {
		for k := range keys {
			if round > 0 && k%4 != round%4 {
				continue
			}
			key := Key{1, fmt.Sprint(k)}
			if round > 0 {
				n++
				if _, ok := c.Entry(key); ok {
					hits++
				}
			}
			c.Put(key, l)
			if len(c.m) > capacity {
				t.Fatalf("%d keys held, bound %d", len(c.m), capacity)
			}
		}
	}
	if rate := float64(hits) / float64(n); rate < 0.3 {
		t.Fatalf("%d of %d updates hit (%.2f): the cycle thrashes the cache", hits, n, rate)
	}
}

// TestStateCacheOversized: a state larger than the whole byte bound is
// not kept, and does not empty the cache trying to make room for it.
func TestStateCacheOversized(t *testing.T) {
	c := New(100, 4<<10)
	small := &fold.Latest{V: &fold.Version{Key: []any{int64(1)}, Row: []any{"x"}}}
	for i := range 10 {
		c.Put(Key{1, fmt.Sprint(i)}, small)
	}
	held := len(c.m)
	c.Put(Key{1, "big"}, &fold.Latest{V: &fold.Version{Key: []any{int64(1)}, Row: []any{strings.Repeat("x", 8<<10)}}})
	if _, ok := c.Entry(Key{1, "big"}); ok {
		t.Fatal("a state larger than the cache was kept")
	}
	if len(c.m) != held {
		t.Fatalf("%d keys held after the oversized state, %d before", len(c.m), held)
	}
	sum := 0
	for _, e := range c.m {
		sum += int(e.size)
	}
	if sum != c.bytes {
		t.Fatalf("entries hold %d bytes, books say %d", sum, c.bytes)
	}
}
