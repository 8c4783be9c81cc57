package state

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/carve-net/carve/api"
)

// freshChanges encodes the changes since as a watcher alone would get
// them, without the answers shared among watchers.
func freshChanges(t *testing.T, table *LeaseTable, since uint64) []byte {
	t.Helper()
	table.mu.RLock()
	defer table.mu.RUnlock()
	table.cache.mu.Lock()
	defer table.cache.mu.Unlock()
	data, err := table.encodeChanges(since)
	if err != nil {
		t.Fatalf("encode changes since %d: %v", since, err)
	}
	return slices.Clone(data)
}

// TestSharedChangesAreWhatEachWatcherWouldGet: watchers sharing one
// encoded changes answer get, byte for byte, what each would have got
// encoded alone, through random registrations, re-registrations,
// deletions, usage reports (which change records between indexes) and
// signing-key changes, at every since still served, asked concurrently.
// Seeds are printed; CARVE_CHANGES_SEED replays one.
func TestSharedChangesAreWhatEachWatcherWouldGet(t *testing.T) {
	seeds := []uint64{1, 2, 3}
	if s := os.Getenv("CARVE_CHANGES_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CARVE_CHANGES_SEED=%q: %v", s, err)
		}
		seeds = []uint64{v}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			t.Logf("seed %d (replay with CARVE_CHANGES_SEED=%d)", seed, seed)
			checkSharedChanges(t, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)))
		})
	}
}

func checkSharedChanges(t *testing.T, rng *rand.Rand) {
	t.Helper()
	h := newHarness(t, DefaultConfig())
	h.table.changes.SetMax(24) // small, so that changes go gone along the way
	h.table.SetSigningKey(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize)))
	var live []string
	next := 0
	var history []string
	for step := range 300 {
		switch op := rng.IntN(10); {
		case op < 3 || len(live) == 0:
			id := fmt.Sprintf("a%d", next)
			res := h.register(id, fmt.Sprintf("198.18.%d.%d", next/200, next%200+1), true, rng.IntN(2) == 0)
			history = append(history, fmt.Sprintf("register %s: %v", id, res.Err))
			if res.Err == nil {
				live = append(live, id)
			}
			next++
		case op == 3: // the same agent again, its bridges changed
			id := live[rng.IntN(len(live))]
			rec := h.table.agents[id]
			res := h.register(id, rec.IP.String(), true, rng.IntN(2) == 0)
			history = append(history, fmt.Sprintf("re-register %s: %v", id, res.Err))
		case op == 4:
			i := rng.IntN(len(live))
			res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{live[i]}}})
			history = append(history, fmt.Sprintf("delete %s: %v", live[i], res.Err))
			live = slices.Delete(live, i, i+1)
		case op == 5: // a usage report: the record's encoding changes, not the index
			id := live[rng.IntN(len(live))]
			rep := &api.UsageReport{}
			for name, l := range h.table.agents[id].Leases {
				var bu []api.BlockUsage
				for _, b := range l.Blocks {
					bu = append(bu, api.BlockUsage{Prefix: b.Prefix.String(), Used: rng.Uint64N(5), Free: 5})
				}
				rep.Overlays = append(rep.Overlays, api.OverlayUsage{Name: name, Blocks: bu})
			}
			_, err := h.table.RecordUsage(id, rep)
			history = append(history, fmt.Sprintf("usage %s: %v", id, err))
		case op == 6 && rng.IntN(8) == 0:
			h.table.SetSigningKey(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{byte(step)}, ed25519.SeedSize)))
			history = append(history, "new signing key")
		default:
			history = append(history, "read")
		}
		checkSharedAtEverySince(t, h.table, rng, history)
	}
}

// checkSharedAtEverySince asks the changes since every served index,
// several watchers at once each, and compares every answer with the one
// encoded alone.
func checkSharedAtEverySince(t *testing.T, table *LeaseTable, rng *rand.Rand, history []string) {
	t.Helper()
	oldest, index := table.OldestChanges(), table.Index()
	for since := oldest; since <= index; since++ {
		if rng.IntN(3) == 0 {
			continue // not every index has a watcher
		}
		watchers := 1 + rng.IntN(4)
		got := make([][]byte, watchers)
		errs := make([]error, watchers)
		var wg sync.WaitGroup
		for w := range watchers {
			wg.Go(func() { got[w], _, errs[w] = table.ChangesJSON(since) })
		}
		wg.Wait()
		want := freshChanges(t, table, since)
		for w := range watchers {
			if errs[w] != nil {
				t.Fatalf("changes since %d at index %d: %v\nhistory (last 10): %q", since, index, errs[w], history[max(0, len(history)-10):])
			}
			if !bytes.Equal(got[w], want) {
				t.Fatalf("changes since %d at index %d: watcher %d of %d got\n%s\nencoded alone:\n%s\nhistory (last 10): %q",
					since, index, w, watchers, got[w], want, history[max(0, len(history)-10):])
			}
		}
	}
}
