package park

import (
	"errors"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// TestParkingPhases walks one target through a parking: parked (its
// parts left out, its partitions held), read again after the backoff
// (probing: its parts are probes, one in flight at a time), a probe that
// applied (left out until read again), and the end of the parking, each
// step taking a new epoch that leaves out the parts of older batches.
func TestParkingPhases(t *testing.T) {
	var k Parking
	if !k.Idle() || k.Any() {
		t.Fatal("a new Parking has something parked")
	}
	before := k.Now()
	pk := k.Park("a", errors.New("lock timeout"), false, time.Minute)
	if !pk.Log || pk.Backoff != backoffMin || !k.Parked("a") || k.Parked("b") {
		t.Fatalf("parked: %+v", pk)
	}
	if again := k.Park("a", errors.New("lock timeout"), false, time.Minute); again.Log || again.Backoff != 2*backoffMin {
		t.Fatalf("parked again: %+v, want no log and a doubled backoff", again)
	}
	skip, probe := k.Rules(k.Now())
	if !skip("a") || probe("a") || skip("b") {
		t.Fatal("a parked target's part is not left out")
	}
	owned := map[string]bool{"a": true}
	hold, resume, ended := k.Sync(owned)
	if !hold["a"] || resume["a"] || len(ended) > 0 {
		t.Fatalf("first look: hold %v resume %v ended %v", hold, resume, ended)
	}
	p := change.Partition{Topic: "ta"}
	k.SetPaused([]change.Partition{p}, nil)
	if !k.PausedFor(p) {
		t.Fatal("partition not paused")
	}
	k.targets["a"].until = time.Now() // the backoff is over
	if _, resume, _ = k.Sync(owned); !resume["a"] {
		t.Fatal("not read again after its backoff")
	}
	cut := k.Now()
	if skip, _ := k.Rules(before); !skip("a") {
		t.Fatal("a part cut before the park is applied")
	}
	if _, probe := k.Rules(cut); !probe("a") {
		t.Fatal("a probing target's part is not a probe")
	}
	if !k.StartProbe("a", cut) || k.StartProbe("a", cut) {
		t.Fatal("not exactly one probe in flight")
	}
	k.Unpark("a")
	if skip, _ := k.Rules(cut); !skip("a") {
		t.Fatal("a part is applied before the partitions are read again")
	}
	_, resume, ended = k.Sync(owned)
	if !resume["a"] || !ended["a"].Applied || k.Parked("a") {
		t.Fatalf("parking not over: resume %v ended %v", resume, ended)
	}
	if skip, _ := k.Rules(cut); !skip("a") {
		t.Fatal("a part cut before the parking ended is applied")
	}
	if got := k.Release([]change.Partition{p}); len(got) != 1 || k.PausedFor(p) || !k.Idle() {
		t.Fatalf("release: %v", got)
	}
}
