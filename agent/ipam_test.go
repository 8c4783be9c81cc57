package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/unixsock"
)

// ipamSelf is an agent record with a dual-stack overlay whose /23 gives a
// /24 to each bridge.
func ipamSelf(id string) *api.AgentInfo {
	return &api.AgentInfo{AgentID: id, IP: "198.18.0.10", Version: 9, Overlays: []api.AgentOverlay{{
		Info:         api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/16", Prefix: 23, Subnet6: "fd00::/48", Prefix6: 64},
		Subnet:       "10.128.2.0/23",
		Subnet6:      "fd00:0:0:1::/64",
		MesosBridge:  &api.BridgeInfo{Name: "m-carve", IP: "10.128.2.0/24", IP6: "fd00:0:0:1::/65"},
		DockerBridge: &api.BridgeInfo{Name: "d-carve", IP: "10.128.3.0/24"},
		Backend: &api.BackendInfo{VXLAN: &api.VXLANInfo{VNI: 1024, VTEPName: "vtep1024", VTEPIP: "100.64.0.1/16",
			VTEPMAC: "70:b3:d5:40:00:01", VTEPPort: 4789, VTEPMTU: 1450}},
		State: api.OverlayState{Status: api.StatusOK},
	}}}
}

// ipamHarness runs an IPAM on a real store and a real unix socket, without
// the rest of the agent (no kernel work).
type ipamHarness struct {
	t      *testing.T
	dir    string
	ipam   *IPAM
	client *api.IPAMClient
	store  *Store
	cancel context.CancelFunc
	done   chan struct{}
}

func newIPAMHarness(t *testing.T, dir string) *ipamHarness {
	t.Helper()
	return newIPAMHarnessWithCache(t, dir, "")
}

func newIPAMHarnessWithCache(t *testing.T, dir, cniCache string) *ipamHarness {
	t.Helper()
	st, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	self := ipamSelf("self")
	a := &Agent{id: "self", log: quietLogger(), store: st, metrics: newMetrics(prometheus.NewRegistry()), self: self,
		cfg: Config{CNICacheDir: cniCache}}
	ipam, err := newIPAM(a)
	if err != nil {
		t.Fatal(err)
	}
	a.ipam = ipam
	other := rec("other", 4, "198.18.0.11")
	other.Subnets = []string{"10.128.4.0/23", "fd00:0:0:2::/64"}
	members := MembershipState{Records: []PeerRecord{peerFromInfo(self), other}}
	ipam.sync(self, &api.NetworkConfig{OverlayMTU: 1400}, members)
	sock := filepath.Join(dir, "agent.sock")
	ln, err := unixsock.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &ipamHarness{t: t, dir: dir, ipam: ipam, client: api.NewIPAMClient(sock, 10*time.Second), store: st, cancel: cancel, done: make(chan struct{})}
	go func() {
		ipam.serve(ctx, ln)
		close(h.done)
	}()
	t.Cleanup(h.close)
	return h
}

func (h *ipamHarness) close() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	<-h.done
	h.store.Close()
	h.cancel = nil
}

func (h *ipamHarness) alloc(cid, ifname, bridge string) *api.Allocation {
	h.t.Helper()
	a, err := h.client.Allocate(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: ifname, Bridge: bridge})
	if err != nil {
		h.t.Fatalf("allocate %s/%s: %v", cid, ifname, err)
	}
	return a
}

func addrs(a *api.Allocation) string {
	var out []string
	for _, ip := range a.IPs {
		out = append(out, ip.Address+" gw "+ip.Gateway)
	}
	return strings.Join(out, ", ")
}

func TestIPAMAllocationRules(t *testing.T) {
	h := newIPAMHarness(t, t.TempDir())
	first := h.alloc("c1", "eth0", "")
	tests := []struct{ name, got, want string }{
		{"lowest free after the gateway, both families", addrs(first), "10.128.2.2/24 gw 10.128.2.1, fd00:0:0:1::2/65 gw fd00:0:0:1::1"},
		{"idempotent by container and interface", addrs(h.alloc("c1", "eth0", "")), addrs(first)},
		{"another interface gets the next", addrs(h.alloc("c1", "eth1", api.BridgeMesos)), "10.128.2.3/24 gw 10.128.2.1, fd00:0:0:1::3/65 gw fd00:0:0:1::1"},
		{"docker bridge allocates in its own half", addrs(h.alloc("d1", "eth0", api.BridgeDocker)), "10.128.3.2/24 gw 10.128.3.1"},
		{"mtu is the overlay's", fmt.Sprint(first.MTU), "1400"},
		{"default routes via the gateways", fmt.Sprint(first.Routes), "[{0.0.0.0/0 10.128.2.1} {::/0 fd00:0:0:1::1}]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
	ctx := context.Background()
	// Claims: a free address, one that is taken, one outside the bridge.
	claimed, err := h.client.Allocate(ctx, api.IPAMRequest{Network: "carve", ContainerID: "c9", IfName: "eth0", Address: "10.128.2.77", Family: "4"})
	if err != nil || claimed.IPs[0].Address != "10.128.2.77/24" {
		t.Errorf("claim: %+v %v", claimed, err)
	}
	errTests := []struct {
		name string
		req  api.IPAMRequest
		code string
	}{
		{"claim taken", api.IPAMRequest{Network: "carve", ContainerID: "c10", IfName: "eth0", Address: "10.128.2.77"}, api.CodeTaken},
		{"claim outside the bridge", api.IPAMRequest{Network: "carve", ContainerID: "c11", IfName: "eth0", Address: "10.128.9.9"}, api.CodeConflict},
		{"same attachment other bridge", api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "eth0", Bridge: api.BridgeDocker}, api.CodeConflict},
		{"unknown network", api.IPAMRequest{Network: "nope", ContainerID: "c1", IfName: "eth0"}, api.CodeNotFound},
		{"missing network", api.IPAMRequest{ContainerID: "c1", IfName: "eth0"}, api.CodeBadRequest},
		{"missing container", api.IPAMRequest{Network: "carve", IfName: "eth0"}, api.CodeBadRequest},
		{"bad ifname", api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "a/b"}, api.CodeBadRequest},
		{"bad bridge", api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "eth0", Bridge: "x"}, api.CodeBadRequest},
		{"bad address", api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "eth0", Address: "10.1"}, api.CodeBadRequest},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.client.Allocate(ctx, tt.req)
			if !api.IsCode(err, tt.code) {
				t.Errorf("err %v, want code %s", err, tt.code)
			}
		})
	}
	// Release is idempotent; lookup follows.
	rel, err := h.client.Release(ctx, api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "eth0"})
	if err != nil || len(rel.Released) != 1 {
		t.Fatalf("release: %+v %v", rel, err)
	}
	if rel, err := h.client.Release(ctx, api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "eth0"}); err != nil || len(rel.Released) != 0 {
		t.Errorf("second release: %+v %v", rel, err)
	}
	if _, err := h.client.Lookup(ctx, api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "eth0"}); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("lookup after release: %v", err)
	}
	// Release by address (Docker's way); an address nobody holds is fine.
	d := h.alloc("dock", "eth0", api.BridgeDocker)
	if rel, err := h.ipam.ReleaseAddress("carve", netip.MustParsePrefix(d.IPs[0].Address).Addr()); err != nil || len(rel.Released) != 1 {
		t.Errorf("release by address: %+v %v", rel, err)
	}
	if rel, err := h.ipam.ReleaseAddress("carve", netip.MustParseAddr("10.128.3.1")); err != nil || len(rel.Released) != 0 {
		t.Errorf("release of the gateway: %+v %v", rel, err)
	}
	// The freed address is the lowest free again.
	if got := addrs(h.alloc("c2", "eth0", "")); !strings.HasPrefix(got, "10.128.2.2/24") {
		t.Errorf("freed address not reused first: %s", got)
	}
}

func TestIPAMExhaustionAndGC(t *testing.T) {
	h := newIPAMHarness(t, t.TempDir())
	ctx := context.Background()
	// The docker /24 has 253 usable addresses (network, gateway, broadcast excluded).
	for i := range 253 {
		h.alloc(fmt.Sprintf("c%d", i), "eth0", api.BridgeDocker)
	}
	_, err := h.client.Allocate(ctx, api.IPAMRequest{Network: "carve", ContainerID: "one-more", IfName: "eth0", Bridge: api.BridgeDocker})
	if !api.IsCode(err, api.CodeExhausted) || !strings.Contains(err.Error(), "10.128.3.0/24") {
		t.Fatalf("full bridge: %v", err)
	}
	st, err := h.client.Status(ctx, "carve")
	if err != nil || !st.Ready || st.Free[api.BridgeDocker] != 0 || st.Free[api.BridgeMesos] != 253 {
		t.Errorf("status %+v %v", st, err)
	}
	// A GC scoped to the mesos bridge leaves the docker allocations alone.
	if rel, err := h.client.GC(ctx, api.GCRequest{Network: "carve", Bridge: api.BridgeMesos}); err != nil || len(rel.Released) != 0 {
		t.Fatalf("mesos-scoped gc released %d docker allocations (%v)", len(rel.Released), err)
	}
	// GC keeps exactly the listed attachments.
	keep := []api.IPAMRequest{{ContainerID: "c1", IfName: "eth0"}, {ContainerID: "c7"}}
	rel, err := h.client.GC(ctx, api.GCRequest{Network: "carve", Keep: keep})
	if err != nil || len(rel.Released) != 251 {
		t.Fatalf("gc released %d (%v), want 251", len(rel.Released), err)
	}
	list, _ := h.client.List(ctx, "carve")
	var left []string
	for _, a := range list.Allocations {
		left = append(left, a.ContainerID)
	}
	if fmt.Sprint(left) != "[c1 c7]" {
		t.Errorf("after gc: %v", left)
	}
	if st, _ := h.client.Status(ctx, "nope"); st.Ready || st.Error == "" {
		t.Errorf("status of an unknown network: %+v", st)
	}
}

func TestIPAMConcurrentAllocationsAreDistinct(t *testing.T) {
	h := newIPAMHarness(t, t.TempDir())
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]string{}
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cid := fmt.Sprintf("c%03d", i)
			a, err := h.client.Allocate(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0", Family: "4"})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if other, dup := seen[a.IPs[0].Address]; dup {
				errs <- fmt.Errorf("%s given to %s and %s", a.IPs[0].Address, other, cid)
			}
			seen[a.IPs[0].Address] = cid
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(seen) != 200 {
		t.Errorf("%d distinct addresses, want 200", len(seen))
	}
}

func TestIPAMSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	h := newIPAMHarness(t, dir)
	var before []string
	for i := range 10 {
		before = append(before, addrs(h.alloc(fmt.Sprintf("c%d", i), "eth0", "")))
	}
	if _, err := h.client.Release(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: "c3", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	h.close()

	h2 := newIPAMHarness(t, dir)
	for i := range 10 {
		a, err := h2.client.Lookup(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"})
		switch {
		case i == 3 && !api.IsCode(err, api.CodeNotFound):
			t.Errorf("released c3 came back: %v", err)
		case i != 3 && (err != nil || addrs(a) != before[i]):
			t.Errorf("c%d after restart: %v %v, want %s", i, a, err, before[i])
		}
	}
	// New allocations fill the released hole and never reuse a held address.
	if got := addrs(h2.alloc("new1", "eth0", "")); got != before[3] {
		t.Errorf("new allocation %s, want the released %s", got, before[3])
	}
	if got := h2.alloc("new2", "eth0", ""); got.IPs[0].Address != "10.128.2.12/24" {
		t.Errorf("next allocation %s, want 10.128.2.12/24", got.IPs[0].Address)
	}
}

// growerFunc adapts a function to Grower.
type growerFunc func(ctx context.Context, overlay, bridge string) error

func (f growerFunc) Grow(ctx context.Context, overlay, bridge string) error {
	return f(ctx, overlay, bridge)
}

// TestIPAMGrowthSeam: a full bridge asks the Grower once, and its refusal
// is part of the exhausted answer.
func TestIPAMGrowthSeam(t *testing.T) {
	h := newIPAMHarness(t, t.TempDir())
	var asked []string
	h.ipam.grower = growerFunc(func(ctx context.Context, overlay, bridge string) error {
		asked = append(asked, overlay+"/"+bridge)
		return fmt.Errorf("the masters have no free subnet")
	})
	for i := range 253 {
		h.alloc(fmt.Sprintf("c%d", i), "eth0", api.BridgeDocker)
	}
	_, err := h.client.Allocate(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: "more", IfName: "eth0", Bridge: api.BridgeDocker})
	if !api.IsCode(err, api.CodeExhausted) || !strings.Contains(err.Error(), "no free subnet") {
		t.Fatalf("err %v", err)
	}
	if fmt.Sprint(asked) != "[carve/docker]" {
		t.Errorf("grower asked %v", asked)
	}
}

// TestIPAMReclaimsFromCNICache: an agent that lost its data dir takes back
// the addresses running CNI containers hold before it hands out new ones.
func TestIPAMReclaimsFromCNICache(t *testing.T) {
	cache := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cache, "results"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries := map[string]string{
		"carve-live1-eth0": `{"kind":"cniCacheV1","containerId":"live1","ifName":"eth0","networkName":"carve","result":{"cniVersion":"1.1.0","ips":[{"address":"10.128.2.2/24"},{"address":"fd00:0:0:1::2/65"}]}}`,
		"carve-live2-eth0": `{"kind":"cniCacheV1","containerId":"live2","ifName":"eth0","networkName":"carve","result":{"ips":[{"address":"10.128.2.5/24"}]}}`,
		"other-x-eth0":     `{"kind":"cniCacheV1","containerId":"x","ifName":"eth0","networkName":"other","result":{"ips":[{"address":"10.128.2.3/24"}]}}`,
		"carve-bad-eth0":   `not json`,
	}
	for name, body := range entries {
		if err := os.WriteFile(filepath.Join(cache, "results", name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h := newIPAMHarnessWithCache(t, t.TempDir(), cache)
	ctx := context.Background()
	if a, err := h.client.Lookup(ctx, api.IPAMRequest{Network: "carve", ContainerID: "live1", IfName: "eth0"}); err != nil ||
		addrs(a) != "10.128.2.2/24 gw 10.128.2.1, fd00:0:0:1::2/65 gw fd00:0:0:1::1" {
		t.Fatalf("live1 not reclaimed: %v %v", a, err)
	}
	if _, err := h.client.Lookup(ctx, api.IPAMRequest{Network: "carve", ContainerID: "x", IfName: "eth0"}); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("another network's cache entry was claimed: %v", err)
	}
	// New allocations step around the reclaimed addresses.
	var got []string
	for i := range 3 {
		a := h.alloc(fmt.Sprintf("new%d", i), "eth0", "")
		got = append(got, a.IPs[0].Address)
	}
	if fmt.Sprint(got) != "[10.128.2.3/24 10.128.2.4/24 10.128.2.6/24]" {
		t.Errorf("new allocations %v", got)
	}
}

// TestIPAMLookupBeforeRestore: between a restart and the first sync, a
// persisted attachment is not_ready (the runtime retries), never not_found.
func TestIPAMLookupBeforeRestore(t *testing.T) {
	dir := t.TempDir()
	h := newIPAMHarness(t, dir)
	h.alloc("c1", "eth0", "")
	h.close()
	st, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a := &Agent{id: "self", log: quietLogger(), store: st, metrics: newMetrics(prometheus.NewRegistry()), self: ipamSelf("self")}
	ipam, err := newIPAM(a)
	if err != nil {
		t.Fatal(err)
	}
	a.ipam = ipam
	for _, tt := range []struct {
		network, code string
	}{{"carve", api.CodeNotReady}, {"nope", api.CodeNotFound}} {
		_, err := ipam.Lookup(api.IPAMRequest{Network: tt.network, ContainerID: "c1", IfName: "eth0"})
		var ie *ipamError
		if !errors.As(err, &ie) || ie.code != tt.code {
			t.Errorf("lookup on %s before sync: %v, want %s", tt.network, err, tt.code)
		}
	}
}
