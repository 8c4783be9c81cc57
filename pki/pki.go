// Package pki is carve's trust: one cluster CA, certificates that carry a
// role (master, agent, operator) and a name (for an agent, its agent id),
// the TLS configurations every component uses, and the ed25519 key the
// masters sign agent records with. It uses crypto/x509 only: no openssl.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/atomicfile"
)

// Role is what a certificate's holder may do.
type Role string

// The roles. A master's certificate also serves the Raft transport and
// master-to-master forwarding; an agent's names its agent id; an operator
// may do everything through the API.
const (
	RoleMaster   Role = "master"
	RoleAgent    Role = "agent"
	RoleOperator Role = "operator"
)

// ParseRole checks a role name.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RoleMaster, RoleAgent, RoleOperator:
		return r, nil
	}
	return "", fmt.Errorf("role %q: want master, agent or operator", s)
}

// Identity is who a certificate names.
type Identity struct {
	Role Role
	Name string
}

func (id Identity) String() string { return string(id.Role) + "/" + id.Name }

// uriScheme is the scheme of the URI SAN that carries the identity:
// carve://<role>/<name>.
const uriScheme = "carve"

// Sentinel errors callers branch on.
var (
	// ErrNoIdentity: the certificate carries no carve identity.
	ErrNoIdentity = errors.New("certificate carries no carve role")
	// ErrExists: CreateCA or Issue would overwrite a file.
	ErrExists = errors.New("file exists")
)

// File names inside a certificate directory.
const (
	CAFile  = "ca.pem"
	CAKey   = "ca-key.pem"
	SignKey = "signing.key" // the masters' ed25519 record-signing key (PKCS#8 PEM)
	SignPub = "signing.pub" // its public half (PKIX PEM), for agents
)

// CertFile and KeyFile name an issued certificate's files in a directory.
func CertFile(dir, name string) string { return filepath.Join(dir, name+".pem") }

// KeyFile is the private key beside CertFile.
func KeyFile(dir, name string) string { return filepath.Join(dir, name+"-key.pem") }

// CreateCA writes a new cluster CA (ca.pem, ca-key.pem) and the masters'
// record-signing key pair (signing.key, signing.pub) into dir. It never
// overwrites: a CA that exists is an error wrapping ErrExists.
func CreateCA(dir string, validity time.Duration) error {
	if validity <= 0 {
		validity = 10 * 365 * 24 * time.Hour
	}
	if err := checkValidity("CA", validity, MaxCADays); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	for _, f := range []string{CAFile, CAKey, SignKey, SignPub} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("pki: %s: %w (a CA is already there; remove the directory to start over)", filepath.Join(dir, f), ErrExists)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pki: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "carve cluster CA", Organization: []string{"carve"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("pki: CA certificate: %w", err)
	}
	if err := writeKey(filepath.Join(dir, CAKey), key); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, CAFile), "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writeSigningKey(dir)
}

// IssueRequest describes a certificate to issue.
type IssueRequest struct {
	Role Role
	// Name is the holder: a master's id, an agent's agent id, an operator's name.
	Name string
	// IPs and DNSNames are the addresses the holder serves on (masters and agents).
	IPs      []netip.Addr
	DNSNames []string
	Validity time.Duration // default one year
}

// Issue signs a certificate with the CA in dir and writes <name>.pem and
// <name>-key.pem there. It never overwrites an issued certificate.
func Issue(dir string, req IssueRequest) error {
	if _, err := ParseRole(string(req.Role)); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := api.ValidateAgentID(req.Name); err != nil {
		return fmt.Errorf("pki: name: %w", err)
	}
	if req.Validity <= 0 {
		req.Validity = 365 * 24 * time.Hour
	}
	certPath, keyPath := CertFile(dir, req.Name), KeyFile(dir, req.Name)
	for _, f := range []string{certPath, keyPath} {
		if _, err := os.Stat(f); err == nil {
			return fmt.Errorf("pki: %s: %w", f, ErrExists)
		}
	}
	if err := checkIssueRequest(req); err != nil {
		return err
	}
	caCert, caKey, err := loadCA(dir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pki: key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject: pkix.Name{CommonName: req.Name, Organization: []string{"carve"},
			OrganizationalUnit: []string{string(req.Role)}},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(req.Validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:        []*url.URL{{Scheme: uriScheme, Host: string(req.Role), Path: "/" + req.Name}},
		DNSNames:    req.DNSNames,
	}
	for _, ip := range req.IPs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(ip.AsSlice()))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("pki: certificate: %w", err)
	}
	if err := writeKey(keyPath, key); err != nil {
		return err
	}
	return writePEM(certPath, "CERTIFICATE", der, 0o644)
}

// IdentityOf reads the role and name a certificate carries.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	for _, u := range cert.URIs {
		if u.Scheme != uriScheme {
			continue
		}
		role, err := ParseRole(u.Host)
		if err != nil {
			return Identity{}, fmt.Errorf("%w: %v", ErrNoIdentity, err)
		}
		name := strings.TrimPrefix(u.Path, "/")
		if err := api.ValidateAgentID(name); err != nil {
			return Identity{}, fmt.Errorf("%w: %v", ErrNoIdentity, err)
		}
		return Identity{Role: role, Name: name}, nil
	}
	return Identity{}, ErrNoIdentity
}

// PeerIdentity is the identity of the verified client certificate of a TLS
// request; false when the client gave none (or the request is not TLS).
func PeerIdentity(r *http.Request) (Identity, bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	id, err := IdentityOf(r.TLS.VerifiedChains[0][0])
	return id, err == nil
}

// Files names a component's CA, certificate and key (the --ca-file,
// --cert-file and --key-file flags).
type Files struct {
	CA, Cert, Key string
}

// Enabled reports whether any file is given.
func (f Files) Enabled() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Check says which flag is missing, naming it.
func (f Files) Check(needCert bool) error {
	var missing []string
	if f.CA == "" {
		missing = append(missing, "--ca-file")
	}
	if needCert && f.Cert == "" {
		missing = append(missing, "--cert-file")
	}
	if needCert && f.Key == "" {
		missing = append(missing, "--key-file")
	}
	if len(missing) > 0 {
		return fmt.Errorf("TLS needs %s (or --insecure for a throwaway lab)", strings.Join(missing, ", "))
	}
	if (f.Cert == "") != (f.Key == "") {
		return errors.New("--cert-file and --key-file go together")
	}
	return nil
}

// Pool reads the CA certificate into a pool.
func (f Files) Pool() (*x509.CertPool, error) {
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", f.CA)
	}
	return pool, nil
}

// keyPair loads the certificate and key, and the identity they carry.
func (f Files) keyPair() (tls.Certificate, Identity, error) {
	kp, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return tls.Certificate{}, Identity{}, fmt.Errorf("--cert-file/--key-file: %w", err)
	}
	leaf, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		return tls.Certificate{}, Identity{}, fmt.Errorf("--cert-file %s: %w", f.Cert, err)
	}
	kp.Leaf = leaf
	id, err := IdentityOf(leaf)
	if err != nil {
		return tls.Certificate{}, Identity{}, fmt.Errorf("--cert-file %s: %w (issue it with carve certs issue)", f.Cert, err)
	}
	return kp, id, nil
}

// Identity is the identity of the certificate in Cert.
func (f Files) Identity() (Identity, error) {
	_, id, err := f.keyPair()
	return id, err
}

// ServerConfig is the TLS configuration of a carve HTTP server: its own
// certificate, and client certificates verified against the CA when given
// (requireClient: always), so that a request without one can be answered
// 401 with a JSON body instead of a failed handshake.
func (f Files) ServerConfig(requireClient bool) (*tls.Config, error) {
	if err := f.Check(true); err != nil {
		return nil, err
	}
	pool, err := f.Pool()
	if err != nil {
		return nil, err
	}
	kp, _, err := f.keyPair()
	if err != nil {
		return nil, err
	}
	auth := tls.VerifyClientCertIfGiven
	if requireClient {
		auth = tls.RequireAndVerifyClientCert
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{kp},
		ClientCAs: pool, ClientAuth: auth}, nil
}

// ClientConfig is the TLS configuration of a carve client: servers are
// verified against the CA, and the certificate (when given) is presented.
func (f Files) ClientConfig() (*tls.Config, error) {
	if err := f.Check(false); err != nil {
		return nil, err
	}
	pool, err := f.Pool()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if f.Cert != "" {
		kp, _, err := f.keyPair()
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return cfg, nil
}

// RequireRole returns a VerifyConnection hook that accepts only peers whose
// verified certificate carries one of the roles (the Raft transport admits
// masters only).
func RequireRole(roles ...Role) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
			return errors.New("pki: the peer gave no verified certificate")
		}
		id, err := IdentityOf(cs.VerifiedChains[0][0])
		if err != nil {
			return fmt.Errorf("pki: peer: %w", err)
		}
		for _, r := range roles {
			if id.Role == r {
				return nil
			}
		}
		return fmt.Errorf("pki: peer %s: role %s is not allowed here", id, id.Role)
	}
}

func loadCA(dir string) (*x509.Certificate, crypto.Signer, error) {
	if _, err := os.Stat(filepath.Join(dir, CAFile)); err != nil {
		return nil, nil, fmt.Errorf("pki: no CA in %s (create one with carve certs ca): %w", dir, err)
	}
	cert, err := ReadCertificate(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, nil, err
	}
	key, err := readPrivateKey(filepath.Join(dir, CAKey))
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on Linux; a clock serial is still unique enough.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("pki: encode key: %w", err)
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func readPrivateKey(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("pki: %s: not a PEM private key", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("pki: %s: not a signing key", path)
	}
	return s, nil
}

// writePEM writes a file atomically with the given mode, refusing to
// replace one.
func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return writeNew(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// writeNew writes a file with the given mode, whole or not at all and
// durably (atomicfile.WriteNew), refusing to replace one.
func writeNew(path string, data []byte, mode os.FileMode) error {
	if err := atomicfile.WriteNew(path, data, mode); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}
