package state

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
)

// revokedAgent is the agent id a revocation names, or "".
func revokedAgent(identity string) string {
	if id, ok := strings.CutPrefix(identity, "agent/"); ok {
		return id
	}
	return ""
}

// applyRevoke adds the certificate to the deny list (once: a repeat
// changes nothing) and deletes the agent it names, so that the agent's
// routes go and, its certificate refused, it cannot register again.
func (t *LeaseTable) applyRevoke(index uint64, c *logcmd.Revoke) ([]string, error) {
	if _, ok := t.revoked[c.Serial]; ok {
		return nil, nil
	}
	t.revoked[c.Serial] = api.Revocation{Serial: c.Serial, Identity: c.Identity, NotAfter: c.NotAfter, Index: index}
	t.revokedChanged()
	t.signalRevoked()
	t.stateIndex = index
	if id := revokedAgent(c.Identity); id != "" {
		return t.applyDelete(index, &logcmd.Delete{Agents: []string{id}})
	}
	return nil, nil
}

// pruneRevoked drops the revocations of certificates expired by now (Unix
// seconds, the leader's clock in a compaction command); the caller holds
// t.mu. An expired certificate fails verification anyway.
func (t *LeaseTable) pruneRevoked(index uint64, now int64) {
	changed := false
	for serial, r := range t.revoked {
		if r.NotAfter > 0 && r.NotAfter < now {
			delete(t.revoked, serial)
			changed = true
		}
	}
	if changed {
		t.revokedChanged()
		t.stateIndex = index
	}
}

// revokedChanged renews what readers of the deny list see: the set of
// serials (read without t.mu on every handshake and request) and the
// state's "revoked" JSON; the caller holds t.mu for writing.
func (t *LeaseTable) revokedChanged() {
	set := make(map[string]struct{}, len(t.revoked))
	for s := range t.revoked {
		set[s] = struct{}{}
	}
	t.revokedSet.Store(&set)
	t.revokedJSON = nil
	if list := t.revokedList(); len(list) > 0 {
		data, _ := json.Marshal(list) // plain strings and numbers
		t.revokedJSON = append([]byte(`,"revoked":`), data...)
	}
}

// revokedList is the deny list sorted by serial; the caller holds t.mu.
func (t *LeaseTable) revokedList() []api.Revocation {
	var out []api.Revocation
	for _, s := range slices.Sorted(maps.Keys(t.revoked)) {
		out = append(out, t.revoked[s])
	}
	return out
}

// writeRevoked appends the state's "revoked" field, when the list is not
// empty; the caller holds t.mu.
func (t *LeaseTable) writeRevoked(out *bytes.Buffer) { out.Write(t.revokedJSON) }

// Revocations receives a signal whenever a certificate is revoked or a
// snapshot holding revocations is restored, so that the owner of the table
// can close the connections a revoked certificate still holds open.
// Signals coalesce (one waits at most), and the table starts no goroutine
// for them: closing connections is the owner's work, in a goroutine the
// owner stops and waits for before it closes what they use (the Raft node).
func (t *LeaseTable) Revocations() <-chan struct{} { return t.revokedKick }

// signalRevoked signals Revocations; it never blocks (the apply does not
// wait for the reader).
func (t *LeaseTable) signalRevoked() {
	select {
	case t.revokedKick <- struct{}{}:
	default: // one is waiting already: the reader sees every revocation then
	}
}

// IsRevoked tells whether the certificate of serial (api.CanonicalSerial)
// is on the deny list. It takes no lock: every TLS handshake and request
// of the masters asks.
func (t *LeaseTable) IsRevoked(serial string) bool {
	set := t.revokedSet.Load()
	if set == nil {
		return false
	}
	_, ok := (*set)[serial]
	return ok
}

// Revoked is the deny list, sorted by serial.
func (t *LeaseTable) Revoked() []api.Revocation {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.revokedList()
}
