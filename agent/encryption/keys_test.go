package encryption

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/carve-net/carve/wireguard"
)

// openWireGuard starts the agent's WireGuard state on dir, as a (re)start
// of the agent does.
func openWireGuard(t *testing.T, dir string) *WireGuard {
	t.Helper()
	w, err := New(dir, Config{}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func newKeys(t *testing.T, n int) []wgtypes.Key {
	t.Helper()
	keys := make([]wgtypes.Key, n)
	for i := range keys {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	return keys
}

// pendingFiles lists the pending key files in dir.
func pendingFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, KeyFile+".next*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestWireGuardRotationsCloseTogether: two rotations close together, with
// the masters signing either key, install in the key file the key the
// signed record carries, and the other rotation's key stays pending (or
// goes, when it is older than the one installed). Before pending files
// were named by their key, rotation 2's file overwrote rotation 1's: with
// rotation 1's key signed, the key file got rotation 2's key and every
// later install failed its rename (first case), or rotation 1's private
// key was gone when the masters signed it late (second case).
func TestWireGuardRotationsCloseTogether(t *testing.T) {
	for _, tc := range []struct {
		name string
		// staged2: rotation 2's key is pending in memory too (false: its
		// file is written, its RotateWireGuardKey not further yet).
		staged2 bool
		// signed is the key the masters sign, by index (0, 1: the
		// rotations'), then the next.
		signed       []int
		wantRegister []int // after each signing: the key registered (-1: the current one)
	}{
		{name: "rotation 1 signed while rotation 2 writes its file", staged2: false, signed: []int{0, 1}, wantRegister: []int{-1, -1}},
		{name: "rotation 1 signed late, after rotation 2", staged2: true, signed: []int{0, 1}, wantRegister: []int{1, -1}},
		{name: "rotation 2 signed: rotation 1 goes", staged2: true, signed: []int{1}, wantRegister: []int{-1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w := openWireGuard(t, dir)
			next := newKeys(t, 2)
			for i, k := range next {
				if err := wireguard.WritePendingKey(w.keyPath, k); err != nil {
					t.Fatal(err)
				}
				if i == 0 || tc.staged2 {
					w.addPending(k)
				}
			}
			for step, i := range tc.signed {
				if i == 1 && !tc.staged2 {
					w.addPending(next[1]) // rotation 2 goes on
				}
				k, ok := w.ownKey(next[i].PublicKey().String())
				if !ok || k != next[i] {
					t.Fatalf("step %d: with rotation %d's key signed: ok %v, the key %v, want rotation %d's", step, i+1, ok, k == next[i], i+1)
				}
				onDisk, err := wireguard.LoadKey(w.keyPath)
				if err != nil {
					t.Fatal(err)
				}
				if onDisk != next[i] {
					t.Errorf("step %d: %s holds another key than rotation %d's, which the masters signed", step, KeyFile, i+1)
				}
				want := w.key.PublicKey().String()
				if r := tc.wantRegister[step]; r >= 0 {
					want = next[r].PublicKey().String()
				}
				if got := w.RegisterKey(); got != want {
					t.Errorf("step %d: registers %s, want %s", step, got, want)
				}
			}
			if files := pendingFiles(t, dir); len(files) != 0 && tc.wantRegister[len(tc.wantRegister)-1] < 0 {
				t.Errorf("pending files left: %v", files)
			}
			if w.rotations != len(tc.signed) {
				t.Errorf("rotations %d, want %d", w.rotations, len(tc.signed))
			}
		})
	}
}

// TestWireGuardPendingKeysAtStart: the agent restarted with several
// rotations pending registers the newest and can still install any of
// them; a pending file of the current key (its removal lost at a crash)
// is dropped, and one under the old single name (wireguard.key.next) is
// kept under its key's name.
func TestWireGuardPendingKeysAtStart(t *testing.T) {
	dir := t.TempDir()
	w := openWireGuard(t, dir)
	keys := newKeys(t, 3)
	older, newer, legacy := keys[0], keys[1], keys[2]
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, f := range []struct {
		path string
		key  wgtypes.Key
	}{
		{wireguard.PendingKeyPath(w.keyPath, older), older},
		{w.keyPath + ".next", legacy},
		{wireguard.PendingKeyPath(w.keyPath, newer), newer},
		{wireguard.PendingKeyPath(w.keyPath, w.key), w.key},
	} {
		if err := wireguard.WriteKey(f.path, f.key); err != nil {
			t.Fatal(err)
		}
		when := base.Add(time.Duration(i) * time.Hour)
		if err := os.Chtimes(f.path, when, when); err != nil {
			t.Fatal(err)
		}
	}
	w = openWireGuard(t, dir) // restarted
	if got := w.RegisterKey(); got != newer.PublicKey().String() {
		t.Errorf("registers %s, want the newest pending key %s", got, newer.PublicKey())
	}
	want := []string{
		wireguard.PendingKeyPath(w.keyPath, older),
		wireguard.PendingKeyPath(w.keyPath, newer),
		wireguard.PendingKeyPath(w.keyPath, legacy),
	}
	slices.Sort(want)
	if got := pendingFiles(t, dir); !slices.Equal(got, want) {
		t.Errorf("pending files %v, want %v", got, want)
	}
	if k, ok := w.ownKey(legacy.PublicKey().String()); !ok || k != legacy {
		t.Fatalf("the legacy pending key, signed: ok %v", ok)
	}
	if got := w.RegisterKey(); got != newer.PublicKey().String() {
		t.Errorf("after the legacy key's install: registers %s, want %s", got, newer.PublicKey())
	}
}
