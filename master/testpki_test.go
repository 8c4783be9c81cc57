package master

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
)

// testPKI is a test's cluster CA with the HTTP clients the tests use.
type testPKI struct {
	*pkitest.CA
	t       *testing.T
	mu      sync.Mutex
	clients map[string]*http.Client // by name, sharing connections
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	return &testPKI{CA: pkitest.New(t), t: t, clients: map[string]*http.Client{}}
}

// httpClient is an HTTP client with clientTLS(name, role).
func (p *testPKI) httpClient(name string, role pki.Role) *http.Client {
	p.t.Helper()
	return tlsHTTPClient(p.t, p.ClientTLS(name, role))
}

// sharedHTTPClient is one HTTP client per name, whose connections every
// caller shares (as http.DefaultTransport's are), bounded (boundedClient).
func (p *testPKI) sharedHTTPClient(name string, role pki.Role) *http.Client {
	p.t.Helper()
	cfg := p.ClientTLS(name, role)
	p.mu.Lock()
	defer p.mu.Unlock()
	hc, ok := p.clients[name]
	if !ok {
		hc = boundedClient(p.t, cfg)
		p.clients[name] = hc
	}
	return hc
}

// sharedConnsPerMaster bounds the connections of a shared client to one master.
const sharedConnsPerMaster = 32

// boundedClient is an HTTP client (with TLS when cfg is set) whose
// callers share at most sharedConnsPerMaster connections to each master,
// as a few agents would: 500 concurrent registrations opening one
// connection each (TLS handshakes, and http.DefaultTransport's churn of
// all but two) spent both cores under -race, so that 50 registrations took
// over 30s and TestClusterRegistrationsThroughLeaderFailover failed; that
// tested nothing of the masters.
func boundedClient(t *testing.T, cfg *tls.Config) *http.Client {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: sharedConnsPerMaster, MaxConnsPerHost: sharedConnsPerMaster}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func tlsHTTPClient(t *testing.T, cfg *tls.Config) *http.Client {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// agentClient is an HTTP client with the certificate of agent name, which
// names the underlay ip it registers.
func agentClient(p *testPKI, name, ip string) *http.Client {
	p.t.Helper()
	p.IssueAgent(name, netip.MustParseAddr(ip))
	return p.httpClient(name, pki.RoleAgent)
}

// withoutRole is a client configuration holding a certificate that the CA
// signed without a carve role (no carve:// URI), as a foreign tool might.
func (p *testPKI) withoutRole() *tls.Config {
	p.t.Helper()
	caPEM, err := os.ReadFile(p.CAFile())
	if err != nil {
		p.t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		p.t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(p.Dir, pki.CAKey))
	if err != nil {
		p.t.Fatal(err)
	}
	block, _ = pem.Decode(keyPEM)
	caKey, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		p.t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "no-role"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	cfg := p.ClientTLS("", "")
	cfg.Certificates = []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}
	return cfg
}
