package anchor

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
)

// TestAnchorsMatchModel reads random partitions of rising and falling
// sequences, takes commit points at random, and checks every anchor and
// commit-point seed against a plain list of (offset, highest sequence),
// across the arena's compactions and shrinks.
func TestAnchorsMatchModel(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	p := change.Partition{Topic: "t"}
	for round := range 200 {
		a := New()
		type mark struct {
			off int64
			max change.Seq
		}
		var model []mark
		var max change.Seq
		next, committed := int64(rng.IntN(5)), int64(0)
		if rng.IntN(3) == 0 { // resumed from a recorded anchor
			max = change.MustSeq(rng.IntN(1000))
			a.Resume(p, next, bytes.Clone(max))
			model = append(model, mark{next, max})
			committed = next
		}
		n, commits := 300+rng.IntN(700), 20
		if round%40 == 0 {
			// Long stretches without a commit point: the arena and the
			// marks grow past the sizes at which they shrink again.
			n, commits = 60_000, 20_000
		}
		for range n {
			switch r := rng.IntN(commits); {
			case r < commits-4:
				seq := change.MustSeq(rng.IntN(5000), rng.IntN(3))
				if commits > 20 { // a rising sequence: a mark per record
					seq = change.MustSeq(next, rng.IntN(3))
				}
				a.See(change.Origin{Partition: p, Offset: next}, seq)
				if max == nil || seq.Compare(max) > 0 {
					max = bytes.Clone(seq)
					model = append(model, mark{next + 1, max})
				}
				next++
			case r < commits-2:
				got := a.Anchor(change.Origin{Partition: p, Offset: next})
				want := change.AppendSeqNull(nil)
				if max != nil {
					want = append([]byte(nil), max...)
				}
				want = change.AppendSeqInt(want, next)
				if !bytes.Equal(got, want) {
					t.Fatalf("round %d: anchor at %d = %x, want %x", round, next, got, want)
				}
			default:
				committed += int64(rng.IntN(int(next-committed) + 1))
				got, ok := a.At(map[change.Partition]int64{p: committed})[p]
				i := -1
				for j, m := range model {
					if m.off <= committed {
						i = j
					}
				}
				if (i >= 0) != ok || (ok && !bytes.Equal(got, model[i].max)) {
					t.Fatalf("round %d: seed at %d = %x (%v), want %v", round, committed, got, ok, model)
				}
				if i >= 0 {
					model = model[i:]
				}
			}
		}
	}
}
