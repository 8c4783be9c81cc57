package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/carve-net/carve/api"
)

func TestAllocationRules(t *testing.T) {
	h := newHarness(t, t.TempDir(), harnessOptions{})
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
		{"claim outside the bridge", api.IPAMRequest{Network: "carve", ContainerID: "c11", IfName: "eth0", Address: "10.128.9.9"}, api.CodeNotOwned},
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
	if rel, err := h.svc.ReleaseAddress("carve", netip.MustParsePrefix(d.IPs[0].Address).Addr()); err != nil || len(rel.Released) != 1 {
		t.Errorf("release by address: %+v %v", rel, err)
	}
	if rel, err := h.svc.ReleaseAddress("carve", netip.MustParseAddr("10.128.3.1")); err != nil || len(rel.Released) != 0 {
		t.Errorf("release of the gateway: %+v %v", rel, err)
	}
	// The freed address is not handed out again at once (round-robin).
	if got := addrs(h.alloc("c2", "eth0", "")); strings.HasPrefix(got, "10.128.2.2/24") {
		t.Errorf("freed address reused at once: %s", got)
	}
}

func TestExhaustionAndGC(t *testing.T) {
	h := newHarness(t, t.TempDir(), harnessOptions{})
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

func TestConcurrentAllocationsAreDistinct(t *testing.T) {
	h := newHarness(t, t.TempDir(), harnessOptions{})
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

func TestSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, harnessOptions{})
	var before []string
	for i := range 10 {
		before = append(before, addrs(h.alloc(fmt.Sprintf("c%d", i), "eth0", "")))
	}
	if _, err := h.client.Release(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: "c3", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	h.close()

	h2 := newHarness(t, dir, harnessOptions{})
	for i := range 10 {
		a, err := h2.client.Lookup(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"})
		switch {
		case i == 3 && !api.IsCode(err, api.CodeNotFound):
			t.Errorf("released c3 came back: %v", err)
		case i != 3 && (err != nil || addrs(a) != before[i]):
			t.Errorf("c%d after restart: %v %v, want %s", i, a, err, before[i])
		}
	}
	// New allocations resume after the highest address in use (the
	// round-robin position is not persisted) and never reuse a held one.
	if got := h2.alloc("new1", "eth0", ""); got.IPs[0].Address != "10.128.2.12/24" {
		t.Errorf("new allocation %s, want 10.128.2.12/24", got.IPs[0].Address)
	}
	if got := h2.alloc("new2", "eth0", ""); got.IPs[0].Address != "10.128.2.13/24" {
		t.Errorf("next allocation %s, want 10.128.2.13/24", got.IPs[0].Address)
	}
}

// TestIPAMReclaimsFromCNICache: an agent that lost its data dir takes back
// the addresses running CNI containers hold before it hands out new ones.
func TestReclaimsFromCNICache(t *testing.T) {
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
	h := newHarness(t, t.TempDir(), harnessOptions{cniCache: cache})
	ctx := context.Background()
	if a, err := h.client.Lookup(ctx, api.IPAMRequest{Network: "carve", ContainerID: "live1", IfName: "eth0"}); err != nil ||
		addrs(a) != "10.128.2.2/24 gw 10.128.2.1, fd00:0:0:1::2/65 gw fd00:0:0:1::1" {
		t.Fatalf("live1 not reclaimed: %v %v", a, err)
	}
	if _, err := h.client.Lookup(ctx, api.IPAMRequest{Network: "carve", ContainerID: "x", IfName: "eth0"}); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("another network's cache entry was claimed: %v", err)
	}
	// New allocations start after the highest reclaimed address.
	var got []string
	for i := range 3 {
		a := h.alloc(fmt.Sprintf("new%d", i), "eth0", "")
		got = append(got, a.IPs[0].Address)
	}
	if fmt.Sprint(got) != "[10.128.2.6/24 10.128.2.7/24 10.128.2.8/24]" {
		t.Errorf("new allocations %v", got)
	}
}
