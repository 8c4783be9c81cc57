package membership

import (
	"fmt"
	"strings"

	"github.com/carve-net/carve/api"
)

// RefusedRevoked: a record of an agent whose certificate the masters
// revoked, at or below the revocation's index (signed while the
// certificate was good, replayed since).
const RefusedRevoked = "revoked"

// RevokedAgents maps the agents of a deny list (identity agent/NAME) to
// the Raft index of their revocation (the latest, when several).
func RevokedAgents(list []api.Revocation) map[string]uint64 {
	var out map[string]uint64
	for _, r := range list {
		id, ok := strings.CutPrefix(r.Identity, "agent/")
		if !ok {
			continue
		}
		if out == nil {
			out = map[string]uint64{}
		}
		out[id] = max(out[id], r.Index)
	}
	return out
}

// checkRevoked refuses a record of a revoked agent at or below the
// revocation's index; a record above it comes from a registration with
// a new certificate.
func (tr *Trust) checkRevoked(rec *PeerRecord) Refusal {
	if at, ok := tr.Revoked[rec.ID]; ok && rec.Version <= at {
		return Refusal{RefusedRevoked, fmt.Errorf("record of %s version %d: its certificate was revoked at index %d", rec.ID, rec.Version, at)}
	}
	return Refusal{}
}
