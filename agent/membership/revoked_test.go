package membership

import (
	"slices"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/state"
)

// A record of an agent whose certificate was revoked is refused (revoked)
// at or below the revocation's index, even held or signed; a record above
// it (a registration with a new certificate) and other agents' are taken.
func TestTrustAdmitRefusesRevokedAgents(t *testing.T) {
	pub, priv := testKey(t)
	network := state.DefaultConfig()
	revoked := RevokedAgents([]api.Revocation{
		{Serial: "a", Identity: "agent/b", Index: 9},
		{Serial: "c", Identity: "master/m1", Index: 20},
		{Serial: "d", Identity: "agent/b", Index: 5},
	})
	if len(revoked) != 1 || revoked["b"] != 9 {
		t.Fatalf("RevokedAgents = %v, want b at 9", revoked)
	}
	tr := Trust{ClusterID: "c1", Key: pub, Required: true, Network: &network, Revoked: revoked}
	at := func(v uint64) PeerRecord { return signedPeer(priv, "c1", func(a *api.AgentInfo) { a.Version = v }) }
	other := signedPeer(priv, "c1", func(a *api.AgentInfo) { a.AgentID = "e" })
	held := New()
	held.MergeFromMasters(State{Records: []PeerRecord{at(9)}})
	tests := []struct {
		name    string
		members *Membership
		recs    []PeerRecord
		want    []string
	}{
		{"at the revocation", New(), []PeerRecord{at(9)}, []string{RefusedRevoked}},
		{"below it", New(), []PeerRecord{at(3)}, []string{RefusedRevoked}},
		{"held from before", held, []PeerRecord{at(9)}, []string{RefusedRevoked}},
		{"above it: a new certificate", New(), []PeerRecord{at(10)}, nil},
		{"another agent", New(), []PeerRecord{other}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, refused := tr.Admit("c1", State{Records: tt.recs}, tt.members)
			var reasons []string
			for _, r := range refused {
				reasons = append(reasons, r.Reason)
			}
			if !slices.Equal(reasons, tt.want) || len(in.Records)+len(refused) != len(tt.recs) {
				t.Errorf("refused %v (%v), admitted %d; want %v", reasons, refused, len(in.Records), tt.want)
			}
		})
	}
}
