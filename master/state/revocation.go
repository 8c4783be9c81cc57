package state

import (
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
)

// The deny list is package denylist's: the table applies the revocations
// of the log to it, deletes the agents they name, and keeps it across
// restores.

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
	if !t.denied.Add(api.Revocation{Serial: c.Serial, Identity: c.Identity, NotAfter: c.NotAfter, Index: index}) {
		return nil, nil
	}
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
	if t.denied.Prune(now) {
		t.stateIndex = index
	}
}

// Revocations receives a signal whenever a certificate is revoked or a
// snapshot holding revocations is restored, so that the owner of the table
// can close the connections a revoked certificate still holds open.
// Signals coalesce (one waits at most), and the table starts no goroutine
// for them: closing connections is the owner's work, in a goroutine the
// owner stops and waits for before it closes what they use (the Raft node).
func (t *LeaseTable) Revocations() <-chan struct{} { return t.denied.Signals() }

// IsRevoked tells whether the certificate of serial (api.CanonicalSerial)
// is on the deny list. It takes no lock: every TLS handshake and request
// of the masters asks.
func (t *LeaseTable) IsRevoked(serial string) bool { return t.denied.IsRevoked(serial) }

// Revoked is the deny list, sorted by serial.
func (t *LeaseTable) Revoked() []api.Revocation {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.denied.Sorted()
}
