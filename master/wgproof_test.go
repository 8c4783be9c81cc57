package master

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
)

// wgKey is a WireGuard key pair for a test.
func wgKey(t *testing.T) (wgtypes.Key, string) {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k, k.PublicKey().String()
}

// prove is agent's proof for k against signing.
func prove(t *testing.T, k wgtypes.Key, agent string, signing ed25519.PrivateKey) api.WireGuardProof {
	t.Helper()
	p, err := api.ProveWireGuardKey([32]byte(k), agent, signing.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// An agent registers a WireGuard key only with a proof that it holds the
// private half (issue 26: a host registered another host's key, the
// masters signed it, and every agent dropped the victim's peer). Asked of
// the leader and of a follower, which checks before it forwards: another
// host's key is refused 403 wireguard_proof however it is dressed up
// (no proof, the victim's proof replayed, a proof of another key, a proof
// against another signing key, which names the master's); an agent's own
// key with its proof is signed; an agent of an earlier release (no proof)
// registers the key its record carries again but no new one; an operator
// needs none. After a signing key rotation on one master, a proof against
// the old key names the new one, and proofs for both are taken. Before
// the fix every refusal here answered 200 and signed the key.
func TestWireGuardKeyTakesAProofOfPossession(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	signing := p.SigningKey
	own := api.EncodeSigningKey(signing.Public().(ed25519.PublicKey))
	_, otherSigning, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	victimKey, victimPub := wgKey(t)
	p.IssueAgent("victim", netip.MustParseAddr("198.18.4.2"))
	victim := c.clientAs(leader, "victim", pki.RoleAgent)
	if _, err := victim.Register(ctx, api.RegisterRequest{AgentID: "victim", IP: "198.18.4.2",
		Keys: api.AgentKeys{WireGuard: victimPub}, WireGuardProofs: []api.WireGuardProof{prove(t, victimKey, "victim", signing)}}); err != nil {
		t.Fatalf("the victim registers its own key with its proof: %v", err)
	}
	p.IssueAgent("evil", netip.MustParseAddr("198.18.4.1"))
	evilKey, evilPub := wgKey(t)
	_, newPub := wgKey(t)
	tests := []struct {
		name    string
		key     string
		proofs  []api.WireGuardProof
		code    string // "": signed
		mention string
	}{
		{"the victim's key without a proof", victimPub, nil, api.CodeWireGuardProof, "without a proof of possession"},
		{"the victim's key with the victim's proof", victimPub, []api.WireGuardProof{prove(t, victimKey, "victim", signing)}, api.CodeWireGuardProof, "does not verify"},
		{"the victim's key with a proof of its own key", victimPub, []api.WireGuardProof{prove(t, evilKey, "evil", signing)}, api.CodeWireGuardProof, "does not verify"},
		{"the victim's key against another signing key", victimPub, []api.WireGuardProof{prove(t, evilKey, "evil", otherSigning)}, api.CodeWireGuardProof, "make the proof against that key"},
		{"a malformed proof", victimPub, []api.WireGuardProof{{SigningKey: own, MAC: "AAAA"}}, api.CodeBadRequest, "wireguard_proofs[0].mac"},
		{"its own key with its proof", evilPub, []api.WireGuardProof{prove(t, evilKey, "evil", signing)}, "", ""},
		{"its own key again, without a proof (an earlier release)", evilPub, nil, "", ""},
		{"a new key without a proof (an earlier release)", newPub, nil, api.CodeWireGuardProof, "upgrade the agent"},
	}
	for _, target := range []int{leader, follower} {
		evil := c.clientAs(target, "evil", pki.RoleAgent)
		for _, tt := range tests {
			t.Run(c.ids[target]+"/"+tt.name, func(t *testing.T) {
				info, err := evil.Register(ctx, api.RegisterRequest{AgentID: "evil", IP: "198.18.4.1",
					Keys: api.AgentKeys{WireGuard: tt.key}, WireGuardProofs: tt.proofs})
				if tt.code == "" {
					if err != nil || info.Keys.WireGuard != tt.key {
						t.Fatalf("registered %+v, %v; want key %s signed", info, err, tt.key)
					}
					return
				}
				var e *api.Error
				if !errors.As(err, &e) || e.Code != tt.code || !strings.Contains(e.Message, tt.mention) {
					t.Fatalf("err %v, want code %s mentioning %q", err, tt.code, tt.mention)
				}
				if tt.code == api.CodeWireGuardProof && e.SigningKey != own {
					t.Errorf("signing_key %q in the refusal, want the master's %q", e.SigningKey, own)
				}
			})
		}
	}
	op := c.client(leader)
	rec, err := op.Agent(ctx, "evil")
	if err != nil || rec.Keys.WireGuard != evilPub {
		t.Errorf("evil's record after the refusals: %+v %v, want its own key %s", rec, err, evilPub)
	}
	if rec, err := op.Agent(ctx, "victim"); err != nil || rec.Keys.WireGuard != victimPub {
		t.Errorf("victim's record: %+v %v", rec, err)
	}
	// Refused by the master asked (a follower before it forwards): 5 each.
	if got := refusals(c, refusedWireGuardProof); got != 10 {
		t.Errorf("carve_master_auth_refusals_total{reason=%q} = %v, want 10", refusedWireGuardProof, got)
	}
	if _, err := op.Register(ctx, api.RegisterRequest{AgentID: "by-hand", IP: "198.18.4.3", Keys: api.AgentKeys{WireGuard: newPub}}); err != nil {
		t.Errorf("an operator registers a key without a proof: %v", err)
	}

	// A rotation of the signing key: the follower switched first.
	_, next, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	chain := &api.SigningChain{Links: []api.SigningLink{api.NewSigningLink(signing, next.Public().(ed25519.PublicKey))}}
	if err := c.masters[follower].SetSigning(next, chain); err != nil {
		t.Fatal(err)
	}
	rotatedKey, rotatedPub := wgKey(t)
	evil := c.clientAs(follower, "evil", pki.RoleAgent)
	req := api.RegisterRequest{AgentID: "evil", IP: "198.18.4.1", Keys: api.AgentKeys{WireGuard: rotatedPub},
		WireGuardProofs: []api.WireGuardProof{prove(t, rotatedKey, "evil", signing)}}
	_, err = evil.Register(ctx, req)
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeWireGuardProof || e.SigningKey != api.EncodeSigningKey(next.Public().(ed25519.PublicKey)) {
		t.Fatalf("a proof against the key before the switch: %v, want 403 wireguard_proof naming the new key", err)
	}
	req.WireGuardProofs = append(req.WireGuardProofs, prove(t, rotatedKey, "evil", next))
	if info, err := evil.Register(ctx, req); err != nil || info.Keys.WireGuard != rotatedPub {
		t.Fatalf("proofs against both keys of a rotation: %+v %v", info, err)
	}
}
