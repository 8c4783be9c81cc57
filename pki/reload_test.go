package pki

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// installed copies an issued certificate and key (and a CA bundle of the
// given CA directories) to the paths a running component reads.
type installed struct {
	t     *testing.T
	files Files
}

func newInstalled(t *testing.T, name string) *installed {
	t.Helper()
	dir := t.TempDir()
	return &installed{t: t, files: Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}}
}

// put writes the bundle of the CAs of caDirs, and the certificate name
// issued in certDir.
func (in *installed) put(certDir, name string, caDirs ...string) {
	in.t.Helper()
	var bundle []byte
	for _, d := range caDirs {
		b, err := os.ReadFile(filepath.Join(d, CAFile))
		if err != nil {
			in.t.Fatal(err)
		}
		bundle = append(bundle, b...)
	}
	for dst, b := range map[string][]byte{in.files.CA: bundle, in.files.Cert: mustRead(in.t, CertFile(certDir, name)), in.files.Key: mustRead(in.t, KeyFile(certDir, name))} {
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			in.t.Fatal(err)
		}
	}
}

// serveOK listens on loopback with cfg and writes "ok" on every connection
// whose handshake succeeds, until the test ends.
func serveOK(t *testing.T, cfg *tls.Config) net.Listener {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	serveHandshakes(t, ln)
	return ln
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReloaderRotatesTheCA walks a CA rotation between a server and a
// client that both reload their files: every step keeps the handshake
// working, and a reload that would lock a side out is refused.
func TestReloaderRotatesTheCA(t *testing.T) {
	oldCA, newCA := t.TempDir(), t.TempDir()
	for _, d := range []string{oldCA, newCA} {
		if err := CreateCA(d, 0); err != nil {
			t.Fatal(err)
		}
		for _, r := range []IssueRequest{
			{Role: RoleMaster, Name: "m1", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
			{Role: RoleAgent, Name: "h1", IPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}},
			{Role: RoleAgent, Name: "h2", IPs: []netip.Addr{netip.MustParseAddr("198.18.0.2")}},
		} {
			if err := Issue(d, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	srvFiles, cliFiles := newInstalled(t, "m1"), newInstalled(t, "h1")
	srvFiles.put(oldCA, "m1", oldCA)
	cliFiles.put(oldCA, "h1", oldCA)
	srv, err := NewReloader(srvFiles.files)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := NewReloader(cliFiles.files)
	if err != nil {
		t.Fatal(err)
	}
	serverCfg := srv.ServerConfig(true)
	serverCfg.VerifyConnection = RequireRole(RoleAgent)
	ln := serveOK(t, serverCfg)
	dial := cli.DialTLS(&tls.Config{MinVersion: tls.VersionTLS12, VerifyConnection: RequireRole(RoleMaster)}, 5*time.Second, nil)
	handshake := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := dial(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 2)
		if _, err := c.Read(buf); err != nil {
			return err // the server refused the client's certificate
		}
		return nil
	}
	reload := func(r *Reloader, in *installed, certDir, name string, caDirs ...string) error {
		in.put(certDir, name, caDirs...)
		return r.Reload()
	}
	steps := []struct {
		name    string
		do      func() error
		wantErr error // of the reload; nil: it succeeds
	}{
		{"1. both trust the two CAs", func() error {
			return errors.Join(reload(srv, srvFiles, oldCA, "m1", oldCA, newCA), reload(cli, cliFiles, oldCA, "h1", oldCA, newCA))
		}, nil},
		{"2. the server's certificate re-issued by the new CA", func() error { return reload(srv, srvFiles, newCA, "m1", oldCA, newCA) }, nil},
		{"3. the client's certificate re-issued by the new CA", func() error { return reload(cli, cliFiles, newCA, "h1", oldCA, newCA) }, nil},
		{"4. the old CA dropped", func() error {
			return errors.Join(reload(srv, srvFiles, newCA, "m1", newCA), reload(cli, cliFiles, newCA, "h1", newCA))
		}, nil},
	}
	if err := handshake(); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: reload: %v", s.name, err)
		}
		if err := handshake(); err != nil {
			t.Fatalf("%s: handshake: %v", s.name, err)
		}
	}
	// A client still holding a certificate of the old CA is refused now.
	stale := newInstalled(t, "h2")
	stale.put(oldCA, "h2", oldCA, newCA)
	staleR, err := NewReloader(stale.files)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := staleR.DialTLS(&tls.Config{MinVersion: tls.VersionTLS12}, 5*time.Second, nil)(ctx, "tcp", ln.Addr().String()); err == nil {
		buf := make([]byte, 2)
		if _, err := c.Read(buf); err == nil {
			t.Error("a certificate of the removed CA was accepted")
		}
		c.Close()
	}
	// Reloads that would lock a side out, or change who it is: refused,
	// and what was loaded keeps working.
	refused := []struct {
		name string
		do   func() error
		want error
	}{
		{"a bundle without the certificate's CA", func() error { return reload(srv, srvFiles, newCA, "m1", oldCA) }, nil},
		{"a certificate of another identity", func() error { return reload(cli, cliFiles, newCA, "h2", newCA) }, ErrIdentityChanged},
	}
	for _, r := range refused {
		err := r.do()
		if err == nil || (r.want != nil && !errors.Is(err, r.want)) {
			t.Errorf("%s: reload: %v, want a refusal (%v)", r.name, err, r.want)
		}
		if err := handshake(); err != nil {
			t.Errorf("%s: the refused reload broke the handshake: %v", r.name, err)
		}
	}
}
