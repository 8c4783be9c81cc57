package labcluster

// Rotation of the cluster's CA, certificates, signing key and mesh
// password in place, as an operator does it (docs/security.md,
// "Rotation"): files replaced, then every process sent SIGHUP, one by one.
// Every process of the lab reads the same PKI directory, so a file written
// here is every process's next reload.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/pki"
)

// AcceptedSuffix ends the name of the agents' --mesh-accepted-password-file,
// beside MeshPasswordPath: absent outside a change of the password.
const AcceptedSuffix = ".accepted"

// reloadedLine and reloadFailed are what carve logs after a SIGHUP.
const (
	reloadedLine = "SIGHUP: reloaded"
	reloadFailed = "SIGHUP: reloading"
)

// Reload sends SIGHUP to p and waits until its log says it reloaded; an
// error when it says the reload failed (the process keeps what it had).
func (c *Cluster) Reload(ctx context.Context, p *Process) error {
	before := countInLog(p.LogPath, reloadedLine)
	failedBefore := countInLog(p.LogPath, reloadFailed)
	if err := p.Signal(syscall.SIGHUP); err != nil {
		return fmt.Errorf("labcluster: SIGHUP %s: %w", p.Name, err)
	}
	err := retry.Until(ctx, 50*time.Millisecond, func() error {
		if countInLog(p.LogPath, reloadFailed) > failedBefore {
			return retry.Permanent(fmt.Errorf("%s: the reload failed: %s", p.Name, p.Tail(5)))
		}
		if countInLog(p.LogPath, reloadedLine) <= before {
			return fmt.Errorf("%s has not logged its reload yet", p.Name)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	c.log.Info("reloaded", "process", p.Name)
	return nil
}

// ReloadAll reloads every running master, then every running agent, one
// by one; then the harness's own TLS files.
func (c *Cluster) ReloadAll(ctx context.Context) error {
	if err := c.ReloadMasters(ctx); err != nil {
		return err
	}
	if err := c.ReloadAgents(ctx); err != nil {
		return err
	}
	return c.ReloadHarness()
}

// ReloadHarness has the harness's own clients read the operator
// certificate and the CA bundle again.
func (c *Cluster) ReloadHarness() error {
	if err := c.sec.operator.Reload(); err != nil {
		return fmt.Errorf("labcluster: the harness's TLS files: %w", err)
	}
	return nil
}

func countInLog(path, s string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
}

// nextCADir holds the new CA during a CA rotation.
func (s *labSecurity) nextCADir() string { return s.dir + "-next" }

// NextCAFile is the new CA's certificate during a CA rotation (the CA file
// of its last step), made by BeginCARotation.
func (c *Cluster) NextCAFile() string { return filepath.Join(c.sec.nextCADir(), pki.CAFile) }

// BeginCARotation creates a new CA and makes the CA file a bundle of the
// old and the new one (reload to have the processes trust both).
func (c *Cluster) BeginCARotation() error {
	next := c.sec.nextCADir()
	if err := pki.CreateCA(next, 30*24*time.Hour); err != nil {
		return fmt.Errorf("labcluster: the new CA: %w", err)
	}
	return c.sec.writeCABundle(filepath.Join(c.sec.dir, pki.CAFile), filepath.Join(next, pki.CAFile))
}

// writeCABundle writes the CA file as the concatenation of the files.
func (s *labSecurity) writeCABundle(files ...string) error {
	var bundle []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("labcluster: %w", err)
		}
		bundle = append(bundle, b...)
	}
	return writeFileAtomic(filepath.Join(s.dir, pki.CAFile), bundle, 0o644)
}

// ReissueCertificates issues every certificate of the lab again, with the
// new CA of BeginCARotation, for the same role, name and addresses, in
// place (reload to have the processes present them).
func (c *Cluster) ReissueCertificates() error {
	next := c.sec.nextCADir()
	certs, err := filepath.Glob(filepath.Join(c.sec.dir, "*.pem"))
	if err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	for _, path := range certs {
		base := filepath.Base(path)
		if base == pki.CAFile || strings.HasSuffix(base, "-key.pem") || base == pki.CAKey {
			continue
		}
		cert, err := readCert(path)
		if err != nil {
			return err
		}
		id, err := pki.IdentityOf(cert)
		if err != nil {
			continue // not a carve certificate
		}
		req := pki.IssueRequest{Role: id.Role, Name: id.Name, DNSNames: cert.DNSNames}
		for _, ip := range cert.IPAddresses {
			if a, ok := netip.AddrFromSlice(ip); ok {
				req.IPs = append(req.IPs, a.Unmap())
			}
		}
		for _, f := range []string{pki.CertFile(next, id.Name), pki.KeyFile(next, id.Name)} {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("labcluster: %w", err)
			}
		}
		if err := pki.Issue(next, req); err != nil {
			return fmt.Errorf("labcluster: re-issue %s: %w", id, err)
		}
		// The key first: a process reloads only on SIGHUP, after both.
		for _, mv := range [][2]string{{pki.KeyFile(next, id.Name), pki.KeyFile(c.sec.dir, id.Name)}, {pki.CertFile(next, id.Name), pki.CertFile(c.sec.dir, id.Name)}} {
			b, err := os.ReadFile(mv[0])
			if err != nil {
				return fmt.Errorf("labcluster: %w", err)
			}
			if err := writeFileAtomic(mv[1], b, 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}

// FinishCARotation drops the old CA: the CA file holds the new one alone,
// and the new CA key issues the lab's certificates from now on.
func (c *Cluster) FinishCARotation() error {
	next := c.sec.nextCADir()
	if err := c.sec.writeCABundle(filepath.Join(next, pki.CAFile)); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(next, pki.CAKey))
	if err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	return writeFileAtomic(filepath.Join(c.sec.dir, pki.CAKey), b, 0o600)
}

// BeginSigningRotation writes a new record-signing key and the chain that
// endorses it (carve certs rotate-signing); reload the masters to have them
// serve the chain. It returns the new key in its wire form.
func (c *Cluster) BeginSigningRotation() (string, error) {
	link, err := pki.BeginSigningRotation(c.sec.dir)
	if err != nil {
		return "", fmt.Errorf("labcluster: %w", err)
	}
	return link.Key, nil
}

// SwitchSigningKey makes the new key the masters' (rotate-signing
// --switch); reload the masters to have them sign with it.
func (c *Cluster) SwitchSigningKey() error {
	if err := pki.SwitchSigningKey(c.sec.dir); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	return nil
}

// FinishSigningRotation removes the chain and the old key pair
// (rotate-signing --finish); reload the masters to have them stop serving
// the chain.
func (c *Cluster) FinishSigningRotation() error {
	if err := pki.FinishSigningRotation(c.sec.dir); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	return nil
}

// ReloadMasters reloads every running master, one by one.
func (c *Cluster) ReloadMasters(ctx context.Context) error {
	for _, m := range c.Masters() {
		if !m.Running() {
			continue
		}
		if err := c.Reload(ctx, m.Process); err != nil {
			return err
		}
	}
	return nil
}

// ReloadAgents reloads every running agent, one by one.
func (c *Cluster) ReloadAgents(ctx context.Context) error {
	for _, h := range c.Hosts() {
		if !h.Agent.Running() {
			continue
		}
		if err := c.Reload(ctx, h.Agent); err != nil {
			return err
		}
	}
	return nil
}

// SetMeshPasswords writes the agents' mesh password file and their
// accepted password file (empty: removed); reload the agents to use them.
func (c *Cluster) SetMeshPasswords(password, accepted string) error {
	if err := writeFileAtomic(c.sec.meshPassword, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	path := c.sec.meshPassword + AcceptedSuffix
	if accepted == "" {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("labcluster: %w", err)
		}
		return nil
	}
	return writeFileAtomic(path, []byte(accepted+"\n"), 0o600)
}

// MeshPassword is the agents' current mesh password.
func (c *Cluster) MeshPassword() (string, error) {
	b, err := os.ReadFile(c.sec.meshPassword)
	if err != nil {
		return "", fmt.Errorf("labcluster: %w", err)
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

// SigningKey is the masters' public record-signing key in its wire form
// (api.EncodeSigningKey) as signing.pub holds it now.
func (c *Cluster) SigningKey() (string, error) {
	k, err := pki.LoadVerifyKey(c.sec.signingPub())
	if err != nil {
		return "", fmt.Errorf("labcluster: %w", err)
	}
	return api.EncodeSigningKey(k), nil
}

func readCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("labcluster: %s: no PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("labcluster: %s: %w", path, err)
	}
	return cert, nil
}

// writeFileAtomic replaces path with data (a rename: a reader sees the old
// or the new file whole).
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	return nil
}

// HTTPClientWith is an HTTP client like HTTPClient's, whose connections
// start in the lab's underlay, with another TLS configuration (a test's
// stale or foreign certificate).
func (c *Cluster) HTTPClientWith(tlsCfg *tls.Config) *http.Client {
	return newHTTPClient(c.Lab.Underlay, tlsCfg)
}
