// Package pkitest gives tests a cluster CA of their own: certificates for
// 127.0.0.1 issued on demand, and the TLS configurations made from them.
package pkitest

import (
	"crypto/ed25519"
	"crypto/tls"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/pki"
)

// CA is a cluster CA (and the masters' signing key) in a temporary
// directory of the test.
type CA struct {
	// Dir holds the CA's files and the certificates issued.
	Dir string
	// SigningKey is the masters' record-signing key (pki.SignKey).
	SigningKey ed25519.PrivateKey

	t      testing.TB
	mu     sync.Mutex
	issued map[string]pki.Role
}

// New creates a CA in a temporary directory removed when the test ends.
func New(t testing.TB) *CA {
	t.Helper()
	dir := t.TempDir()
	if err := pki.CreateCA(dir, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	key, err := pki.LoadSigningKey(filepath.Join(dir, pki.SignKey))
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Dir: dir, SigningKey: key, t: t, issued: map[string]pki.Role{}}
}

// CAFile is the CA certificate's path (--ca-file).
func (ca *CA) CAFile() string { return filepath.Join(ca.Dir, pki.CAFile) }

// Files issues, once per name, a certificate of the role for 127.0.0.1
// and names its files; asking a name again with another role fails the test.
func (ca *CA) Files(name string, role pki.Role) pki.Files {
	ca.t.Helper()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if have, ok := ca.issued[name]; !ok {
		if err := pki.Issue(ca.Dir, pki.IssueRequest{Role: role, Name: name, IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}); err != nil {
			ca.t.Fatal(err)
		}
		ca.issued[name] = role
	} else if have != role {
		ca.t.Fatalf("pkitest: %s was issued as %s, asked as %s", name, have, role)
	}
	return pki.Files{CA: ca.CAFile(), Cert: pki.CertFile(ca.Dir, name), Key: pki.KeyFile(ca.Dir, name)}
}

// IssueAgent issues the agent certificate of name for 127.0.0.1 and the
// underlay IPs it registers (the masters accept only an IP the certificate
// names); later Files, ClientTLS and ServerTLS calls for name use it. Call
// it before any of them for name.
func (ca *CA) IssueAgent(name string, underlay ...netip.Addr) {
	ca.t.Helper()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if _, ok := ca.issued[name]; ok {
		ca.t.Fatalf("pkitest: %s is already issued", name)
	}
	ips := append([]netip.Addr{netip.MustParseAddr("127.0.0.1")}, underlay...)
	if err := pki.Issue(ca.Dir, pki.IssueRequest{Role: pki.RoleAgent, Name: name, IPs: ips}); err != nil {
		ca.t.Fatal(err)
	}
	ca.issued[name] = pki.RoleAgent
}

// ClientTLS is the client configuration with the certificate of name and
// role; an empty name gives the CA alone (no client certificate).
func (ca *CA) ClientTLS(name string, role pki.Role) *tls.Config {
	ca.t.Helper()
	f := pki.Files{CA: ca.CAFile()}
	if name != "" {
		f = ca.Files(name, role)
	}
	cfg, err := f.ClientConfig()
	if err != nil {
		ca.t.Fatal(err)
	}
	return cfg
}

// ServerTLS is the server configuration with the certificate of name and
// role (pki.Files.ServerConfig).
func (ca *CA) ServerTLS(name string, role pki.Role, requireClient bool) *tls.Config {
	ca.t.Helper()
	cfg, err := ca.Files(name, role).ServerConfig(requireClient)
	if err != nil {
		ca.t.Fatal(err)
	}
	return cfg
}
