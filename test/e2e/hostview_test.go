package e2e

import (
	"context"
	"reflect"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// hostView is what an agent shows of the cluster: its peers (membership
// and tombstones) and its kernel (VTEP neighbours, FDB, routes).
type hostView struct {
	peers  *api.AgentPeers
	kernel *labcluster.KernelState
}

// hostViews reads every host's view, by host name.
func hostViews(ctx context.Context, t *testing.T, c *labcluster.Cluster) map[string]hostView {
	t.Helper()
	out := map[string]hostView{}
	for _, h := range c.Hosts() {
		peers, err := c.AgentClient(h).Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ks, err := c.Kernel(h)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = hostView{peers, ks}
	}
	return out
}

// checkUnchanged fails t for every host whose view differs from before.
func checkUnchanged(ctx context.Context, t *testing.T, c *labcluster.Cluster, before map[string]hostView) {
	t.Helper()
	for name, now := range hostViews(ctx, t, c) {
		want := before[name]
		if !reflect.DeepEqual(now.peers.Peers, want.peers.Peers) || !reflect.DeepEqual(now.peers.Tombstones, want.peers.Tombstones) || now.peers.ClusterID != want.peers.ClusterID {
			t.Errorf("%s's membership changed:\n got %+v %+v\nwant %+v %+v", name, now.peers.Peers, now.peers.Tombstones, want.peers.Peers, want.peers.Tombstones)
		}
		if !reflect.DeepEqual(now.kernel, want.kernel) {
			t.Errorf("%s's kernel changed:\n got %s\nwant %s", name, now.kernel, want.kernel)
		}
	}
}
