package master

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestChangesWatchersOfABurstHoldTheState: watchers on every master of a
// secure 3-master cluster, following the changes (answers shared among
// them, gzip'ed when large, released in rounds) through a burst of
// concurrent registrations and deletions, each end holding exactly the
// records and tombstones of the state, byte for byte.
func TestChangesWatchersOfABurstHoldTheState(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	c.waitConverged()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := c.clientAs(leader, "op", pki.RoleOperator)
	for i := range 20 {
		if _, err := registerRetrying(ctx, op, api.RegisterRequest{AgentID: fmt.Sprintf("early%02d", i), IP: fmt.Sprintf("198.18.1.%d", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	var start, final *api.State
	if err := callRetrying(ctx, func() (err error) {
		start, err = op.State(ctx, apiclient.StateOptions{Consistent: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	const watchers = 12
	views := make([]*watchView, watchers)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	for w := range watchers {
		views[w] = newWatchView(start)
		cl := c.clientAs(w%3, fmt.Sprintf("watcher%d", w), pki.RoleAgent)
		wg.Go(func() { views[w].follow(wctx, cl) })
	}

	// The burst: registrations (some taking over an early agent's IP)
	// and deletions at once.
	var bw sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 60 {
		bw.Go(func() {
			ip := fmt.Sprintf("198.18.2.%d", i+1)
			if i%10 == 0 {
				ip = fmt.Sprintf("198.18.1.%d", i/10+1)
			}
			if _, err := registerRetrying(ctx, op, api.RegisterRequest{AgentID: fmt.Sprintf("burst%02d", i), IP: ip}); err != nil {
				errs <- err
			}
		})
	}
	bw.Go(func() {
		if err := callRetrying(ctx, func() error {
			_, err := op.DeleteAgents(ctx, []string{"early10", "early11"})
			return err
		}); err != nil {
			errs <- err
		}
	})
	bw.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := callRetrying(ctx, func() (err error) {
		final, err = op.State(ctx, apiclient.StateOptions{Consistent: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := newWatchView(final)
	for w, v := range views {
		testutil.Eventually(t, 0, fmt.Sprintf("watcher %d holds index %d", w, final.Index), func() error {
			if idx := v.index(); idx < final.Index {
				return fmt.Errorf("at index %d", idx)
			}
			return nil
		})
		if diff := v.diff(want); diff != "" {
			t.Fatalf("watcher %d (on master %d) after the burst: %s", w, w%3, diff)
		}
	}
}

// watchView is what one watcher holds: every record and tombstone as
// encoded, merged from the changes it was answered.
type watchView struct {
	mu         sync.Mutex
	at         uint64
	agents     map[string]string
	tombstones map[string]string
}

func newWatchView(st *api.State) *watchView {
	v := &watchView{at: st.Index, agents: map[string]string{}, tombstones: map[string]string{}}
	v.merge(st.Index, st.Agents, st.Tombstones)
	return v
}

func (v *watchView) merge(index uint64, agents []api.AgentInfo, tombs []api.Tombstone) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, a := range agents {
		b, _ := json.Marshal(a)
		v.agents[a.AgentID] = string(b)
		delete(v.tombstones, a.AgentID)
	}
	for _, tb := range tombs {
		b, _ := json.Marshal(tb)
		v.tombstones[tb.AgentID] = string(b)
		delete(v.agents, tb.AgentID)
	}
	v.at = max(v.at, index)
}

func (v *watchView) index() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.at
}

// follow watches the changes until ctx ends.
func (v *watchView) follow(ctx context.Context, cl *apiclient.Client) {
	for ctx.Err() == nil {
		ch, err := cl.Changes(ctx, v.index(), 10*time.Second)
		if err != nil {
			continue // the test's end, or a master between answers: ask again
		}
		v.merge(ch.Index, ch.Agents, ch.Tombstones)
	}
}

// diff names the first difference from want ("" when none).
func (v *watchView) diff(want *watchView) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, pair := range []struct {
		what      string
		got, want map[string]string
	}{{"agents", v.agents, want.agents}, {"tombstones", v.tombstones, want.tombstones}} {
		if g, w := slices.Sorted(maps.Keys(pair.got)), slices.Sorted(maps.Keys(pair.want)); !slices.Equal(g, w) {
			return fmt.Sprintf("%s %v, the state's %v", pair.what, g, w)
		}
		for id, rec := range pair.want {
			if pair.got[id] != rec {
				return fmt.Sprintf("%s %s:\n%s\nthe state's:\n%s", pair.what, id, pair.got[id], rec)
			}
		}
	}
	return ""
}
