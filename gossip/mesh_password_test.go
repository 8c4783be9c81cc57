//go:build !race

// Real mesh routers over TCP on 127.0.0.1 (see mesh_tcp_test.go for why
// not under -race), with passwords.

package gossip_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestMeshPassword: two peers with the same password converge; a peer with
// another password and a peer with none connect to them (and they to it)
// and never exchange gossip with them: each handshake is refused, which
// both sides log as a warning. The refusals are waited for, so the check
// that nothing crossed comes after connections were tried, not after a
// sleep.
func TestMeshPassword(t *testing.T) {
	logs := &testutil.Logs{}
	log := logs.Logger()
	a := startPeer(t, "same-a", []byte("s3cret"), log)
	b := startPeer(t, "same-b", []byte("s3cret"), log)
	other := startPeer(t, "other", []byte("not the secret"), log)
	none := startPeer(t, "none", nil, log)

	a.h.Add("a")
	b.h.Add("b")
	other.h.Add("other")
	none.h.Add("none")
	for _, p := range []meshPeer{b, other, none} {
		if err := p.r.Connect(a.addr); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.r.Connect(other.addr, none.addr); err != nil {
		t.Fatal(err)
	}

	want := []string{"a", "b"}
	for _, p := range []meshPeer{a, b} {
		testutil.Eventually(t, 0, p.r.Self()+" has "+fmt.Sprint(want), testutil.True(func() bool { return slices.Equal(p.h.Set(), want) }))
	}
	// Both ways of refusing were seen: a wrong secret does not decrypt; a
	// peer without one is asked for encryption it does not speak.
	testutil.Eventually(t, 0, "the handshakes with other and none refused", func() error {
		for _, sub := range []string{"Unable to decrypt", "password specified, but peer requested an unencrypted connection",
			"no password specificed, but peer requested an encrypted connection"} {
			if !logs.Has(slog.LevelWarn, sub) {
				return fmt.Errorf("no warning containing %q", sub)
			}
		}
		return nil
	})
	// Every peer that took part in a refused handshake counted it; b,
	// which only ever met a, did not.
	for _, p := range []meshPeer{a, other, none} {
		testutil.Eventually(t, 0, p.r.Self()+" counts a refused handshake", testutil.True(func() bool { return p.refused.Load() > 0 }))
	}
	if n := b.refused.Load(); n != 0 {
		t.Errorf("same-b counted %d refused handshakes", n)
	}
	// Still nothing crossed, gossip of a and b kept flowing meanwhile.
	b.ch.Broadcast(b.h.Add("b2"))
	want = []string{"a", "b", "b2"}
	testutil.Eventually(t, 0, "a has b2", testutil.True(func() bool { return slices.Equal(a.h.Set(), want) }))
	for _, p := range []meshPeer{other, none} {
		if got := p.h.Set(); !slices.Equal(got, []string{p.r.Self()}) {
			t.Errorf("%s, with another password, has %v: gossip crossed", p.r.Self(), got)
		}
		if got := p.r.Peers(); len(got) != 0 {
			t.Errorf("%s, with another password, knows peers %v", p.r.Self(), got)
		}
	}
	for _, p := range []meshPeer{a, b} {
		if got := p.h.Set(); !slices.Equal(got, want) {
			t.Errorf("%s has %v, want %v", p.r.Self(), got, want)
		}
	}
	if got := a.r.Peers(); !slices.Equal(got, []string{"same-b"}) {
		t.Errorf("same-a knows %v, want [same-b]", got)
	}
}

func TestReadPasswordFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content string
		want          []byte
		wantErr       string
	}{
		{"plain", "s3cret", []byte("s3cret"), ""},
		{"trailing newline", "s3cret\n", []byte("s3cret"), ""},
		{"crlf", "s3cret\r\n", []byte("s3cret"), ""},
		{"only the last newline", "s3cret\n\n", []byte("s3cret\n"), ""},
		{"inner spaces kept", " s3 cret ", []byte(" s3 cret "), ""},
		{"empty", "", nil, "is empty"},
		{"newline only", "\n", nil, "is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := gossip.ReadPasswordFile(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("got %q, %v; want an error naming %s and %q", got, err, path, tt.wantErr)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	if _, err := gossip.ReadPasswordFile(filepath.Join(dir, "absent")); err == nil {
		t.Error("absent file accepted")
	}
}
