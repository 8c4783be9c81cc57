package state

import (
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
)

// RevokeCommand checks the serial and the identity, naming the field.
func TestRevokeCommandValidates(t *testing.T) {
	tests := []struct {
		name    string
		req     api.RevokeRequest
		serial  string // canonical, when valid
		mention string // error substring, when not
	}{
		{"hex with colons", api.RevokeRequest{Serial: "0A:1B:ff", Identity: "agent/h1"}, "a1bff", ""},
		{"0x prefix", api.RevokeRequest{Serial: "0x00ff"}, "ff", ""},
		{"not hex", api.RevokeRequest{Serial: "h1"}, "", `serial "h1"`},
		{"too long", api.RevokeRequest{Serial: strings.Repeat("f", 41)}, "", "at most 40 digits"},
		{"bad role", api.RevokeRequest{Serial: "1", Identity: "root/h1"}, "", `identity "root/h1"`},
		{"bad name", api.RevokeRequest{Serial: "1", Identity: "agent/a b"}, "", `identity "agent/a b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := logcmd.RevokeCommand(tt.req)
			if tt.mention != "" {
				if err == nil || !strings.Contains(err.Error(), tt.mention) {
					t.Fatalf("logcmd.RevokeCommand(%+v) = %v, want an error with %q", tt.req, err, tt.mention)
				}
				return
			}
			if err != nil || c.Revoke.Serial != tt.serial {
				t.Fatalf("logcmd.RevokeCommand(%+v) = %+v, %v; want serial %s", tt.req, c.Revoke, err, tt.serial)
			}
		})
	}
}

// A revocation puts the serial on the deny list (once), deletes the agent
// it names, shows in the state, its changes and a snapshot, and leaves the
// list when its certificate has expired, at a compaction.
func TestRevocation(t *testing.T) {
	h := newHarness(t, growCfg())
	h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	since := h.index
	revoke := func(serial, identity string, notAfter int64) Result {
		t.Helper()
		c, err := logcmd.RevokeCommand(api.RevokeRequest{Serial: serial, Identity: identity, NotAfter: notAfter})
		if err != nil {
			t.Fatal(err)
		}
		return h.apply(c)
	}
	res := revoke("0A", "agent/a1", 0)
	if res.Err != nil || len(res.Deleted) != 1 || res.Deleted[0] != "a1" {
		t.Fatalf("revoke a1's certificate: %+v", res)
	}
	if !h.table.IsRevoked("a") || h.table.IsRevoked("b") {
		t.Errorf("IsRevoked: a %v, b %v; want true, false", h.table.IsRevoked("a"), h.table.IsRevoked("b"))
	}
	if _, gone := h.table.Tombstone("a1"); !gone {
		t.Error("the revoked agent's record was not deleted")
	}
	at := h.table.Index()
	if res := revoke("a", "agent/a1", 0); res.Err != nil || h.table.Index() != at || len(h.table.Revoked()) != 1 {
		t.Errorf("a repeated revocation: %+v, state index %d (was %d), %d revoked", res, h.table.Index(), at, len(h.table.Revoked()))
	}
	expired := time.Now().Add(-time.Hour).Unix()
	if res := revoke("b", "master/m9", expired); res.Err != nil || len(res.Deleted) != 0 {
		t.Fatalf("revoke a master's certificate: %+v", res)
	}
	st := h.table.State()
	if len(st.Revoked) != 2 || st.Revoked[0] != (api.Revocation{Serial: "a", Identity: "agent/a1", Index: at}) {
		t.Errorf("state's revoked list: %+v", st.Revoked)
	}
	body, _, err := h.table.StateJSON("")
	if err != nil || !strings.Contains(string(body), `"revoked":[{"serial":"a","identity":"agent/a1","index":`) {
		t.Errorf("state JSON without the revoked list: %v\n%s", err, body)
	}
	changes, _, err := h.table.ChangesJSON(since)
	if err != nil || !strings.Contains(string(changes), `"revoked":[`) {
		t.Errorf("changes without the revoked list: %v\n%s", err, changes)
	}
	restored := restoreCopy(t, h)
	if !restored.IsRevoked("a") || !restored.IsRevoked("b") || len(restored.Revoked()) != 2 {
		t.Errorf("after a snapshot: revoked %+v", restored.Revoked())
	}
	// A compaction drops the expired certificate's entry, not the other.
	if res := h.apply(logcmd.CompactCommand(time.Now(), time.Hour)); res.Err != nil {
		t.Fatal(res.Err)
	}
	if !h.table.IsRevoked("a") || h.table.IsRevoked("b") {
		t.Errorf("after a compaction: revoked %+v, want only a", h.table.Revoked())
	}
}

// TestRevocationsSignal: a revocation, and a restore of a snapshot that
// holds revocations, signal Revocations without blocking the apply (no one
// reads here) and without a goroutine of the table's own; signals
// coalesce, and a repeated revocation or a restore without any signals
// nothing.
func TestRevocationsSignal(t *testing.T) {
	h := newHarness(t, growCfg())
	signalled := func(tb *LeaseTable) bool {
		select {
		case <-tb.Revocations():
			return true
		default:
			return false
		}
	}
	if restored := restoreCopy(t, h); signalled(restored) || signalled(h.table) {
		t.Fatal("a signal with nothing revoked")
	}
	revoke := func(serial string) {
		t.Helper()
		c, err := logcmd.RevokeCommand(api.RevokeRequest{Serial: serial, Identity: "master/m9"})
		if err != nil {
			t.Fatal(err)
		}
		if res := h.apply(c); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	revoke("0a")
	revoke("0b") // the apply does not wait for a reader
	if !signalled(h.table) {
		t.Fatal("no signal after two revocations")
	}
	if signalled(h.table) {
		t.Fatal("two signals for two revocations not read between: they coalesce")
	}
	revoke("0a")
	if signalled(h.table) {
		t.Fatal("a signal for a repeated revocation")
	}
	if restored := restoreCopy(t, h); !signalled(restored) {
		t.Fatal("no signal after restoring a snapshot with revocations")
	}
}
