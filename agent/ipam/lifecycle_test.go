package ipam

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/agent/ipam/ringgossip"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// TestLookupBeforeRestore: between a restart and the first Sync every
// lookup is not_ready (the runtime retries), never not_found; after it an
// unknown network is not_found.
func TestLookupBeforeRestore(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, harnessOptions{})
	h.alloc("c1", "eth0", "")
	h.close()
	h2 := newHarness(t, dir, harnessOptions{view: &View{}})
	for _, network := range []string{"carve", "nope"} {
		if _, err := h2.svc.Lookup(api.IPAMRequest{Network: network, ContainerID: "c1", IfName: "eth0"}); !api.IsCode(err, api.CodeNotReady) {
			t.Errorf("lookup on %s before the first sync: %v, want %s", network, err, api.CodeNotReady)
		}
	}
	h2.svc.Sync(testView(testSelf()))
	if _, err := h2.svc.Lookup(api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Errorf("lookup after the sync: %v", err)
	}
	if _, err := h2.svc.Lookup(api.IPAMRequest{Network: "nope", ContainerID: "c1", IfName: "eth0"}); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("lookup on an unknown network: %v, want %s", err, api.CodeNotFound)
	}
}

// withStatus is testSelf with the overlay in another status.
func withStatus(status, msg string) *api.AgentInfo {
	self := testSelf()
	self.Overlays[0].State = api.OverlayState{Status: status, Error: msg}
	return self
}

// withoutSubnet is testSelf with the overlay named but not leased.
func withoutSubnet() *api.AgentInfo {
	self := testSelf()
	self.Overlays[0].Subnet, self.Overlays[0].Subnet6 = "", ""
	return self
}

// TestReportedStatusDoesNotStopServing: the status in the agent's record
// is what the agent reported to the masters (DC/OS's state.status); an
// overlay the agent reported FAILED or CONFIGURING is still leased, and the
// IPAM keeps serving it (acting on the report would make an agent that
// failed once stop serving for good).
func TestReportedStatusDoesNotStopServing(t *testing.T) {
	for _, status := range []string{api.StatusFailed, api.StatusConfiguring, api.StatusInvalid} {
		t.Run(status, func(t *testing.T) {
			h := newHarness(t, t.TempDir(), harnessOptions{})
			h.svc.Sync(View{Self: withStatus(status, "bridge m-carve: operation not permitted"), Peers: testView(testSelf()).Peers})
			if st := h.svc.Status("carve"); !st.Ready {
				t.Fatalf("status with a reported %s: %+v", status, st)
			}
			h.alloc("c1", "eth0", "")
		})
	}
}

// TestOverlayNoLongerServed (bug 1): an overlay that is no longer OK here,
// or gone from the agent's record, takes no new allocation (503 not_ready
// naming why), while lookups and releases of what it holds still work; its
// persisted allocations stay on disk and come back with the overlay.
func TestOverlayNoLongerServed(t *testing.T) {
	gone := testSelf()
	gone.Overlays = nil
	tests := []struct {
		name string
		self *api.AgentInfo
		want string // in the refusal
		// restarted is the refusal's code after a restart, when the IPAM
		// learns the overlay from the agent's record alone.
		restarted string
	}{
		{"in the record without a subnet", withoutSubnet(), "no subnet leased", api.CodeNotReady},
		{"gone from the agent's record", gone, "no longer leased", api.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			h := newHarness(t, dir, harnessOptions{})
			kept := h.alloc("kept", "eth0", "")
			h.alloc("released", "eth0", "")
			h.svc.Sync(View{Self: tt.self, Peers: testView(testSelf()).Peers})

			_, err := h.svc.Allocate(req("new"))
			var ae *api.Error
			if !api.IsCode(err, api.CodeNotReady) || !errors.As(err, &ae) || ae.Status != 503 || !strings.Contains(ae.Message, tt.want) {
				t.Fatalf("allocate on an overlay no longer served: %v, want 503 not_ready naming %q", err, tt.want)
			}
			if st := h.svc.Status("carve"); st.Ready || !strings.Contains(st.Error, tt.want) {
				t.Errorf("status %+v", st)
			}
			if slices.Contains(h.svc.Networks(), "carve") {
				t.Error("Networks lists an overlay no longer served")
			}
			if _, _, ok := h.svc.BridgeSubnets("carve", api.BridgeDocker); ok {
				t.Error("BridgeSubnets of an overlay no longer served")
			}
			if got, err := h.svc.Lookup(req("kept")); err != nil || addrs(got) != addrs(kept) {
				t.Errorf("lookup of an existing allocation: %v %v", got, err)
			}
			if rel, err := h.svc.Release(req("released")); err != nil || len(rel.Released) != 1 {
				t.Errorf("release of an existing allocation: %+v %v", rel, err)
			}

			// A restart while the overlay is not served keeps the allocation
			// on disk; it is claimed back when the overlay is OK again.
			h.close()
			h2 := newHarness(t, dir, harnessOptions{view: &View{Self: tt.self, Peers: testView(testSelf()).Peers}})
			if _, err := h2.svc.Allocate(req("new")); !api.IsCode(err, tt.restarted) {
				t.Errorf("allocate after a restart: %v, want %s", err, tt.restarted)
			}
			if rel, err := h2.svc.Release(req("released")); err != nil || len(rel.Released) != 0 {
				t.Errorf("the released allocation came back: %+v %v", rel, err)
			}
			h2.svc.Sync(testView(testSelf()))
			if got, err := h2.svc.Lookup(req("kept")); err != nil || addrs(got) != addrs(kept) {
				t.Errorf("kept allocation after the overlay came back: %v %v, want %s", got, err, addrs(kept))
			}
			if got := h2.alloc("new", "eth0", ""); got.IPs[0].Address != "10.128.2.3/24" {
				t.Errorf("new allocation %s, want the released 10.128.2.3/24", got.IPs[0].Address)
			}
		})
	}
}

// leasesOf returns the leases of the service's IPv4 ring of "carve".
func leasesOf(t *testing.T, s *Service) []ring.Lease {
	t.Helper()
	enc := s.Rings()["carve/4"]
	r, err := ring.Decode(enc)
	if err != nil {
		t.Fatalf("carve/4 ring: %v", err)
	}
	return r.Leases()
}

// TestRebuildForgetsRings (bug 4): after the masters' cluster is rebuilt,
// the rings of the old cluster are gone: their leases (with Raft indexes of
// the old log, higher than the new ones) come back neither from disk nor
// from a gossiped message of the old cluster.
func TestRebuildForgetsRings(t *testing.T) {
	oldView := testView(testSelf())
	oldView.ClusterID = "old-cluster"
	// The rebuilt cluster leased the two /23s the other way round, at
	// lower Raft indexes.
	newSelf := testSelf()
	newSelf.Version = 3
	ov := &newSelf.Overlays[0]
	ov.Subnet, ov.Subnet6 = "10.128.4.0/23", "fd00:0:0:2::/64"
	ov.MesosBridge = &api.BridgeInfo{Name: "m-carve", IP: "10.128.4.0/24", IP6: "fd00:0:0:2::/65"}
	ov.DockerBridge = &api.BridgeInfo{Name: "d-carve", IP: "10.128.5.0/24"}
	newView := View{ClusterID: "new-cluster", Self: newSelf, Network: oldView.Network, Peers: []Peer{
		peerOf(newSelf), {ID: "other", Version: 2, Subnets: []string{"10.128.2.0/23", "fd00:0:0:1::/64"}},
	}}
	wantLeases := []ring.Lease{
		{Owner: "other", Prefix: netip.MustParsePrefix("10.128.2.0/23"), Version: 2},
		{Owner: "self", Prefix: netip.MustParsePrefix("10.128.4.0/23"), Version: 3},
	}
	for _, how := range []string{"Rebuild", "Sync with a new cluster id"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			h := newHarness(t, dir, harnessOptions{view: &oldView})
			old := h.alloc("c1", "eth0", "")
			oldMsg := ringgossip.Data{Msg: h.svc.rings()}.Encode()[0]
			if how == "Rebuild" {
				h.svc.Rebuild("new-cluster")
			}
			h.svc.Sync(newView)
			check := func(s *Service, when string) {
				t.Helper()
				if got := leasesOf(t, s); !slices.Equal(got, wantLeases) {
					t.Errorf("%s: leases %v, want only the new cluster's %v", when, got, wantLeases)
				}
			}
			check(h.svc, "after the rebuild")
			if got := h.alloc("c2", "eth0", ""); got.IPs[0].Address != "10.128.4.2/24" {
				t.Errorf("allocation after the rebuild: %s, want 10.128.4.2/24", addrs(got))
			}
			// The old allocation is kept, but its address is the other
			// agent's now: not claimable, never handed to anyone here.
			if _, err := h.svc.Lookup(req("c1")); !api.IsCode(err, api.CodeNotReady) {
				t.Errorf("lookup of the old cluster's allocation %s: %v, want not_ready", addrs(old), err)
			}
			// Unclaimed shows it (carve ipam check counts it), as a host address.
			unclaimed := func(s *Service) string {
				var out []string
				for _, al := range s.Unclaimed("") {
					var ips []string
					for _, ip := range al.IPs {
						ips = append(ips, ip.Address)
					}
					out = append(out, al.ContainerID+"="+strings.Join(ips, ","))
				}
				return strings.Join(out, " ")
			}
			var hosts []string
			for _, ip := range old.IPs {
				a := netip.MustParsePrefix(ip.Address).Addr()
				hosts = append(hosts, netip.PrefixFrom(a, a.BitLen()).String())
			}
			if got, want := unclaimed(h.svc), "c1="+strings.Join(hosts, ","); got != want {
				t.Errorf("Unclaimed = %q, want %q", got, want)
			}

			// The old cluster's gossip is refused and counted.
			_, err := h.svc.RingGossip().OnGossip(oldMsg)
			if !errors.Is(err, ringgossip.ErrOtherCluster) {
				t.Errorf("old cluster's ring message: %v, want errOtherCluster", err)
			}
			if n := h.counter("carve_agent_ring_gossip_messages_total", "result", ringgossip.ResultOtherCluster); n != 1 {
				t.Errorf("other_cluster messages counted: %v", n)
			}
			check(h.svc, "after the old cluster's gossip")

			// Nor from disk.
			h.close()
			h2 := newHarness(t, dir, harnessOptions{view: &newView})
			check(h2.svc, "after a restart")
			if _, err := h2.svc.Lookup(req("c1")); !api.IsCode(err, api.CodeNotReady) {
				t.Errorf("the old allocation is not kept across the restart: %v", err)
			}
			if got := unclaimed(h2.svc); !strings.HasPrefix(got, "c1=") {
				t.Errorf("Unclaimed after the restart = %q, want c1", got)
			}
			if _, err := h2.client.Lookup(context.Background(), req("c2")); err != nil {
				t.Errorf("the new allocation after the restart: %v", err)
			}
		})
	}
}
