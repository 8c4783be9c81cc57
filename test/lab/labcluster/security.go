package labcluster

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/carve-net/carve/pki"
)

// OperatorName is the name of the operator certificate the harness's own
// clients present (the masters' API, the agents' API).
const OperatorName = "lab-operator"

// MeshPasswordFile is the name of the mesh password file in the cluster's
// PKI directory.
const MeshPasswordFile = "mesh-password"

// labSecurity is a cluster's trust: a CA created for the run, a
// certificate per master, per agent and for the harness, and the mesh
// password of the agents.
type labSecurity struct {
	dir          string // the CA and every certificate
	meshPassword string // path of the mesh password file
	// operator is the harness's own TLS files as last loaded (see
	// rotation.go: the harness follows a CA rotation too).
	operator *pki.Reloader
}

// newLabSecurity creates the CA and the operator certificate in dir, and
// the mesh password file.
func newLabSecurity(dir string) (*labSecurity, error) {
	if err := pki.CreateCA(dir, 30*24*time.Hour); err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	s := &labSecurity{dir: dir, meshPassword: filepath.Join(dir, MeshPasswordFile)}
	if err := s.issue(pki.RoleOperator, OperatorName); err != nil {
		return nil, err
	}
	var secret [24]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, fmt.Errorf("labcluster: mesh password: %w", err)
	}
	if err := os.WriteFile(s.meshPassword, []byte(hex.EncodeToString(secret[:])+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("labcluster: mesh password: %w", err)
	}
	return s, nil
}

// files names the CA and name's certificate and key.
func (s *labSecurity) files(name string) pki.Files {
	return pki.Files{CA: filepath.Join(s.dir, pki.CAFile), Cert: pki.CertFile(s.dir, name), Key: pki.KeyFile(s.dir, name)}
}

// issue issues a certificate, replacing one of the same name (an agent
// that moved to another address gets a new one).
func (s *labSecurity) issue(role pki.Role, name string, ips ...netip.Addr) error {
	f := s.files(name)
	for _, p := range []string{f.Cert, f.Key} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("labcluster: %w", err)
		}
	}
	if err := pki.Issue(s.dir, pki.IssueRequest{Role: role, Name: name, IPs: ips}); err != nil {
		return fmt.Errorf("labcluster: certificate of %s %s: %w", role, name, err)
	}
	return nil
}

// masterArgs are a master's security flags: TLS with its certificate and
// the record-signing key.
func (s *labSecurity) masterArgs(id string) []string {
	return append(tlsArgs(s.files(id)), "--signing-key-file", filepath.Join(s.dir, pki.SignKey),
		"--signing-chain-file", filepath.Join(s.dir, pki.SignChain))
}

// agentArgs are an agent's security flags: its certificate, the mesh
// password, and the masters' record-signing key to verify records with.
func (s *labSecurity) agentArgs(id string) []string {
	return append(tlsArgs(s.files(id)), "--mesh-password-file", s.meshPassword, "--mesh-accepted-password-file", s.meshPassword+AcceptedSuffix,
		"--signing-pub-file", s.signingPub())
}

// signingPub is the public half of the masters' record-signing key.
func (s *labSecurity) signingPub() string { return filepath.Join(s.dir, pki.SignPub) }

func tlsArgs(f pki.Files) []string {
	return []string{"--ca-file", f.CA, "--cert-file", f.Cert, "--key-file", f.Key}
}

// clientConfig is the TLS configuration of the harness's clients: the
// operator certificate, servers verified against the CA.
func (s *labSecurity) clientConfig() (*tls.Config, error) {
	r, err := pki.NewReloader(s.files(OperatorName))
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	s.operator = r
	return r.ClientConfig(), nil
}

// OperatorFiles are the CA, certificate and key of the harness's operator
// certificate: what `carve state` or curl need to talk to the cluster.
func (c *Cluster) OperatorFiles() pki.Files { return c.sec.files(OperatorName) }

// OperatorArgs are the flags of a carve command that talks to the masters
// (`carve state`): the operator certificate's.
func (c *Cluster) OperatorArgs() []string { return tlsArgs(c.OperatorFiles()) }

// MeshPasswordPath is the agents' --mesh-password-file.
func (c *Cluster) MeshPasswordPath() string { return c.sec.meshPassword }
