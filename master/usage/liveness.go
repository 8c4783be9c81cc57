package usage

import (
	"maps"
	"slices"
	"time"

	"github.com/carve-net/carve/api"
)

// Agent liveness (issue 20, finding 7): when each agent was last heard
// from (a watch, a report, a usage report: agents send one at least every
// minute to the leader), and which are silent. Like usage it is not
// replicated: the leader, which receives every agent's usage reports,
// judges; a follower judges nothing. A silent agent's overlays that show
// STATUS_OK show STATUS_FAILED, with an error saying since when, in the
// state the judging master serves (Fill).

// DefaultSilentAfter is how long an agent may go unheard before it is
// silent: three of its usage refreshes.
const DefaultSilentAfter = 3 * time.Minute

// liveness is the table's record of when agents were last heard from;
// the table's mutex guards it.
type liveness struct {
	heard map[string]time.Time
	// silent holds the silent agents and when they were last heard from
	// (the judge's start when never).
	silent map[string]time.Time
	// gens changes an agent's cached encoding when it goes silent or
	// comes back (added to its usage generation).
	gens map[string]uint64
	// cas is the certificate each agent presents, as this master saw it
	// (NoteCA): what a CA rotation's last step needs to know.
	cas map[string]presented
}

// presented is the certificate an agent presents: the CA that issued it
// (api.CAFingerprint), its NotBefore, and when it was last seen.
type presented struct {
	ca        string
	notBefore time.Time
	seen      time.Time
}

// presentedStaleAfter is how long the newest certificate an agent
// presented counts after it was last seen, against an older one it still
// presents: an agent that went back to an older certificate.
const presentedStaleAfter = DefaultSilentAfter

func newLiveness() liveness {
	return liveness{heard: map[string]time.Time{}, silent: map[string]time.Time{}, gens: map[string]uint64{}, cas: map[string]presented{}}
}

// NoteCA records that agent id presented, at now, a certificate issued
// by the CA ca (api.CAFingerprint) and valid from notBefore. An agent
// reloaded with a new certificate may still present its old one on a
// connection opened before (a watch): the certificate issued last counts,
// and an older one only once the newer was not seen for
// presentedStaleAfter.
func (u *Table) NoteCA(id, ca string, notBefore, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	cur, ok := u.live.cas[id]
	if !ok || !notBefore.Before(cur.notBefore) || now.Sub(cur.seen) > presentedStaleAfter {
		u.live.cas[id] = presented{ca: ca, notBefore: notBefore, seen: now}
	}
}

// AgentCAs groups the agents ids (sorted) by the CA that issued the
// certificate they present (NoteCA; "" for those whose certificate this
// master has not seen), sorted by CA; each lists at most
// api.MaxAgentTrustListed agents and counts them all.
func (u *Table) AgentCAs(ids []string) []api.AgentCA {
	u.mu.Lock()
	byCA := map[string]*api.AgentCA{}
	for _, id := range ids {
		ca := u.live.cas[id].ca
		g := byCA[ca]
		if g == nil {
			g = &api.AgentCA{CA: ca}
			byCA[ca] = g
		}
		g.Count++
		if len(g.Agents) < api.MaxAgentTrustListed {
			g.Agents = append(g.Agents, id)
		}
	}
	u.mu.Unlock()
	out := make([]api.AgentCA, 0, len(byCA))
	for _, ca := range slices.Sorted(maps.Keys(byCA)) {
		out = append(out, *byCA[ca])
	}
	return out
}

// Heard records that agent id was heard from at now; a silent agent is
// silent no more.
func (u *Table) Heard(id string, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if now.After(u.live.heard[id]) {
		u.live.heard[id] = now
	}
	if _, ok := u.live.silent[id]; ok {
		delete(u.live.silent, id)
		u.live.gens[id]++
		u.gen++
	}
}

// JudgeSilence marks silent the agents of ids (the table's) not heard
// from for longer than after, counting from since when never heard from
// (the judge's start), forgets the agents not in ids (deleted), and
// returns the agents that went silent now, sorted.
func (u *Table) JudgeSilence(ids []string, now time.Time, after time.Duration, since time.Time) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var went []string
	for _, id := range ids {
		last := u.live.heard[id]
		if last.Before(since) {
			last = since
		}
		if _, ok := u.live.silent[id]; ok || now.Sub(last) <= after {
			continue
		}
		u.live.silent[id] = u.live.heard[id]
		u.live.gens[id]++
		u.gen++
		went = append(went, id)
	}
	// Agents deleted since: forgotten.
	live := map[string]bool{}
	for _, id := range ids {
		live[id] = true
	}
	for id := range u.live.heard {
		if !live[id] {
			delete(u.live.heard, id)
			delete(u.live.silent, id)
			delete(u.live.gens, id)
		}
	}
	for id := range u.live.cas {
		if !live[id] {
			delete(u.live.cas, id)
		}
	}
	slices.Sort(went)
	return went
}

// StopJudging forgets which agents are silent (this master no longer
// leads: it judges nothing), keeping when they were heard from.
func (u *Table) StopJudging() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for id := range u.live.silent {
		u.live.gens[id]++
		u.gen++
	}
	clear(u.live.silent)
}

// SilentAgents are the silent agents and when each was last heard from
// (zero: not since this master judges), sorted by id.
func (u *Table) SilentAgents() []api.SilentAgent {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]api.SilentAgent, 0, len(u.live.silent))
	for _, id := range slices.Sorted(maps.Keys(u.live.silent)) {
		s := api.SilentAgent{AgentID: id}
		if last := u.live.silent[id]; !last.IsZero() {
			s.LastHeard = last.UTC().Format(time.RFC3339)
		}
		out = append(out, s)
	}
	return out
}

// fillSilence shows a silent agent's STATUS_OK overlays as STATUS_FAILED,
// saying since when it is silent; the caller holds u.mu.
func (u *Table) fillSilence(info *api.AgentInfo) {
	last, ok := u.live.silent[info.AgentID]
	if !ok {
		return
	}
	msg := api.SilentPrefix + "not heard from since this master leads"
	if !last.IsZero() {
		msg = api.SilentPrefix + "not heard from since " + last.UTC().Format(time.RFC3339)
	}
	msg += " (no watch, report or usage report; is the agent running?)"
	for i := range info.Overlays {
		if st := &info.Overlays[i].State; st.Status == api.StatusOK {
			st.Status, st.Error = api.StatusFailed, msg
		}
	}
}
