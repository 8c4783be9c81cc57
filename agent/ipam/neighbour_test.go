package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestReleaseForgetsNeighbour: every address a release frees is handed to
// Config.ForgetNeighbour with its bridge's device, once the release is
// durable and while the address is still not free; a release that does not
// commit forgets nothing.
func TestReleaseForgetsNeighbour(t *testing.T) {
	h := newHarness(t, t.TempDir(), harnessOptions{})
	var calls []string
	h.svc.mu.Lock()
	h.svc.onForget = func(bridge string, addr netip.Addr) {
		// Called under s.mu: the allocators may be read.
		fam := 0
		if addr.Is6() {
			fam = 1
		}
		free := !slices.Contains(h.svc.overlays["carve"].Alloc[fam].Reserved(), addr)
		calls = append(calls, fmt.Sprintf("%s %s free=%v", bridge, addr, free))
	}
	h.svc.mu.Unlock()
	took := func() []string {
		h.svc.mu.Lock()
		defer h.svc.mu.Unlock()
		out := calls
		calls = nil
		return out
	}
	ctx := context.Background()

	h.alloc("c1", "eth0", "")                    // 10.128.2.2, fd00:0:0:1::2
	d := h.alloc("d1", "eth0", api.BridgeDocker) // 10.128.3.2
	h.alloc("c2", "eth0", "")                    // 10.128.2.3, fd00:0:0:1::3
	tests := []struct {
		name    string
		release func() error
		want    []string
	}{
		{"CNI DEL", func() error { _, err := h.client.Release(ctx, req("c1")); return err },
			[]string{"m-carve 10.128.2.2 free=false", "m-carve fd00:0:0:1::2 free=false"}},
		{"Docker ReleaseAddress", func() error {
			_, err := h.svc.ReleaseAddress("carve", netip.MustParsePrefix(d.IPs[0].Address).Addr())
			return err
		}, []string{"d-carve 10.128.3.2 free=false"}},
		{"nothing held", func() error { _, err := h.client.Release(ctx, req("c1")); return err }, nil},
		{"a release that does not commit", func() error {
			h.svc.mu.Lock()
			h.svc.inTransaction = func() error { return errors.New("disk on fire") }
			h.svc.mu.Unlock()
			defer func() {
				h.svc.mu.Lock()
				h.svc.inTransaction = nil
				h.svc.mu.Unlock()
			}()
			if _, err := h.client.Release(ctx, req("c2")); err == nil {
				return errors.New("the release succeeded")
			}
			return nil
		}, nil},
		{"GC", func() error {
			_, err := h.svc.GC(api.GCRequest{Network: "carve"})
			return err
		}, []string{"m-carve 10.128.2.3 free=false", "m-carve fd00:0:0:1::3 free=false"}},
	}
	for _, tt := range tests {
		if err := tt.release(); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := took(); !slices.Equal(got, tt.want) {
			t.Errorf("%s: forgot %q, want %q", tt.name, got, tt.want)
		}
	}
}
