package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// maxPingWindow bounds the longest run of lost pings any pair may see
// during the rotations: "a few seconds".
const maxPingWindow = 3 * time.Second

// rotationLab is a cluster whose containers ping one another while its
// keys and certificates are rotated.
type rotationLab struct {
	c          *labcluster.Cluster
	containers []*labcluster.Container
}

// works checks the control plane after a rotation step: the harness
// reaches the masters over a new TLS connection, every agent converges
// (registration, the masters' watch, gossip), and a container attached on
// host h pings every container on the other hosts, and they it.
func (l *rotationLab) works(ctx context.Context, t *testing.T, step string, h *labcluster.Host) {
	t.Helper()
	l.c.HTTPClient().CloseIdleConnections()
	l.state(ctx, t, step+": the masters' state over a new connection")
	if err := l.c.WaitConverged(ctx); err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	ct, err := l.c.AddCNIContainer(ctx, h, "carve", labcluster.CNIOptions{})
	if err != nil {
		t.Fatalf("%s: a new container on %s: %v", step, h.Name, err)
	}
	l.containers = append(l.containers, ct)
	pingAll(ctx, t, l.containers)
	// Nothing refused on the way: no mesh handshake (gossip never split),
	// no master state for its signing key.
	for _, h := range l.c.Hosts() {
		for _, sample := range []string{"carve_agent_mesh_handshakes_refused_total", `carve_agent_master_states_refused_total{reason="signing_key"}`} {
			if v, err := agentMetric(ctx, l.c, h, sample); err != nil || v != 0 {
				t.Errorf("%s: %s of %s is %v (%v), want 0", step, sample, h.Name, v, err)
			}
		}
	}
}

// checkCA runs a CA rotation's step-3 guard, carve certs check-ca with
// the new CA, as an operator on the first host does, until it judges as
// expected: with no agents named it passes (exit 0); with agents named
// it fails naming exactly those as on another CA than the new one (an
// agent moves to the new CA once the masters see its new certificate).
func (l *rotationLab) checkCA(ctx context.Context, t *testing.T, step string, within time.Duration, onOld ...string) {
	t.Helper()
	args := append([]string{"certs", "check-ca", "--new-ca-file", l.c.NextCAFile(), "--masters", strings.Join(l.c.MasterURLs(), ",")}, l.c.OperatorArgs()...)
	testutil.Eventually(t, within, step+": carve certs check-ca", func() error {
		out, err := l.c.RunCarve(ctx, l.c.Host(1), args...)
		if len(onOld) == 0 {
			if err != nil {
				return err
			}
			t.Logf("%s: %s", step, strings.TrimSpace(string(out)))
			return nil
		}
		if err == nil {
			return fmt.Errorf("check-ca passed (%s), want it to name %v on the old CA", strings.TrimSpace(string(out)), onOld)
		}
		msg := err.Error()
		want := fmt.Sprintf("%d live agents present a certificate of another CA than %s: ", len(onOld), l.c.NextCAFile())
		if !strings.Contains(msg, want) || !strings.Contains(msg, "carve certs issue --dir NEW") {
			return fmt.Errorf("check-ca: %s; want it to name %d agents on another CA and the fix", msg, len(onOld))
		}
		for _, id := range onOld {
			if !strings.Contains(msg, ": "+id+" (CA ") && !strings.Contains(msg, ", "+id+" (CA ") {
				return fmt.Errorf("check-ca: %s; want it to name %s", msg, id)
			}
		}
		t.Logf("%s: check-ca refuses step 3: %s", step, msg)
		return nil
	})
}

// meshRound is the operator's copy of a round's mesh password files, for
// carve certs check-mesh (accepted "": none).
type meshRound struct{ password, accepted string }

// checkMesh runs the guard at the end of a round of a mesh password
// change, carve certs check-mesh with the round's files, as an operator
// on the first host does, until it judges as expected: with no agents
// named it passes (exit 0) counting every agent live; with agents named
// it fails naming exactly those as not on the round (an agent moves to
// it once the masters have its report after its reload).
func (l *rotationLab) checkMesh(ctx context.Context, t *testing.T, step string, files meshRound, behind ...string) {
	t.Helper()
	args := []string{"certs", "check-mesh", "--password-file", files.password}
	if files.accepted != "" {
		args = append(args, "--accepted-file", files.accepted)
	}
	args = append(append(args, "--masters", strings.Join(l.c.MasterURLs(), ",")), l.c.OperatorArgs()...)
	testutil.Eventually(t, converge, step+": carve certs check-mesh", func() error {
		out, err := l.c.RunCarve(ctx, l.c.Host(1), args...)
		if len(behind) == 0 {
			if err != nil {
				return err
			}
			if want := fmt.Sprintf("every live agent (%d) ", len(l.c.Hosts())); !strings.Contains(string(out), want) {
				return fmt.Errorf("check-mesh passed saying %q, want %q", strings.TrimSpace(string(out)), want)
			}
			t.Logf("%s: %s", step, strings.TrimSpace(string(out)))
			return nil
		}
		if err == nil {
			return fmt.Errorf("check-mesh passed (%s), want it to name %v as not on the round", strings.TrimSpace(string(out)), behind)
		}
		msg := err.Error()
		want := fmt.Sprintf("%d live agents are not on this round", len(behind))
		if !strings.Contains(msg, want) || !strings.Contains(msg, "SIGHUP them") {
			return fmt.Errorf("check-mesh: %s; want it to name %d agents not on the round and the fix", msg, len(behind))
		}
		for _, id := range behind {
			if !strings.Contains(msg, ": "+id+" (sends ") && !strings.Contains(msg, ", "+id+" (sends ") {
				return fmt.Errorf("check-mesh: %s; want it to name %s", msg, id)
			}
		}
		t.Logf("%s: check-mesh refuses the round as finished: %s", step, msg)
		return nil
	})
}

// writeFile writes content into a new file of dir, for the operator.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// state is the masters' state (a consistent read), read again while the
// masters answer 503 no_leader, and only then: an operator retries what
// the API says to retry. The reloads do not cost the leader (a reload
// swaps the TLS files for new handshakes and leaves the Raft connections
// open: master.ReloadTLS, pki.Reloader), but on a loaded machine (CI,
// load average 15-25 on two cores) a leader starved of CPU for its 500 ms
// lease steps down, now and then right after a reload, and the read came
// in before the next election: "no leader elected yet; retry (no_leader,
// HTTP 503)". Any other error, a refused TLS handshake say, fails at once.
func (l *rotationLab) state(ctx context.Context, t *testing.T, what string) *api.State {
	t.Helper()
	var st *api.State
	testutil.Eventually(t, converge, what, func() error {
		var err error
		st, err = l.c.State(ctx)
		if err != nil && !api.IsCode(err, api.CodeNoLeader) {
			return retry.Permanent(err)
		}
		return err
	})
	return st
}

// terms is every master's role and Raft term, for the log: a term that
// moves across a reload tells an election from a reload's failure.
func (l *rotationLab) terms(ctx context.Context) string {
	var b strings.Builder
	for _, m := range l.c.Masters() {
		cl, err := apiclient.NewClient([]string{m.URL()}, l.c.HTTPClient())
		if err != nil {
			return err.Error()
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cs, err := cl.ClusterStatus(cctx)
		cancel()
		if err != nil {
			fmt.Fprintf(&b, " %s: %v;", m.ID, err)
			continue
		}
		fmt.Fprintf(&b, " %s %s of term %d;", m.ID, cs.Role, cs.Term)
	}
	return strings.TrimSuffix(strings.TrimPrefix(b.String(), " "), ";")
}

// restartAgent stops and starts h's agent, which then makes every
// connection anew with the files as they are now.
func (l *rotationLab) restartAgent(ctx context.Context, t *testing.T, h *labcluster.Host) {
	t.Helper()
	if err := l.c.StopAgent(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := l.c.StartAgent(h); err != nil {
		t.Fatal(err)
	}
	if _, err := l.c.WaitAgent(ctx, h); err != nil {
		t.Fatalf("%s restarted: %v", h.Name, err)
	}
}

// servedSerial is the serial number of the certificate the server at url
// presents to a new connection.
func (l *rotationLab) servedSerial(ctx context.Context, url string) (*big.Int, error) {
	l.c.HTTPClient().CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
	if err != nil {
		return nil, err
	}
	resp, err := l.c.HTTPClient().Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
		return nil, fmt.Errorf("%s: no TLS certificate", url)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber, nil
}

// TestRotationWithoutDowntime is issue 19's rotations, each as
// docs/security.md ("Rotation") tells the operator, on three masters and
// three hosts, with a container per host pinging every container on the
// other hosts all along (no pair may lose pings for longer than
// maxPingWindow). Every step reloads processes with SIGHUP, one by one;
// after each, the control plane is checked (works), and an agent restarted
// here and there makes its connections anew.
//
//  1. The CA: a bundle of the old and a new CA, certificates re-issued by
//     the new one, the old one dropped. Step 3's guard (carve certs
//     check-ca) names every agent on the old CA before the re-issue, h3
//     alone while it is left on its old certificate, and passes once it
//     reloads too.
//  2. Certificate renewal: a master and an agent serve their new
//     certificate after a reload.
//  3. The masters' record-signing key: the chain served, the new key
//     switched to (every agent follows it, with no restart), the chain
//     dropped.
//  4. The mesh password: the next one accepted, sent, the old one dropped.
//     Each round's guard (carve certs check-mesh) names the agent left
//     for last before its reload, and passes once it reloads.
func TestRotationWithoutDowntime(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	ctx := within(t, 16*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitKernelMatchesMasters(ctx, t, c)
	l := &rotationLab{c: c, containers: containerPerHost(ctx, t, c)}
	pingAll(ctx, t, l.containers)
	watch := labcluster.WatchPings(ctx, l.containers, 200*time.Millisecond)
	stopped := false
	checkPings := func() {
		stopped = true
		windows := watch.Stop()
		t.Logf("pings during the rotations, longest window first:\n%s", labcluster.FormatPingWindows(windows))
		for _, w := range windows {
			if w.Longest > maxPingWindow {
				t.Errorf("%s -> %s lost pings for %s (%d of %d lost), more than %s", w.From, w.To, w.Longest, w.Lost, w.Sent, maxPingWindow)
			}
			if w.Sent == 0 {
				t.Errorf("%s -> %s: no ping sent", w.From, w.To)
			}
		}
	}
	t.Cleanup(func() {
		if !stopped {
			checkPings()
		}
	})
	h1, h2, h3 := c.Host(1), c.Host(2), c.Host(3)
	reloadAll := func(step string) {
		t.Helper()
		before := l.terms(ctx)
		if err := c.ReloadAll(ctx); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		t.Logf("%s: masters before the reload: %s; after: %s", step, before, l.terms(ctx))
	}
	reloadMasters := func(step string) {
		t.Helper()
		before := l.terms(ctx)
		if err := c.ReloadMasters(ctx); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		t.Logf("%s: masters before the reload: %s; after: %s", step, before, l.terms(ctx))
	}

	// 1. The CA.
	if err := c.BeginCARotation(); err != nil {
		t.Fatal(err)
	}
	reloadAll("CA: the bundle")
	l.works(ctx, t, "CA: the bundle", h1)
	// The operator's certificate of the old CA, to try once it is dropped.
	oldOperator, err := tls.LoadX509KeyPair(c.OperatorFiles().Cert, c.OperatorFiles().Key)
	if err != nil {
		t.Fatal(err)
	}
	// Step 3's guard: every agent still presents a certificate of the old CA.
	l.checkCA(ctx, t, "CA: the bundle", converge, h1.AgentID(), h2.AgentID(), h3.AgentID())
	// The masters and this operator are on the old CA too: step 3 would
	// cut them off as well, and the guard names them.
	checkArgs := append([]string{"certs", "check-ca", "--new-ca-file", c.NextCAFile(), "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
	if out, err := c.RunCarve(ctx, h1, checkArgs...); err == nil || !strings.Contains(err.Error(), "3 masters present a certificate of another CA") || !strings.Contains(err.Error(), "this operator's certificate") {
		t.Errorf("CA: the bundle: check-ca does not name the masters and the operator on the old CA: %v\n%s", err, out)
	}
	if err := c.ReissueCertificates(); err != nil {
		t.Fatal(err)
	}
	// Every process but h3's agent reloads: h3 is left on its certificate
	// of the old CA, which step 3 would cut off, and the guard says so.
	terms := l.terms(ctx)
	if err := c.ReloadMasters(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*labcluster.Host{h1, h2} {
		if err := c.Reload(ctx, h.Agent); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ReloadHarness(); err != nil {
		t.Fatal(err)
	}
	t.Logf("CA: certificates of the new CA but h3's: masters before the reload: %s; after: %s", terms, l.terms(ctx))
	// An agent presents its new certificate on its next connection: its
	// next usage report at the latest (every minute).
	l.checkCA(ctx, t, "CA: h3 left on the old CA", 2*converge, h3.AgentID())
	if err := c.Reload(ctx, h3.Agent); err != nil {
		t.Fatal(err)
	}
	l.checkCA(ctx, t, "CA: certificates of the new CA", 2*converge)
	l.works(ctx, t, "CA: certificates of the new CA", h2)
	if err := c.FinishCARotation(); err != nil {
		t.Fatal(err)
	}
	reloadAll("CA: the old CA dropped")
	l.restartAgent(ctx, t, h3)
	l.works(ctx, t, "CA: the old CA dropped", h3)
	pool, err := c.OperatorFiles().Pool()
	if err != nil {
		t.Fatal(err)
	}
	stale := c.HTTPClientWith(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{oldOperator}})
	staleClient, err := apiclient.NewClient([]string{c.Masters()[0].URL()}, stale)
	if err != nil {
		t.Fatal(err)
	}
	// Refused in the handshake: an HTTP answer, 503 no_leader above all,
	// is no refusal (the client reports a failed handshake as an api.Error
	// of status 0).
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var apiErr *api.Error
	if _, err := staleClient.State(sctx, apiclient.StateOptions{}); err == nil || errors.As(err, &apiErr) && apiErr.Status != 0 {
		t.Errorf("CA: a certificate of the dropped CA is still accepted by the masters: %v", err)
	} else {
		t.Logf("CA: a certificate of the dropped CA is refused: %v", err)
	}

	// 2. Certificate renewal: new serials served after a reload.
	before := map[string]*big.Int{}
	urls := map[string]string{"m1": c.Masters()[0].URL(), h2.Name: h2.AgentURL()}
	for name, url := range urls {
		s, err := l.servedSerial(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		before[name] = s
	}
	if err := c.ReissueCertificates(); err != nil {
		t.Fatal(err)
	}
	reloadAll("renewal")
	for name, url := range urls {
		s, err := l.servedSerial(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		if s.Cmp(before[name]) == 0 {
			t.Errorf("renewal: %s still serves the certificate of serial %s", name, s)
		}
	}
	l.works(ctx, t, "renewal", h1)

	// 3. The masters' record-signing key.
	oldKey, err := c.SigningKey()
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := c.BeginSigningRotation()
	if err != nil {
		t.Fatal(err)
	}
	reloadMasters("signing: the chain")
	st := l.state(ctx, t, "signing: the state after the chain's reload")
	if st.SigningKey != oldKey || st.SigningChain == nil || len(st.SigningChain.Links) != 1 || st.SigningChain.Links[0].Key != newKey {
		t.Fatalf("signing: after the chain's reload the state signs with %s and carries chain %+v; want %s and a link to %s", st.SigningKey, st.SigningChain, oldKey, newKey)
	}
	if err := c.SwitchSigningKey(); err != nil {
		t.Fatal(err)
	}
	reloadMasters("signing: the new key")
	for _, h := range c.Hosts() {
		err := retry.Until(ctx, 200*time.Millisecond, func() error {
			v, err := agentMetric(ctx, c, h, "carve_agent_signing_keys_followed_total")
			if err != nil || v != 1 {
				return fmt.Errorf("%s followed %v new keys (%v), want 1", h.Name, v, err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("signing: %v", err)
		}
	}
	if st = l.state(ctx, t, "signing: the state with the new key"); st.SigningKey != newKey {
		t.Fatalf("signing: the state signs with %v, want the new key %s", st.SigningKey, newKey)
	}
	l.works(ctx, t, "signing: the new key", h2)
	if err := c.FinishSigningRotation(); err != nil {
		t.Fatal(err)
	}
	reloadMasters("signing: the chain dropped")
	if st = l.state(ctx, t, "signing: the state without the chain"); st.SigningChain != nil {
		t.Fatalf("signing: after the chain was dropped the state carries %+v", st.SigningChain)
	}
	l.restartAgent(ctx, t, h1)
	l.works(ctx, t, "signing: the chain dropped", h3)

	// 4. The mesh password, in three rounds over every agent; an agent
	// restarted in each round makes its mesh connections anew. The agent
	// reloaded last in a round is named by the round's guard until it
	// reloads: the next round would cut it off.
	old, err := c.MeshPassword()
	if err != nil {
		t.Fatal(err)
	}
	var secret [16]byte
	if _, err := rand.Read(secret[:]); err != nil {
		t.Fatal(err)
	}
	next := hex.EncodeToString(secret[:])
	opDir := t.TempDir() // the operator's copies of the passwords
	oldFile, nextFile := writeFile(t, opDir, "old.pw", old+"\n"), writeFile(t, opDir, "next.pw", next+"\n")
	for i, round := range []struct {
		name, password, accepted string
		files                    meshRound
		last, restart            *labcluster.Host
	}{
		{"mesh: the next password accepted", old, next, meshRound{oldFile, nextFile}, h3, h2},
		{"mesh: the next password sent", next, old, meshRound{nextFile, oldFile}, h1, h3},
		{"mesh: the old password dropped", next, "", meshRound{nextFile, ""}, h2, h1},
	} {
		if err := c.SetMeshPasswords(round.password, round.accepted); err != nil {
			t.Fatal(err)
		}
		for _, h := range c.Hosts() {
			if h == round.last {
				continue
			}
			if err := c.Reload(ctx, h.Agent); err != nil {
				t.Fatalf("%s: %v", round.name, err)
			}
		}
		l.checkMesh(ctx, t, round.name+", "+round.last.Name+" not reloaded", round.files, round.last.AgentID())
		if err := c.Reload(ctx, round.last.Agent); err != nil {
			t.Fatalf("%s: %v", round.name, err)
		}
		l.restartAgent(ctx, t, round.restart)
		l.checkMesh(ctx, t, round.name, round.files)
		l.works(ctx, t, round.name, c.Host(1+i))
	}
	// The gauge is set every 10 s.
	for _, h := range c.Hosts() {
		err := retry.Until(ctx, time.Second, func() error {
			if v, err := agentMetric(ctx, c, h, "carve_agent_gossip_peers"); err != nil || v != 2 {
				return fmt.Errorf("mesh: %s knows %v gossip peers (%v), want 2", h.Name, v, err)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
	checkPings()
}
