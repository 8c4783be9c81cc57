package master

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// caFingerprint is api.CAFingerprint of the CA certificate in file.
func caFingerprint(t *testing.T, file string) string {
	t.Helper()
	cert, err := pki.ReadCertificate(file)
	if err != nil {
		t.Fatal(err)
	}
	return api.CAFingerprint(cert.RawSubjectPublicKeyInfo)
}

// TestAgentCANoted (issue 27, the CA rotation's guard): the leader's
// /cluster/status groups the live agents by the CA that issued the
// certificate they present, learnt from real TLS requests with
// certificates of two CAs (the masters trust a bundle of both, as in a
// CA rotation's steps 1 and 2): sent to the leader itself, or to a
// follower, which passes the certificate on with the write it forwards.
// An agent never heard from is listed under "", and an agent that
// presents a certificate of the new CA moves to it.
func TestAgentCANoted(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	next := pkitest.New(t)
	oldPEM, err := os.ReadFile(p.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	nextPEM, err := os.ReadFile(next.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	oldCA, nextCA := caFingerprint(t, p.CAFile()), caFingerprint(t, next.CAFile())
	if err := os.WriteFile(p.CAFile(), append(oldPEM, nextPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	bundle, err := pki.Files{CA: p.CAFile()}.Pool()
	if err != nil {
		t.Fatal(err)
	}
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	// Each master names the CA of its own certificate (check-ca compares
	// it with the new CA): the old one, in a bundle of both.
	for i, m := range c.masters {
		if got := m.ClusterStatus().CertificateCA; got != oldCA {
			t.Errorf("master %d: certificate_ca %q, want the old CA %q", i, got, oldCA)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op := c.client(leader)
	ips := map[string]string{"on-old": "198.18.3.1", "on-next": "198.18.3.2", "unseen": "198.18.3.3", "moves": "198.18.3.4"}
	for id, ip := range ips {
		if _, err := registerRetrying(ctx, op, api.RegisterRequest{AgentID: id, IP: ip}); err != nil {
			t.Fatal(err)
		}
	}
	// agent sends a usage report to master i with a certificate of ca.
	report := func(ca *pkitest.CA, id string, i int) {
		t.Helper()
		cfg := ca.ClientTLS(id, pki.RoleAgent)
		cfg.RootCAs = bundle
		cl, err := apiclient.NewClientWith([]string{c.urls()[i]}, apiclient.ClientOptions{TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.ReportUsage(ctx, id, api.UsageReport{}); err != nil {
			t.Fatalf("%s reports to master %d: %v", id, i, err)
		}
	}
	issue := func(ca *pkitest.CA, id string) {
		t.Helper()
		ca.IssueAgent(id, netip.MustParseAddr(ips[id]))
	}
	issue(p.CA, "on-old")
	issue(next, "on-next")
	issue(p.CA, "moves")
	report(p.CA, "on-old", leader)
	report(next, "on-next", follower)
	report(p.CA, "moves", follower)
	byCA := func(want []api.AgentCA) {
		t.Helper()
		testutil.Eventually(t, 0, "the leader's agents by CA", func() error {
			tr := c.masters[leader].ClusterStatus().AgentTrust
			if tr == nil || !reflect.DeepEqual(tr.ByCA, want) {
				return fmt.Errorf("agent_trust %+v, want by_ca %+v", tr, want)
			}
			return nil
		})
	}
	sorted := func(groups ...api.AgentCA) []api.AgentCA {
		if groups[1].CA > groups[2].CA {
			groups[1], groups[2] = groups[2], groups[1]
		}
		return groups
	}
	byCA(sorted(
		api.AgentCA{CA: "", Count: 1, Agents: []string{"unseen"}},
		api.AgentCA{CA: oldCA, Count: 2, Agents: []string{"moves", "on-old"}},
		api.AgentCA{CA: nextCA, Count: 1, Agents: []string{"on-next"}},
	))
	// An agent that claims another CA itself is not believed: the leader
	// takes the header from masters only.
	cfg := p.ClientTLS("on-old", pki.RoleAgent)
	cfg.RootCAs = bundle
	claim := map[string]string{presentedCAHeader: nextCA + " 4102444800"}
	if code, body := secureCall(t, tlsHTTPClient(t, cfg), "PUT", c.urls()[leader]+"/overlay-master/agents/on-old/usage", "{}", claim); code != 200 {
		t.Fatalf("on-old's usage report claiming the new CA: %d %s", code, body)
	}
	issue(next, "moves")
	report(next, "moves", leader)
	byCA(sorted(
		api.AgentCA{CA: "", Count: 1, Agents: []string{"unseen"}},
		api.AgentCA{CA: oldCA, Count: 1, Agents: []string{"on-old"}},
		api.AgentCA{CA: nextCA, Count: 2, Agents: []string{"moves", "on-next"}},
	))
	// A follower judges nothing.
	if tr := c.masters[follower].ClusterStatus().AgentTrust; tr != nil {
		t.Errorf("a follower's agent_trust: %+v, want none", tr)
	}
}

// FuzzParsePresentedCA: presentedCAHeader's value, from a follower, never
// panics, and what parses is a fingerprint in lower-case hex that reads
// back alike.
func FuzzParsePresentedCA(f *testing.F) {
	for _, seed := range []string{
		"", " ", "0ee0009fb3821bd32fc661001f27430fcb34209215fa7911fb763235cf5d36bc 1767225600",
		"0EE0009FB3821BD32FC661001F27430FCB34209215FA7911FB763235CF5D36BC -1",
		"0ee0009fb3821bd32fc661001f27430fcb34209215fa7911fb763235cf5d36bc",
		"zz e0009fb3821bd32fc661001f27430fcb34209215fa7911fb763235cf5d36bc 1",
		"0ee0 1", "0ee0009fb3821bd32fc661001f27430fcb34209215fa7911fb763235cf5d36bc 99999999999999999999",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		ca, notBefore, ok := parsePresentedCA(v)
		if !ok {
			return
		}
		if ca != strings.ToLower(ca) || len(ca) != 64 {
			t.Fatalf("%q parsed to CA %q", v, ca)
		}
		again, nb, ok := parsePresentedCA(ca + " " + strconv.FormatInt(notBefore.Unix(), 10))
		if !ok || again != ca || !nb.Equal(notBefore) {
			t.Fatalf("%q: %q %v does not read back (%q %v %v)", v, ca, notBefore, again, nb, ok)
		}
	})
}
