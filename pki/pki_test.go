package pki

import (
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"testing"
)

// newCA creates a CA with a master, an agent and an operator certificate.
func newCA(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := CreateCA(dir, 0); err != nil {
		t.Fatal(err)
	}
	for _, r := range []IssueRequest{
		{Role: RoleMaster, Name: "m1", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		{Role: RoleAgent, Name: "agent-1", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		{Role: RoleOperator, Name: "alice"},
	} {
		if err := Issue(dir, r); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func files(dir, name string) Files {
	return Files{CA: filepath.Join(dir, CAFile), Cert: CertFile(dir, name), Key: KeyFile(dir, name)}
}

func TestIdentityOverTLS(t *testing.T) {
	dir := newCA(t)
	other := newCA(t)
	srvCfg, err := files(dir, "m1").ServerConfig(false)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := PeerIdentity(r)
		if !ok {
			http.Error(w, "anonymous", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, id.String())
	}))
	srv.TLS = srvCfg
	srv.StartTLS()
	t.Cleanup(srv.Close)

	get := func(f Files) (string, error) {
		cfg, err := f.ClientConfig()
		if err != nil {
			return "", err
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		defer c.CloseIdleConnections()
		resp, err := c.Get(srv.URL)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), nil
	}
	for _, tc := range []struct {
		name    string
		files   Files
		want    string
		wantErr bool
	}{
		{"agent", files(dir, "agent-1"), "agent/agent-1", false},
		{"operator", files(dir, "alice"), "operator/alice", false},
		{"master", files(dir, "m1"), "master/m1", false},
		{"no certificate", Files{CA: filepath.Join(dir, CAFile)}, "anonymous\n", false},
		// A client of another CA cannot verify the server, nor the server it.
		{"other CA", files(other, "alice"), "", true},
		{"other CA's cert, right CA", Files{CA: filepath.Join(dir, CAFile), Cert: CertFile(other, "alice"), Key: KeyFile(other, "alice")}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := get(tc.files)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %q, %v; want %q (error: %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestRequireRole(t *testing.T) {
	dir := newCA(t)
	srvCfg, err := files(dir, "m1").ServerConfig(true)
	if err != nil {
		t.Fatal(err)
	}
	srvCfg.VerifyConnection = RequireRole(RoleMaster)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	serveHandshakes(t, ln)
	for _, tc := range []struct {
		name string
		ok   bool
	}{{"m1", true}, {"agent-1", false}, {"alice", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := files(dir, tc.name).ClientConfig()
			if err != nil {
				t.Fatal(err)
			}
			c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
			if err == nil {
				// TLS 1.3 reports the server's refusal on the first read.
				var got []byte
				got, err = io.ReadAll(c)
				if err == nil && string(got) != "ok" {
					err = fmt.Errorf("read %q", got)
				}
				c.Close()
			}
			if (err == nil) != tc.ok {
				t.Fatalf("handshake as %s: err %v, want ok=%v", tc.name, err, tc.ok)
			}
		})
	}
}

func TestCreateAndIssueRefuseBadInput(t *testing.T) {
	dir := newCA(t)
	if err := CreateCA(dir, 0); !errors.Is(err, ErrExists) {
		t.Fatalf("second CreateCA: %v, want ErrExists", err)
	}
	if err := Issue(dir, IssueRequest{Role: RoleAgent, Name: "agent-1"}); !errors.Is(err, ErrExists) {
		t.Fatalf("reissue: %v, want ErrExists", err)
	}
	if err := Issue(dir, IssueRequest{Role: "root", Name: "x"}); err == nil {
		t.Fatal("role root accepted")
	}
	if err := Issue(dir, IssueRequest{Role: RoleAgent, Name: "../x"}); err == nil {
		t.Fatal("name ../x accepted")
	}
	if err := Issue(t.TempDir(), IssueRequest{Role: RoleAgent, Name: "a"}); err == nil {
		t.Fatal("issued without a CA")
	}
	if _, err := (Files{}).ClientConfig(); err == nil {
		t.Fatal("client config without --ca-file")
	}
}

func TestSigningKey(t *testing.T) {
	dir := newCA(t)
	priv, err := LoadSigningKey(filepath.Join(dir, SignKey))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := LoadVerifyKey(filepath.Join(dir, SignPub))
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("record")
	if !ed25519.Verify(pub, msg, ed25519.Sign(priv, msg)) {
		t.Fatal("signature from signing.key does not verify with signing.pub")
	}
	enc, err := EncodeVerifyKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseVerifyKey(enc)
	if err != nil || !back.Equal(pub) {
		t.Fatalf("public key round trip: %v", err)
	}
}
