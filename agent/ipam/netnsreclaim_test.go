package ipam

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// The netns reclaim is driven with real network namespaces of a lab, in
// netnslab.NetNSDir (/run/netns, a runtime directory the reclaim watches):
// deleting one without a DEL is a crashed runtime.

func TestNetNSReclaim(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Prefix: "carveipamreclaim"})
	const grace = time.Minute
	t0 := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name     string
		dryRun   bool
		netns    string // "lab": a lab namespace deleted during the test; "live": one kept
		deleted  bool
		scans    []time.Duration // scan times after t0
		released bool            // the allocation is gone after the scans
		reported int             // what the last scan returns
	}{
		{name: "gone past the grace: released", netns: "lab", deleted: true, scans: []time.Duration{0, grace}, released: true, reported: 1},
		{name: "gone within the grace: kept", netns: "lab", deleted: true, scans: []time.Duration{0, grace - time.Second}},
		{name: "live namespace: never", netns: "live", scans: []time.Duration{0, grace, 10 * grace}},
		{name: "dry run: reported, kept", dryRun: true, netns: "lab", deleted: true, scans: []time.Duration{0, grace, 2 * grace}, reported: 1},
		{name: "no netns path (Docker's): never", netns: "", scans: []time.Duration{0, 10 * grace}},
		{name: "outside the runtime directories: never", netns: "/tmp/carve-no-such-netns", scans: []time.Duration{0, 10 * grace}},
		{name: "a path that is not clean: never", netns: "/run/netns/../netns/carve-no-such", scans: []time.Duration{0, 10 * grace}},
		{name: "in a directory that does not exist: never", netns: "/run/carve-no-such-dir/netns/x", scans: []time.Duration{0, 10 * grace}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dirs := []string{netnslab.NetNSDir, "/run/carve-no-such-dir/netns"}
			h := newHarness(t, t.TempDir(), harnessOptions{reclaim: ReclaimConfig{After: grace, DryRun: tt.dryRun, NetNSDirs: dirs}})
			path := tt.netns
			if path == "lab" || path == "live" {
				n, err := lab.AddNamespace("c" + string(rune('a'+i)))
				if err != nil {
					t.Fatal(err)
				}
				path = n.Path
			}
			cid := "c" + string(rune('a'+i))
			req := api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0", Owner: podOwner(cid, path)}
			if _, err := h.client.Allocate(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			if tt.deleted {
				if err := netnslab.RemoveMount(path); err != nil {
					t.Fatal(err)
				}
			}
			var last []api.Allocation
			for _, d := range tt.scans {
				last = h.svc.reclaimGone(t0.Add(d))
			}
			if len(last) != tt.reported {
				t.Errorf("last scan reported %d, want %d: %+v", len(last), tt.reported, last)
			}
			_, err := h.client.Lookup(context.Background(), req)
			if gone := api.IsCode(err, api.CodeNotFound); gone != tt.released {
				t.Errorf("released %v, want %v (lookup: %v)", gone, tt.released, err)
			}
			wantReleased, wantDry := 0.0, 0.0
			if tt.released {
				wantReleased = 1
			}
			if tt.dryRun && tt.reported > 0 {
				wantDry = 1
			}
			if got := h.counter("carve_agent_ipam_netns_reclaims_total", "result", "released"); got != wantReleased {
				t.Errorf("released counter %v, want %v", got, wantReleased)
			}
			if got := h.counter("carve_agent_ipam_netns_reclaims_total", "result", "dry_run"); got != wantDry {
				t.Errorf("dry_run counter %v, want %v", got, wantDry)
			}
		})
	}
}

// TestNetNSReclaimRuns checks the reclaim as the agent runs it: Run's scan
// with a short grace releases the address of a deleted namespace, and
// never that of a live one.
func TestNetNSReclaimRuns(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Prefix: "carveipamreclaimrun"})
	h := newHarness(t, t.TempDir(), harnessOptions{reclaim: ReclaimConfig{After: 200 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { h.svc.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	live, err := lab.AddNamespace("live")
	if err != nil {
		t.Fatal(err)
	}
	dead, err := lab.AddNamespace("dead")
	if err != nil {
		t.Fatal(err)
	}
	reqs := map[string]api.IPAMRequest{}
	for _, n := range []*netnslab.Namespace{live, dead} {
		cid := "run-" + n.Name[len(n.Name)-4:]
		reqs[cid] = api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0", Owner: podOwner(cid, n.Path)}
		if _, err := h.client.Allocate(ctx, reqs[cid]); err != nil {
			t.Fatal(err)
		}
	}
	if err := netnslab.RemoveMount(dead.Path); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the dead container's address released", func() error {
		switch _, err := h.client.Lookup(ctx, reqs["run-dead"]); {
		case err == nil:
			return fmt.Errorf("still held")
		case !api.IsCode(err, api.CodeNotFound):
			return err
		}
		return nil
	})
	// Several scan periods later, the live one is still held.
	scans := h.svc.reclaimScans()
	testutil.Eventually(t, 0, "five more scans", func() error {
		if n := h.svc.reclaimScans(); n < scans+5 {
			return fmt.Errorf("%d scans", n-scans)
		}
		return nil
	})
	if _, err := h.client.Lookup(ctx, reqs["run-live"]); err != nil {
		t.Errorf("the live container's address: %v", err)
	}
	if got := h.counter("carve_agent_ipam_netns_reclaims_total", "result", "released"); got != 1 {
		t.Errorf("released counter %v, want 1", got)
	}
}
