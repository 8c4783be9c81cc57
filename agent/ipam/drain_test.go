package ipam

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestDisabledOverlayDrains: issue 20, finding 4. A disabled overlay
// ("enabled": false in the record) keeps its attachments, which are looked
// up and released as before; a new one is refused, for good (409, not a
// "try again"), saying why; enabled again, it is served.
func TestDisabledOverlayDrains(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, t.TempDir(), harnessOptions{})
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

	h.svc.Sync(testView(testSelf()))
	if _, err := h.client.Allocate(ctx, req("c3")); err != nil {
		t.Fatalf("allocate once the overlay is enabled again: %v", err)
	}
	if n := len(h.svc.List("carve").Allocations); n != 2 {
		t.Errorf("%d attachments after re-enabling, want c2 and c3", n)
	}
}
