package state

import (
	"crypto/ed25519"
	"fmt"
	"testing"
)

// A state read signs only what changed since the last one.
func TestSigningOncePerRecord(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	h.table.SetSigningKey(key)
	h.apply(command{Op: opSetClusterID, ClusterID: "c1"})
	for i := range 100 {
		h.mustRegister(fmt.Sprintf("a%03d", i), fmt.Sprintf("198.18.0.%d", i+1))
	}
	signed := func() uint64 { return h.table.signer.Signatures() }
	read := func() {
		t.Helper()
		if _, _, err := h.table.StateJSON(""); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name  string
		do    func()
		signs uint64
	}{
		{"first read", func() {}, 100},
		{"second read", func() {}, 0},
		{"one registration", func() { h.mustRegister("new", "198.18.1.1") }, 1},
		{"one deletion", func() { h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a000"}}}) }, 1}, // the tombstone
		{"a configuration change outside the signed fields", func() {
			cfg := DefaultConfig()
			cfg.OverlayMTU = 1400
			h.apply(command{Op: opSetConfig, SetConfig: &cfg})
		}, 0},
	}
	for _, s := range steps {
		before := signed()
		s.do()
		read()
		if got := signed() - before; got != s.signs {
			t.Errorf("%s: %d signatures, want %d", s.name, got, s.signs)
		}
	}
	// A GET of a record already in a state read signs nothing.
	before := signed()
	info, _ := h.table.Agent("a001")
	h.table.SignAgent(info)
	if signed() != before || info.Signature == "" {
		t.Errorf("GET agent re-signed (%d) or left unsigned", signed()-before)
	}
}
