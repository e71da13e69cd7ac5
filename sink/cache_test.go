package sink

import (
	"fmt"
	"strings"
	"testing"
)

func TestStateCacheBounds(t *testing.T) {
	tbl := &table{}
	entry := func(bio int) *latest {
		return &latest{v: &version{key: []any{int64(1)}, row: []any{strings.Repeat("x", bio), int64(2)}}}
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
			c := newStateCache(tc.keys, tc.bytes)
			for i := range tc.puts {
				c.put(cacheKey{tbl, fmt.Sprint(i)}, entry(tc.bio))
				if n := len(c.cur) + len(c.prev); n > tc.keys {
					t.Fatalf("after %d puts: %d keys, bound %d", i+1, n, tc.keys)
				}
				if b := c.curBytes + c.prevBytes; b > tc.wantMaxBytes {
					t.Fatalf("after %d puts: %d bytes, bound %d", i+1, b, tc.wantMaxBytes)
				}
			}
			// The newest keys hit; the books match the entries.
			last := cacheKey{tbl, fmt.Sprint(tc.puts - 1)}
			if _, ok := c.get(last); !ok {
				t.Fatal("the newest key missed")
			}
			sum := 0
			for _, m := range []map[cacheKey]cacheEntry{c.cur, c.prev} {
				for _, e := range m {
					sum += e.size
				}
			}
			if sum != c.curBytes+c.prevBytes {
				t.Fatalf("entries hold %d bytes, books say %d", sum, c.curBytes+c.prevBytes)
			}
			c.drop(last)
			if _, ok := c.get(last); ok {
				t.Fatal("a dropped key hit")
			}
		})
	}
}
