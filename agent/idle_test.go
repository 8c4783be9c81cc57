package agent

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/test/lab/fakegossip"
)

// drained empties a coalescing channel and tells whether it was signalled.
func drained(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestUnchangedMasterStateCostsNothing: a blocking watch that times out
// answers the same state again (every --watch-wait); applying it must not
// rewrite the store, reconcile the kernel or touch the mesh connections,
// which at thousands of peers cost an idle agent most of its CPU. A state
// that changes something still does.
func TestUnchangedMasterStateCostsNothing(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 1)
	gnet := fakegossip.New(fakegossip.Config{Seed: 51})
	t.Cleanup(gnet.Close)
	a := newTestAgent(t, hosts[0], m.URL(), filepath.Join(dir, "a1"), gnet)
	t.Cleanup(a.closeResources)
	client := masterClient(t, m)
	ctx := context.Background()
	for _, id := range []string{a.id, "other"} {
		if _, err := client.Register(ctx, api.RegisterRequest{AgentID: id, IP: "198.18.0.99", NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := client.State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !a.applyMasterState(st, true) {
		t.Fatal("the first state was refused")
	}
	for name, ch := range map[string]chan struct{}{"persist": a.persistCh, "reconcile": a.reconcileCh, "connect": a.connectCh} {
		if !drained(ch) {
			t.Fatalf("the first state did not trigger %s", name)
		}
	}
	again, err := client.State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !a.applyMasterState(again, true) {
		t.Fatal("the same state was refused")
	}
	for name, ch := range map[string]chan struct{}{"persist": a.persistCh, "reconcile": a.reconcileCh, "connect": a.connectCh} {
		if drained(ch) {
			t.Errorf("the same state again triggered %s", name)
		}
	}
	if _, err := client.Register(ctx, api.RegisterRequest{AgentID: "third", IP: "198.18.0.98", NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}}); err != nil {
		t.Fatal(err)
	}
	changed, err := client.State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.applyMasterState(changed, true)
	for name, ch := range map[string]chan struct{}{"persist": a.persistCh, "reconcile": a.reconcileCh} {
		if !drained(ch) {
			t.Errorf("a new agent in the state did not trigger %s", name)
		}
	}
}
