package state

import (
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/agenttrust"
)

// AgentTrust judges the live agents' last reports against the table
// (agenttrust.Judge): those whose key differs from key (the one the
// judging master signs with; "" signs nothing and judges no key), those
// that refuse the masters' records, those whose kernel holds fewer peers
// than the records give them, and the mesh password groups. silent are
// the agents left out (not heard from: their reports are old news).
func (t *LeaseTable) AgentTrust(key string, silent map[string]bool) api.AgentTrust {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.net == nil {
		return api.AgentTrust{}
	}
	enabled := map[string]bool{}
	for def := range t.net.Overlays() {
		enabled[def.Name()] = def.Enabled()
	}
	return agenttrust.Judge(key, t.agents, t.reports, enabled, silent)
}
