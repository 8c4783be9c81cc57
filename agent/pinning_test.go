package agent

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// statesRefused reads an agent's count of master states refused for a reason.
func statesRefused(t *testing.T, a *Agent, reason string) float64 {
	t.Helper()
	return counterValue(t, a.metrics.statesRefused.WithLabelValues(reason))
}

// verifyKey is the key the agent verifies with now.
func (a *Agent) verifyKey() ed25519.PublicKey {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.signingKey
}

// TestSigningKeyPinning: an agent without --signing-pub-file pins the key
// of the first master state it reads (and persists it). A master of the
// same cluster that signs with another key is refused: an error is logged,
// and nothing of its state is taken, not even an agent registered there.
// A rebuilt cluster (a new cluster id) with a new key is refused too, until
// it serves a chain from the pinned key. An agent given --signing-pub-file
// refuses masters with another key from the start.
func TestSigningKeyPinning(t *testing.T) {
	t.Parallel() // its own lab, masters, proxies and gossip network; mostly waits on the agents' retries
	hosts, dir, _ := hostsWithMaster(t, 2)
	k1pub, k1 := testKey(t)
	k2pub, k2 := testKey(t)
	m1dir := filepath.Join(dir, "signing-m1")
	m1 := mastertest.StartSigning(t, m1dir, state.DefaultConfig(), quietLogger(), k1)
	ctx := context.Background()
	if _, err := masterClient(t, m1).Register(ctx, api.RegisterRequest{AgentID: "peer", IP: "198.18.5.1", MeshAddr: "198.18.5.1:6783"}); err != nil {
		t.Fatal(err)
	}
	gnet := fakegossip.New(fakegossip.Config{Seed: 41})
	t.Cleanup(gnet.Close)
	p := newMasterProxy(t, m1)
	logs := &testutil.Logs{}
	a := runAgent(t, newTestAgent(t, hosts[0], p.URL(), filepath.Join(dir, "a0"), gnet, func(c *Config) { c.Logger = logs.Logger() }))
	testutil.Eventually(t, 0, "the agent programs peer and pins the masters' key", testutil.True(func() bool {
		return programmedPeers(a.Agent)["peer"] && a.verifyKey().Equal(k1pub)
	}))
	if !logs.Has(slog.LevelInfo, "pinned from their state") {
		t.Error("no log of the pinned key")
	}
	if got := a.snapshot().SigningKey; !got.Equal(k1pub) {
		t.Errorf("the key persisted is %x, want the pinned one", got)
	}
	// The same cluster (the same data dir) restarted with another key, and
	// an agent registered there meanwhile. What the agent holds is read
	// once it has found the first master gone: its own reports move the
	// state index until then, and an answer may be in flight at the close.
	m1.Close()
	testutil.Eventually(t, 0, "the agent finds the first master gone", testutil.True(func() bool { return !a.Peers().MastersReachable }))
	before := a.members.State()
	index := a.Peers().MasterIndex
	m1b := mastertest.StartSigning(t, m1dir, state.DefaultConfig(), quietLogger(), k2)
	if _, err := masterClient(t, m1b).Register(ctx, api.RegisterRequest{AgentID: "late", IP: "198.18.5.2"}); err != nil {
		t.Fatal(err)
	}
	p.switchTo(m1b)
	// Two: the agent had taken the first refusal in (it marks the masters
	// unreachable) when it reads the second state.
	testutil.Eventually(t, 0, "the agent refuses two states of the master with another key", testutil.True(func() bool {
		return statesRefused(t, a.Agent, stateRefusedKey) >= 2
	}))
	if p.statesServed() < 2 {
		t.Errorf("%d states read from the master with another key, and 2 refused", p.statesServed())
	}
	if !logs.Has(slog.LevelError, "the masters sign with key") {
		t.Error("the refused key was not logged as an error")
	}
	if got := a.members.State(); !reflect.DeepEqual(got, before) {
		t.Errorf("the membership changed with a refused state:\n got %+v\nwant %+v", got, before)
	}
	if got := a.Peers(); got.MasterIndex != index || got.MastersReachable {
		t.Errorf("after refused states: master index %d (was %d), masters reachable %v", got.MasterIndex, index, got.MastersReachable)
	}
	if !a.verifyKey().Equal(k1pub) {
		t.Error("the pinned key was replaced by a refused state's")
	}

	// A rebuilt cluster with its own key and no chain from the pinned one
	// (issue 19, item 7): refused, like any other master with another key.
	m1b.Close()
	m2 := mastertest.StartSigning(t, filepath.Join(dir, "signing-m2"), state.DefaultConfig(), quietLogger(), k2)
	if _, err := masterClient(t, m2).Register(ctx, api.RegisterRequest{AgentID: "peer2", IP: "198.18.5.3", MeshAddr: "198.18.5.3:6783"}); err != nil {
		t.Fatal(err)
	}
	refusedBefore := statesRefused(t, a.Agent, stateRefusedKey)
	p.switchTo(m2)
	testutil.Eventually(t, 0, "the agent refuses the rebuilt cluster's new key", testutil.True(func() bool {
		return statesRefused(t, a.Agent, stateRefusedKey) >= refusedBefore+2
	}))
	if !a.verifyKey().Equal(k1pub) {
		t.Error("the pinned key was replaced by a rebuilt cluster's without a chain")
	}
	if pp := programmedPeers(a.Agent); pp["peer2"] {
		t.Errorf("programmed peers %v: peer2 of the refused cluster among them", pp)
	}

	// The rebuilt cluster serves a chain from the pinned key: followed.
	if err := m2.SetSigning(k2, &api.SigningChain{Links: []api.SigningLink{api.NewSigningLink(k1, k2pub)}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the agent follows the chain to the rebuilt cluster's key", func() error {
		if !a.verifyKey().Equal(k2pub) {
			return fmt.Errorf("still verifying with the old key")
		}
		if pp := programmedPeers(a.Agent); !pp["peer2"] || pp["peer"] {
			return fmt.Errorf("programmed peers %v, want peer2 of the new cluster only", pp)
		}
		return nil
	})
	if !logs.Has(slog.LevelWarn, "signing key chain leads from the trusted key to a new one") {
		t.Error("the new key taken through the chain was not logged")
	}

	// --signing-pub-file with the old key, the chain dropped: the new
	// cluster's state is refused. The agent that followed keeps its key.
	if err := m2.SetSigning(k2, nil); err != nil {
		t.Fatal(err)
	}
	p2 := newMasterProxy(t, m2)
	b := runAgent(t, newTestAgent(t, hosts[1], p2.URL(), filepath.Join(dir, "a1"), gnet, func(c *Config) { c.SigningKey = k1pub }))
	testutil.Eventually(t, 0, "the agent with --signing-pub-file refuses a master with another key", testutil.True(func() bool {
		return p2.statesServed() >= 2 && statesRefused(t, b.Agent, stateRefusedKey) >= 2
	}))
	if n := b.members.Len(); n != 0 || b.Peers().MasterIndex != 0 {
		t.Errorf("the agent with --signing-pub-file took %d records, master index %d, from refused states", n, b.Peers().MasterIndex)
	}
}

// TestUnsignedMasters: an agent that talks TLS to masters that sign
// nothing refuses their state, as an error; an agent that runs --insecure
// against plain http masters that sign nothing takes it, with a warning.
func TestUnsignedMasters(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 2)
	if _, err := masterClient(t, m).Register(context.Background(), api.RegisterRequest{AgentID: "peer", IP: "198.18.5.1"}); err != nil {
		t.Fatal(err)
	}
	gnet := fakegossip.New(fakegossip.Config{Seed: 42})
	t.Cleanup(gnet.Close)
	ca := newTestCA(t)
	tm := newTLSMaster(t, m, ca.files(pki.RoleMaster, "m1", "127.0.0.1"))
	tlsLogs, plainLogs := &testutil.Logs{}, &testutil.Logs{}
	overTLS := runAgent(t, newTestAgent(t, hosts[0], tm.srv.URL, filepath.Join(dir, "a0"), gnet, func(c *Config) {
		c.ID, c.TLS, c.MeshPassword, c.Insecure, c.Logger = "", ca.files(pki.RoleAgent, "host-1", "127.0.0.1"), []byte("s3cret"), false, tlsLogs.Logger()
	}))
	plain := runAgent(t, newTestAgent(t, hosts[1], "http://"+m.HTTPAddr(), filepath.Join(dir, "a1"), gnet, func(c *Config) { c.Logger = plainLogs.Logger() }))

	testutil.Eventually(t, 0, "the TLS agent refuses the unsigned states", testutil.True(func() bool {
		return statesRefused(t, overTLS.Agent, stateRefusedUnsigned) >= 2
	}))
	if !tlsLogs.Has(slog.LevelError, "requires signed records") {
		t.Error("the TLS agent did not log the unsigned masters as an error")
	}
	if overTLS.members.Len() != 0 {
		t.Errorf("the TLS agent took %d records from unsigned states", overTLS.members.Len())
	}
	testutil.Eventually(t, 0, "the --insecure agent programs peer", testutil.True(func() bool { return programmedPeers(plain.Agent)["peer"] }))
	if !plainLogs.Has(slog.LevelWarn, "the masters sign nothing") {
		t.Error("the --insecure agent did not warn that nothing is verified")
	}
	if plain.verifyKey() != nil || statesRefused(t, plain.Agent, stateRefusedUnsigned) != 0 {
		t.Errorf("the --insecure agent pinned %x, refused %v states", plain.verifyKey(), statesRefused(t, plain.Agent, stateRefusedUnsigned))
	}
}

// TestNewSigningKeyFollowedAtOnce (issue 27, item 3): the masters switch to
// a new signing key endorsed by a chain from the pinned one (carve certs
// rotate-signing --switch and a reload). The agent follows within a
// backoff step: the watch that wakes with the new key reads the whole
// state, re-signed, at once, not after a long poll of WatchWait at masters
// whose index did not move (before: 30 s, long enough for a quick --finish
// to strand every agent).
func TestNewSigningKeyFollowedAtOnce(t *testing.T) {
	hosts, dir, _ := hostsWithMaster(t, 1)
	k1pub, k1 := testKey(t)
	k2pub, k2 := testKey(t)
	m := mastertest.StartSigning(t, filepath.Join(dir, "signing-m1"), state.DefaultConfig(), quietLogger(), k1)
	gnet := fakegossip.New(fakegossip.Config{Seed: 43})
	t.Cleanup(gnet.Close)
	a := runAgent(t, newTestAgent(t, hosts[0], "http://"+m.HTTPAddr(), filepath.Join(dir, "a0"), gnet, func(c *Config) { c.WatchWait = time.Minute }))
	testutil.Eventually(t, 0, "the agent pins the masters' key and reaches their index", testutil.True(func() bool {
		return a.verifyKey().Equal(k1pub) && a.Peers().MastersReachable && a.Peers().MasterIndex == masterState(t, m).Index
	}))
	if err := m.SetSigning(k2, &api.SigningChain{Links: []api.SigningLink{api.NewSigningLink(k1, k2pub)}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.Eventually(t, maxWatchRetry+5*time.Second, "the agent follows the new key", testutil.True(func() bool { return a.verifyKey().Equal(k2pub) }))
	t.Logf("followed the new key after %v (watch wait 1m)", time.Since(start).Round(time.Millisecond))
}
