package ipam

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestDisabledOverlayDrains: issue 20, finding 4. A disabled overlay
// ("enabled": false in the record) keeps its attachments, which are looked
// up and released as before; a new one is refused, for good (409, not a
// "try again"), saying why; enabled again, it is served.
func TestDisabledOverlayDrains(t *testing.T) {
	ctx := context.Background()
	var changes atomic.Int32
	h := newHarness(t, t.TempDir(), harnessOptions{growth: GrowthConfig{OnChange: func() { changes.Add(1) }}})
	first := h.alloc("c1", "eth0", api.BridgeMesos)
	h.alloc("c2", "eth0", api.BridgeMesos)

	disabled := testSelf()
	disabled.Overlays[0].Info.Enabled = new(bool)
	h.svc.Sync(testView(disabled))

	_, err := h.client.Allocate(ctx, req("c3"))
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict || !strings.Contains(apiErr.Message, `overlay "carve" is disabled`) {
		t.Fatalf("allocate on a disabled overlay: %v, want 409 naming the overlay as disabled", err)
	}
	got, err := h.client.Lookup(ctx, req("c1"))
	if err != nil || addrs(got) != addrs(first) {
		t.Fatalf("lookup on a disabled overlay: %v, %v; want %s", got, err, addrs(first))
	}
	if n := len(h.svc.List("carve").Allocations); n != 2 {
		t.Fatalf("%d attachments listed on the disabled overlay, want 2 (they drain, they are not dropped)", n)
	}
	rel, err := h.client.Release(ctx, req("c1"))
	if err != nil || len(rel.Released) != 1 {
		t.Fatalf("release on a disabled overlay: %+v, %v", rel, err)
	}
	// The last attachment gone, the agent hears at once: it removes the
	// overlay's bridges, routes and conflist.
	before := changes.Load()
	if _, err := h.client.Release(ctx, req("c2")); err != nil {
		t.Fatal(err)
	}
	if changes.Load() == before {
		t.Error("the release that drained the overlay told the agent nothing")
	}

	h.svc.Sync(testView(testSelf()))
	if _, err := h.client.Allocate(ctx, req("c3")); err != nil {
		t.Fatalf("allocate once the overlay is enabled again: %v", err)
	}
	if n := len(h.svc.List("carve").Allocations); n != 1 {
		t.Errorf("%d attachments after re-enabling, want c3", n)
	}
}
