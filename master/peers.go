package master

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/carve-net/carve/raftlog"
)

// The start-up check of --id and --peers against the Raft configuration
// (issue 20, finding 2): a typo in --id is an error, not an endless wait
// to be added; a removed master does not come back to disturb the others;
// a --peers that differs from the cluster's voters is said loudly.

// checkMembership compares this master's --id and --peers with the Raft
// configuration it opened: an error when it cannot take part (named, with
// the fix), a warning when --peers differs from the voters.
func (m *Master) checkMembership() error {
	st := m.node.Status()
	inPeers := slices.ContainsFunc(m.opts.Peers, func(p raftlog.Server) bool { return p.ID == m.opts.ID })
	if len(st.Servers) == 0 {
		// No Raft state and not bootstrapped: only a master that joins
		// may wait to be added.
		if m.opts.Join == "" && len(m.opts.Peers) > 0 && !inPeers {
			return fmt.Errorf("master: --id %q is not in --peers (%s): a master without Raft state bootstraps the cluster only when --peers names it, and would wait for ever to be added; "+
				"fix --id (a typo?) or --peers (the same list on every master), or start it with --join URL to join a running cluster",
				m.opts.ID, describeServers(m.opts.Peers))
		}
		return nil
	}
	inConfig := slices.ContainsFunc(st.Servers, func(s raftlog.Server) bool { return s.ID == m.opts.ID })
	if !inConfig {
		if m.opts.Join != "" {
			m.log.Warn("this master is not in the Raft configuration of its data directory: it asks to join again",
				"id", m.opts.ID, "configuration", describeServers(st.Servers), "join", m.opts.Join)
			return nil
		}
		return fmt.Errorf("master: --id %q is not a server of the Raft configuration in --data-dir %s (%s): it was removed from the cluster, or --id is wrong; "+
			"fix --id, or to bring this master back move --data-dir away and start it with --join URL (docs/operations.md, section 6)",
			m.opts.ID, m.opts.DataDir, describeServers(st.Servers))
	}
	if len(m.opts.Peers) > 0 && !sameServers(m.opts.Peers, st.Servers) {
		m.log.Warn("--peers differs from the cluster's voters in the data directory: --peers only bootstraps a new cluster, the voters change with carve cluster join|remove; "+
			"set --peers to the voters on every master, and check carve cluster status (it reports masters that disagree on the voters)",
			"peers", describeServers(m.opts.Peers), "voters", describeServers(st.Servers))
	}
	return nil
}

// describeServers renders servers as "m1=HOST:PORT,m2=HOST:PORT", sorted
// by id; a non-voter is marked.
func describeServers(servers []raftlog.Server) string {
	parts := make([]string, 0, len(servers))
	for _, s := range servers {
		parts = append(parts, s.ID+"="+s.Address)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// sameServers tells whether peers names exactly the voters of config, at
// the same addresses.
func sameServers(peers, config []raftlog.Server) bool {
	voters := map[string]string{}
	for _, s := range config {
		if s.Voter {
			voters[s.ID] = s.Address
		}
	}
	want := map[string]string{}
	for _, p := range peers {
		want[p.ID] = p.Address
	}
	return maps.Equal(voters, want)
}
