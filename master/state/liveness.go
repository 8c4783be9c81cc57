package state

import (
	"maps"
	"slices"
	"time"

	"github.com/carve-net/carve/api"
)

// Agent liveness is the usage table's (usage.Table): the lease table hands
// it the ids of its agents.

// NoteCA records the CA of the certificate agent id presented
// (usage.Table.NoteCA).
func (t *LeaseTable) NoteCA(id, ca string, notBefore, now time.Time) {
	t.usage.NoteCA(id, ca, notBefore, now)
}

// AgentCAs groups the agents of the table but those in silent by the CA
// that issued the certificate they present (usage.Table.AgentCAs).
func (t *LeaseTable) AgentCAs(silent map[string]bool) []api.AgentCA {
	t.mu.RLock()
	ids := make([]string, 0, len(t.agents))
	for id := range t.agents {
		if !silent[id] {
			ids = append(ids, id)
		}
	}
	t.mu.RUnlock()
	slices.Sort(ids)
	return t.usage.AgentCAs(ids)
}

// Heard records that agent id was heard from at now; a silent agent is
// silent no more.
func (t *LeaseTable) Heard(id string, now time.Time) { t.usage.Heard(id, now) }

// JudgeSilence marks silent the agents of the table not heard from for
// longer than after, counting from since when never heard from (the
// judge's start), and returns the agents that went silent now.
func (t *LeaseTable) JudgeSilence(now time.Time, after time.Duration, since time.Time) []string {
	t.mu.RLock()
	ids := slices.Collect(maps.Keys(t.agents))
	t.mu.RUnlock()
	return t.usage.JudgeSilence(ids, now, after, since)
}

// StopJudging forgets which agents are silent (this master no longer
// leads: it judges nothing), keeping when they were heard from.
func (t *LeaseTable) StopJudging() { t.usage.StopJudging() }

// SilentAgents are the silent agents and when each was last heard from
// (zero: not since this master judges), sorted by id.
func (t *LeaseTable) SilentAgents() []api.SilentAgent { return t.usage.SilentAgents() }
