package master

import (
	"crypto/ecdsa"
	"crypto/ed25519"
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
)

// testPKI is a cluster CA in a temporary directory, issuing certificates
// for 127.0.0.1 on demand.
type testPKI struct {
	t          *testing.T
	dir        string
	signingKey ed25519.PrivateKey
	mu         sync.Mutex
	issued     map[string]pki.Role
	clients    map[string]*http.Client // by name, sharing connections
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	if err := pki.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	key, err := pki.LoadSigningKey(filepath.Join(dir, pki.SignKey))
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{t: t, dir: dir, signingKey: key, issued: map[string]pki.Role{}, clients: map[string]*http.Client{}}
}

func (p *testPKI) caFile() string { return filepath.Join(p.dir, pki.CAFile) }

// files issues (once) a certificate of name and role and names its files.
func (p *testPKI) files(name string, role pki.Role) pki.Files {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if have, ok := p.issued[name]; !ok {
		if err := pki.Issue(p.dir, pki.IssueRequest{Role: role, Name: name, IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}); err != nil {
			p.t.Fatal(err)
		}
		p.issued[name] = role
	} else if have != role {
		p.t.Fatalf("test PKI: %s was issued as %s, asked as %s", name, have, role)
	}
	return pki.Files{CA: p.caFile(), Cert: pki.CertFile(p.dir, name), Key: pki.KeyFile(p.dir, name)}
}

// clientTLS is the client configuration of name and role; an empty name
// means no certificate (the CA only).
func (p *testPKI) clientTLS(name string, role pki.Role) *tls.Config {
	p.t.Helper()
	f := pki.Files{CA: p.caFile()}
	if name != "" {
		f = p.files(name, role)
	}
	cfg, err := f.ClientConfig()
	if err != nil {
		p.t.Fatal(err)
	}
	return cfg
}

// httpClient is an HTTP client with clientTLS(name, role).
func (p *testPKI) httpClient(name string, role pki.Role) *http.Client {
	p.t.Helper()
	return tlsHTTPClient(p.t, p.clientTLS(name, role))
}

// sharedHTTPClient is one HTTP client per name, whose connections every
// caller shares (as http.DefaultTransport's are).
func (p *testPKI) sharedHTTPClient(name string, role pki.Role) *http.Client {
	p.t.Helper()
	cfg := p.clientTLS(name, role)
	p.mu.Lock()
	defer p.mu.Unlock()
	hc, ok := p.clients[name]
	if !ok {
		tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 1024}
		p.t.Cleanup(tr.CloseIdleConnections)
		hc = &http.Client{Transport: tr, Timeout: 20 * time.Second}
		p.clients[name] = hc
	}
	return hc
}

func tlsHTTPClient(t *testing.T, cfg *tls.Config) *http.Client {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// withoutRole is a client configuration holding a certificate that the CA
// signed without a carve role (no carve:// URI), as a foreign tool might.
func (p *testPKI) withoutRole() *tls.Config {
	p.t.Helper()
	caPEM, err := os.ReadFile(p.caFile())
	if err != nil {
		p.t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		p.t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(p.dir, pki.CAKey))
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
	cfg := p.clientTLS("", "")
	cfg.Certificates = []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}
	return cfg
}
