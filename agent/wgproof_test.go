package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/encryption"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// An agent proves to the masters that it holds its WireGuard key (issue
// 26), against a master that refuses a key without a proof: its key is
// signed whether it knows the masters' signing key from the start
// (--signing-pub-file) or learns it from the master's refusal (a first
// start), a rotated WireGuard key is signed, and so is one after the
// masters' signing key was rotated. Before the fix (no proofs) the
// masters refused every new key: the records carried none.
func TestAgentProvesItsWireGuardKey(t *testing.T) {
	t.Parallel() // its own namespaces, masters and data dirs
	hosts, dir, _ := hostsWithMaster(t, 2)
	ms := mastertest.StartSecure(t, filepath.Join(dir, "secure-m1"), state.DefaultConfig(), quietLogger())
	op, err := apiclient.NewClientWith([]string{ms.URL()}, apiclient.ClientOptions{TLS: ms.CA.ClientTLS("op", pki.RoleOperator)})
	if err != nil {
		t.Fatal(err)
	}
	gnet := fakegossip.New(fakegossip.Config{Seed: 26})
	t.Cleanup(gnet.Close)
	t.Logf("fake gossip seed %d", gnet.Seed())
	signingPub := ms.CA.SigningKey.Public().(ed25519.PublicKey)
	agents := []*runningAgent{
		startSecureAgent(t, hosts[0], ms, filepath.Join(dir, "a0"), gnet, func(c *Config) { c.SigningKey = signingPub }),
		startSecureAgent(t, hosts[1], ms, filepath.Join(dir, "a1"), gnet), // learns the key
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	signed := func(a *runningAgent, what string) {
		t.Helper()
		testutil.Eventually(t, 0, fmt.Sprintf("%s: %s's WireGuard key signed", what, a.id), func() error {
			want := a.wg.RegisterKey()
			rec, err := op.Agent(ctx, a.id)
			if err != nil {
				return err
			}
			if rec.Keys.WireGuard != want {
				return fmt.Errorf("its record carries wireguard key %q, the agent holds %s", rec.Keys.WireGuard, want)
			}
			return nil
		})
	}
	for _, a := range agents {
		signed(a, "first registration")
		if _, err := a.RotateWireGuardKey(ctx); err != nil {
			t.Fatalf("%s rotates its WireGuard key: %v", a.id, err)
		}
		signed(a, "after a rotation")
	}
	// The masters' signing key is rotated: the agents follow the chain,
	// and prove their next keys against the new one.
	_, next, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	chain := &api.SigningChain{Links: []api.SigningLink{api.NewSigningLink(ms.CA.SigningKey, next.Public().(ed25519.PublicKey))}}
	if err := ms.SetSigning(next, chain); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		if _, err := a.RotateWireGuardKey(ctx); err != nil {
			t.Fatalf("%s rotates its WireGuard key after the signing key's rotation: %v", a.id, err)
		}
		signed(a, "after the signing key's rotation")
	}
}

// proveAgainstAskedKey adds a proof against the key a master's refusal
// names, once: another refusal, or one that names no key, goes on to the
// usual backoff; at most api.MaxWireGuardProofs are sent.
func TestProveAgainstAskedKey(t *testing.T) {
	w, err := encryption.New(t.TempDir(), encryption.Config{}, prometheus.NewRegistry(), quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	wgKey, _ := w.RegisterKeyPair()
	a := &Agent{id: "h1", log: quietLogger()}
	key := func() ed25519.PublicKey {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	asked := key()
	refusal := func(k ed25519.PublicKey) error {
		return &api.Error{Code: api.CodeWireGuardProof, Status: 403, Message: "no proof", SigningKey: api.EncodeSigningKey(k)}
	}
	known := []ed25519.PublicKey{key(), key(), key(), key()}
	tests := []struct {
		name   string
		known  []ed25519.PublicKey
		err    error
		again  bool
		proofs int
	}{
		{"no refusal", nil, nil, false, 0},
		{"another refusal", nil, &api.Error{Code: api.CodeForbidden, Status: 403}, false, 0},
		{"a refusal naming no key", nil, &api.Error{Code: api.CodeWireGuardProof, Status: 403}, false, 0},
		{"a key it does not know", nil, refusal(asked), true, 1},
		{"a key it proved against already", []ed25519.PublicKey{asked}, refusal(asked), false, 1},
		{"beside the most it sends", known, refusal(asked), true, api.MaxWireGuardProofs},
		{"a wrapped refusal", nil, fmt.Errorf("register: %w", refusal(asked)), true, 1},
		{"not an error of the api", nil, errors.New(api.CodeWireGuardProof), false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := api.RegisterRequest{AgentID: "h1", RequestID: "r1", WireGuardProofs: a.wireGuardProofs(wgKey, tt.known)}
			again := a.proveAgainstAskedKey(&req, wgKey, tt.err)
			if again != tt.again || len(req.WireGuardProofs) != tt.proofs {
				t.Fatalf("again %v with %d proofs, want %v with %d", again, len(req.WireGuardProofs), tt.again, tt.proofs)
			}
			if !again {
				return
			}
			if req.RequestID == "r1" {
				t.Error("registering again with the refused request's id")
			}
			last := req.WireGuardProofs[len(req.WireGuardProofs)-1]
			if last.SigningKey != api.EncodeSigningKey(asked) {
				t.Errorf("the last proof is against %s, want the asked key", last.SigningKey)
			}
		})
	}
}
