package ipam

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// writeCacheEntry writes libcni's cached ADD result of an attachment on the
// carve network, as libcni does after a successful ADD.
func writeCacheEntry(t *testing.T, cache, cid, addr string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(cache, "results"), 0o755); err != nil {
		t.Fatal(err)
	}
	entry := fmt.Sprintf(`{"kind":"cniCacheV1","containerId":%q,"ifName":"eth0","networkName":"carve","result":{"ips":[{"address":%q}]}}`, cid, addr)
	if err := os.WriteFile(filepath.Join(cache, "results", "carve-"+cid+"-eth0"), []byte(entry), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReclaimSkipsReleasedAttachments: libcni deletes its cached result of
// an attachment only after every plugin answered the DEL, so an agent that
// creates its overlay (its first sync after a restart) or adopts a block
// while a DEL is between carve-ipam's answer and libcni's cleanup finds the
// entry still there. The address of a DEL this agent answered must not come
// back: the runtime will never DEL it again (the e2e TestCNI's "the agent
// holds ... which is neither live nor an ADD the runtime gave up on").
func TestReclaimSkipsReleasedAttachments(t *testing.T) {
	for _, tc := range []struct {
		name string
		// persisted: the attachment was allocated before the restart (else
		// the agent lost its data dir and never heard of it).
		persisted bool
		// delBefore: the agent before the restart answered the DEL (and
		// was killed before libcni removed its cache entry).
		delBefore bool
	}{
		{name: "DEL of a persisted allocation before the first sync", persisted: true},
		{name: "DEL of an attachment a lost data dir forgot", persisted: false},
		{name: "DEL answered by the agent before the restart", persisted: true, delBefore: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, cache := t.TempDir(), t.TempDir()
			addr := "10.128.2.7/24"
			if tc.persisted {
				h := newHarness(t, dir, harnessOptions{})
				addr = h.alloc("gone", "eth0", "").IPs[0].Address
				if tc.delBefore {
					if _, err := h.client.Release(context.Background(), req("gone")); err != nil {
						t.Fatalf("DEL before the restart: %v", err)
					}
				}
				h.close()
			}
			writeCacheEntry(t, cache, "gone", addr)
			writeCacheEntry(t, cache, "live", "10.128.2.9/24")

			// Restarted, not synced yet: the runtime's DEL is answered.
			h := newHarness(t, dir, harnessOptions{cniCache: cache, view: &View{}})
			if !tc.delBefore {
				if _, err := h.client.Release(context.Background(), req("gone")); err != nil {
					t.Fatalf("DEL before the first sync: %v", err)
				}
			}
			// The first sync runs before libcni deletes the cache entry.
			h.svc.Sync(testView(testSelf()))

			got := map[string]string{}
			for _, a := range h.svc.List("carve").Allocations {
				got[a.ContainerID] = a.IPs[0].Address
			}
			if a, ok := got["gone"]; ok {
				t.Errorf("the agent holds %s for gone/eth0, whose DEL it answered", a)
			}
			if got["live"] != "10.128.2.9/24" {
				t.Errorf("the live container's cached address was not reclaimed: %v", got)
			}
		})
	}
}
