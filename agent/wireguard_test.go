package agent

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestRotateWireGuardKeyOverTLS: only an operator rotates an agent's key;
// the rotation answers once the masters signed the new key, which then is
// the agent's.
func TestRotateWireGuardKeyOverTLS(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 1)
	ca := newTestCA(t)
	tm := newTLSMaster(t, m, ca.files(pki.RoleMaster, "m1", "127.0.0.1"))
	gnet := fakegossip.New(fakegossip.Config{Seed: 22})
	t.Cleanup(gnet.Close)
	a := runAgent(t, newTestAgent(t, hosts[0], tm.srv.URL, filepath.Join(dir, "a0"), gnet, func(c *Config) {
		c.ID, c.TLS, c.MeshPassword, c.Insecure = "", ca.files(pki.RoleAgent, "h1-agent", "127.0.0.1"), []byte("s3cret"), false
	}))
	var before string
	testutil.Eventually(t, 0, "the agent registered its key", func() error {
		a.mu.RLock()
		defer a.mu.RUnlock()
		if a.self == nil || a.self.Keys.WireGuard == "" {
			return errors.New("no key in its record yet")
		}
		before = a.self.Keys.WireGuard
		return nil
	})
	base := "https://" + a.HTTPAddr()
	agentClient := api.NewAgentClient(base, httpsClient(t, ca.files(pki.RoleAgent, "h2-agent", "198.18.0.99")))
	if _, err := agentClient.RotateWireGuardKey(context.Background()); !api.IsCode(err, api.CodeForbidden) {
		t.Fatalf("rotation by another agent: %v, want 403 forbidden", err)
	}
	st, err := api.NewAgentClient(base, httpsClient(t, ca.files(pki.RoleOperator, "op"))).RotateWireGuardKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.RegisteredKey == before || st.RegisteredKey != st.PublicKey {
		t.Fatalf("after the rotation: registered %s, holds %s; before %s", st.RegisteredKey, st.PublicKey, before)
	}
	if rec, ok := m.Table().Agent(a.ID()); !ok || rec.Keys.WireGuard != st.RegisteredKey {
		t.Fatalf("the masters' record carries %v, want %s", rec, st.RegisteredKey)
	}
}
