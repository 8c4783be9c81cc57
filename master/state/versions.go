package state

// UnknownVersion counts, in AgentVersions, the agents that registered
// without a carve version (agents of earlier versions).
const UnknownVersion = "unknown"

// AgentVersions counts the agents by the carve version they registered
// with (UnknownVersion for none).
func (t *LeaseTable) AgentVersions() map[string]int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := map[string]int{}
	for _, rec := range t.agents {
		v := rec.CarveVersion
		if v == "" {
			v = UnknownVersion
		}
		out[v]++
	}
	return out
}
