package agent

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/agent/store"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/state"
)

// TestLoadMembershipKeepsWhatVerifies: a restarted agent takes back from
// its store what verifies with its key (and gossips it again), and which
// records were the masters' copies; what does not verify (written by an
// agent that kept no signatures, or under another key) is dropped.
func TestLoadMembershipKeepsWhatVerifies(t *testing.T) {
	pub, priv := testKey(t)
	_, other := testKey(t)
	network := state.DefaultConfig()
	good := signedPeer(priv, "c1")
	c := signedPeer(priv, "c1", func(a *api.AgentInfo) {
		a.AgentID, a.Overlays[0].Subnet, a.Overlays[0].MesosBridge, a.Overlays[0].DockerBridge = "c", "10.128.3.0/24", nil, nil
		a.Overlays[0].Backend.VXLAN.VTEPIP, a.Overlays[0].Backend.VXLAN.VTEPMAC = "100.64.0.3/16", "70:b3:d5:40:00:03"
	})
	unsigned := rec("old-format", 5, "198.18.0.20")
	foreign := signedPeer(other, "c1", func(a *api.AgentInfo) { a.AgentID = "foreign" })
	tomb := signedTombstone(priv, "c1", "gone", 4)
	a := &Agent{sec: &security{}, members: membership.New(), log: quietLogger(), refusals: newLogLimiter(time.Minute),
		clusterID: "c1", signingKey: pub, network: &network}
	a.loadMembership(store.State{
		Membership:  membership.State{Records: []membership.PeerRecord{good, c, unsigned, foreign}, Tombstones: []api.Tombstone{tomb, {AgentID: "x", Version: 9}}},
		FromMasters: []string{"b"},
	})
	want := membership.State{Records: []membership.PeerRecord{good, c}, Tombstones: []api.Tombstone{tomb}}
	if got := a.members.State(); !reflect.DeepEqual(got, want) {
		t.Errorf("loaded %+v\nwant %+v", got, want)
	}
	if got := a.members.FromMasters(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("masters' copies %v, want [b]", got)
	}
}
