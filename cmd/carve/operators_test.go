package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/mastertest"
)

// secureMaster runs a TLS master and returns it with the flags of a client
// holding a certificate of the role (name: its holder).
func secureMaster(t *testing.T) *mastertest.Secure {
	t.Helper()
	return mastertest.StartSecure(t, filepath.Join(t.TempDir(), "m1"), netconfig.Default(), slog.New(slog.DiscardHandler))
}

// clientFlags are --masters and the TLS flags of a certificate of role.
func clientFlags(m *mastertest.Secure, name string, role pki.Role) []string {
	return m.ClientFlags(name, role)
}

// registerAgents registers agents id -> underlay IP with their own certificates.
func registerAgents(t *testing.T, m *mastertest.Secure, agents map[string]string) {
	t.Helper()
	m.RegisterAgents(t, agents)
}

// run runs a command function and returns its output and exit code.
func run(t *testing.T, cmd func(context.Context, []string, *bytes.Buffer) error, args ...string) (string, int, error) {
	t.Helper()
	var out bytes.Buffer
	err := cmd(context.Background(), args, &out)
	return out.String(), cli.ExitCode(err), err
}

func clusterCmd(ctx context.Context, args []string, out *bytes.Buffer) error {
	return runCluster(ctx, args, out)
}
func agentsCmd(ctx context.Context, args []string, out *bytes.Buffer) error {
	return runAgents(ctx, args, out)
}

func TestClusterStatus(t *testing.T) {
	m := secureMaster(t)
	flags := clientFlags(m, "op", pki.RoleOperator)

	out, code, err := run(t, clusterCmd, append([]string{"status"}, flags...)...)
	if code != 0 || !strings.Contains(out, "leader m1") || !strings.Contains(out, "healthy") || !strings.Contains(out, "leader") {
		t.Fatalf("cluster status: exit %d (%v), output:\n%s", code, err, out)
	}

	out, code, _ = run(t, clusterCmd, append([]string{"status", "--json"}, clientFlags(m, "h1", pki.RoleAgent)...)...)
	var rep clusterReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("cluster status --json with an agent certificate: exit %d, %v:\n%s", code, err, out)
	}
	if !rep.Healthy || rep.Leader != "m1" || rep.ClusterID == "" || len(rep.Masters) != 1 || !rep.Masters[0].Status.CaughtUp {
		t.Errorf("report: %+v", rep)
	}

	// A master that does not answer makes the cluster unhealthy.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "https://" + ln.Addr().String()
	ln.Close()
	args := append([]string{"status", "--json", "--timeout", "5s"}, flags...)
	args[len(args)-7] += "," + dead // --masters is the first of the client flags
	out, code, err = run(t, clusterCmd, args...)
	rep = clusterReport{}
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil || code != 1 || !errors.Is(err, cli.ErrUnhealthy) {
		t.Fatalf("with an unreachable master: exit %d (%v), %v:\n%s", code, err, jerr, out)
	}
	if rep.Healthy || len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], dead) || rep.Leader != "m1" {
		t.Errorf("with an unreachable master: %+v", rep)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "needs a subcommand"},
		{[]string{"stat"}, `"stat": unknown subcommand`},
		{[]string{"status"}, "--masters is required"},
		{[]string{"status", "--masters", "https://127.0.0.1:1"}, "--ca-file"},
		{append([]string{"status", "--timeout", "0s"}, flags...), "--timeout"},
		{append([]string{"status", "extra"}, flags...), `unexpected argument "extra"`},
	} {
		if _, code, err := run(t, clusterCmd, tc.args...); code != 2 || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("cluster %q: exit %d, %v; want 2 and %q", tc.args, code, err, tc.want)
		}
	}
}

func TestJudgeCluster(t *testing.T) {
	server := func(id string) api.ServerInfo { return api.ServerInfo{ID: id, URL: "https://" + id, Voter: true} }
	status := func(id, leader, cluster string, caughtUp bool) *api.ClusterStatus {
		m3 := api.ServerInfo{ID: "m3", RaftAddr: "198.18.0.13:8300", Voter: true} // a follower: its URL is not known
		st := &api.ClusterStatus{ID: id, ClusterID: cluster, CaughtUp: caughtUp, Servers: []api.ServerInfo{server("m1"), server("m2"), m3}}
		if leader != "" {
			l := server(leader)
			st.Leader = &l
		}
		return st
	}
	tests := []struct {
		name    string
		masters []opclient.MasterView
		leader  string
		want    []string
	}{
		{"healthy", []opclient.MasterView{{URL: "https://m1", Status: status("m1", "m1", "c", true)}, {URL: "https://m2", Status: status("m2", "m1", "c", true)}}, "m1", nil},
		{"no leader", []opclient.MasterView{{URL: "https://m1", Status: status("m1", "", "c", true)}, {URL: "https://m2", Status: status("m2", "", "c", true)}}, "",
			[]string{"master m1 (https://m1): sees no leader", "master m2 (https://m2): sees no leader", "no leader"}},
		{"split views", []opclient.MasterView{{URL: "https://m1", Status: status("m1", "m1", "c", true)}, {URL: "https://m2", Status: status("m2", "m2", "d", false)}}, "",
			[]string{"master m2 (https://m2): has not caught up with the log (it answers state reads with 503)",
				"the masters disagree on the leader: m1 seen by m1; m2 seen by m2",
				"the masters report different cluster ids (a rebuilt cluster?): c on m1; d on m2"}},
		{"unreachable", []opclient.MasterView{{URL: "https://m1", Status: status("m1", "m1", "c", true)}, {URL: "https://m2", Error: "refused"}}, "m1",
			[]string{"master m2 (https://m2): down or unreachable: refused"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := &clusterReport{Masters: tc.masters}
			judgeCluster(rep)
			if len(rep.Unchecked) != 1 || rep.Unchecked[0] != "m3" {
				t.Errorf("unchecked: %v, want m3", rep.Unchecked)
			}
			if rep.Leader != tc.leader || rep.Healthy != (len(tc.want) == 0) || strings.Join(rep.Problems, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("leader %q, healthy %t, problems:\n%s\nwant leader %q, problems:\n%s", rep.Leader, rep.Healthy,
					strings.Join(rep.Problems, "\n"), tc.leader, strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestJudgeClusterDigests: masters that took a state digest at the same
// Raft index and got different ones hold different states (issue 26, item
// 0); digests at indexes only one master took say nothing.
func TestJudgeClusterDigests(t *testing.T) {
	view := func(id string, ds ...api.StateDigest) opclient.MasterView {
		l := api.ServerInfo{ID: "m1", URL: "https://m1", Voter: true}
		return opclient.MasterView{URL: "https://" + id, Status: &api.ClusterStatus{ID: id, ClusterID: "c", CaughtUp: true, Leader: &l,
			Servers:      []api.ServerInfo{{ID: "m1", URL: "https://m1", Voter: true}, {ID: "m2", URL: "https://m2", Voter: true}, {ID: "m3", URL: "https://m3", Voter: true}},
			StateDigests: ds}}
	}
	d := func(index uint64, digest string) api.StateDigest {
		return api.StateDigest{Index: index, Digest: digest}
	}
	agree := []opclient.MasterView{view("m1", d(1024, "aaaa"), d(2048, "bbbb")), view("m2", d(2048, "bbbb"), d(3072, "cccc")), view("m3", d(3073, "dddd"))}
	rep := &clusterReport{Masters: agree}
	judgeCluster(rep)
	if !rep.Healthy {
		t.Fatalf("masters that agree wherever they can be compared: %v", rep.Problems)
	}
	agree[2].Status.ConfigDiffers = "this master's --config file differs"
	rep = &clusterReport{Masters: agree}
	judgeCluster(rep)
	if !rep.Healthy || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "master m3 (https://m3): this master's --config file differs") {
		t.Errorf("a master whose file differs: healthy %t, warnings %q; want healthy with one warning naming m3", rep.Healthy, rep.Warnings)
	}
	diverged := []opclient.MasterView{view("m1", d(2048, "bbbb")), view("m2", d(2048, "bbbb")), view("m3", d(2048, "eeee"))}
	rep = &clusterReport{Masters: diverged}
	judgeCluster(rep)
	want := "the masters hold different states at Raft index 2048 (state digests bbbb on m1,m2; eeee on m3)"
	if rep.Healthy || len(rep.Problems) != 1 || !strings.HasPrefix(rep.Problems[0], want) {
		t.Fatalf("diverged masters: healthy %t, problems %q; want one starting %q", rep.Healthy, rep.Problems, want)
	}
}

// TestJudgeClusterLag (issue 27, item 6): a follower far behind its
// leader's commit index (a full disk stops its writes) is a problem, named
// with both indexes; one a little behind is not.
func TestJudgeClusterLag(t *testing.T) {
	view := func(id, role string, commit, applied uint64) opclient.MasterView {
		l := api.ServerInfo{ID: "m1", URL: "https://m1", Voter: true}
		return opclient.MasterView{URL: "https://" + id, Status: &api.ClusterStatus{ID: id, Role: role, ClusterID: "c", CaughtUp: true, Leader: &l,
			CommitIndex: commit, AppliedIndex: applied,
			Servers: []api.ServerInfo{{ID: "m1", URL: "https://m1", Voter: true}, {ID: "m2", URL: "https://m2", Voter: true}, {ID: "m3", URL: "https://m3", Voter: true}}}}
	}
	rep := &clusterReport{Masters: []opclient.MasterView{view("m1", "leader", 90000, 90000), view("m2", "follower", 89990, 89950), view("m3", "follower", 20000, 20000)}}
	judgeCluster(rep)
	want := "master m3 (https://m3) is 70000 entries behind (applied 20000, leader m1 committed 90000)"
	if rep.Healthy || len(rep.Problems) != 1 || !strings.HasPrefix(rep.Problems[0], want) {
		t.Fatalf("healthy %t, problems %q; want one starting %q", rep.Healthy, rep.Problems, want)
	}
}

// TestJudgeClusterDataDir (issue 27, finding 6): a master that reports it
// cannot write its data dir is a problem at once, before it falls behind.
func TestJudgeClusterDataDir(t *testing.T) {
	l := api.ServerInfo{ID: "m1", URL: "https://m1", Voter: true}
	servers := []api.ServerInfo{l, {ID: "m2", URL: "https://m2", Voter: true}}
	view := func(id, role, dataDirError string) opclient.MasterView {
		return opclient.MasterView{URL: "https://" + id, Status: &api.ClusterStatus{ID: id, Role: role, ClusterID: "c", CaughtUp: true, Leader: &l,
			CommitIndex: 10, AppliedIndex: 10, Servers: servers, DataDirError: dataDirError}}
	}
	for _, tc := range []struct {
		name string
		m2   string
		want []string
	}{
		{"writable", "", nil},
		{"full", "cannot write its --data-dir /var/lib/carve-master (no space left on device)",
			[]string{"master m2 (https://m2): cannot write its --data-dir /var/lib/carve-master (no space left on device) (docs/troubleshooting.md, a master behind)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &clusterReport{Masters: []opclient.MasterView{view("m1", "leader", ""), view("m2", "follower", tc.m2)}}
			judgeCluster(rep)
			if rep.Healthy != (len(tc.want) == 0) || !slices.Equal(rep.Problems, tc.want) {
				t.Errorf("healthy %t, problems %q; want %q", rep.Healthy, rep.Problems, tc.want)
			}
		})
	}
}

// TestJudgeClusterNamesADownMaster (issue 20, finding 8): a master whose
// URL was given but that does not answer is named as down, not reported as
// "not checked ... give them in --masters"; several masters on one host
// are not guessed between.
func TestJudgeClusterNamesADownMaster(t *testing.T) {
	servers := []api.ServerInfo{
		{ID: "m1", URL: "https://198.18.0.11:8080", RaftAddr: "198.18.0.11:8300", Voter: true},
		{ID: "m2", RaftAddr: "198.18.0.12:8300", Voter: true},
		{ID: "m3", RaftAddr: "198.18.0.13:8300", Voter: true},
	}
	up := func(id string) *api.ClusterStatus {
		return &api.ClusterStatus{ID: id, ClusterID: "c", CaughtUp: true, Leader: &servers[0], Servers: servers}
	}
	rep := &clusterReport{Masters: []opclient.MasterView{
		{URL: "https://198.18.0.11:8080", Status: up("m1")},
		{URL: "https://198.18.0.12:8080", Status: up("m2")},
		{URL: "https://198.18.0.13:8080", Error: "connection refused"},
	}}
	judgeCluster(rep)
	want := "master m3 (https://198.18.0.13:8080): down or unreachable: connection refused"
	if len(rep.Unchecked) != 0 || rep.Healthy || strings.Join(rep.Problems, "\n") != want {
		t.Errorf("unchecked %v, healthy %t, problems %q; want none unchecked and %q", rep.Unchecked, rep.Healthy, rep.Problems, want)
	}
	var out bytes.Buffer
	if err := printClusterReport(&out, rep); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "not checked") || !strings.Contains(out.String(), want) {
		t.Errorf("report:\n%s", out.String())
	}

	// Two masters that did not answer on one host: which URL is which is
	// not guessed.
	same := []api.ServerInfo{servers[0], {ID: "m2", RaftAddr: "127.0.0.1:8301", Voter: true}, {ID: "m3", RaftAddr: "127.0.0.1:8302", Voter: true}}
	rep = &clusterReport{Masters: []opclient.MasterView{
		{URL: "https://198.18.0.11:8080", Status: &api.ClusterStatus{ID: "m1", ClusterID: "c", CaughtUp: true, Leader: &same[0], Servers: same}},
		{URL: "https://127.0.0.1:8081", Error: "connection refused"},
	}}
	judgeCluster(rep)
	if !slices.Equal(rep.Unchecked, []string{"m2", "m3"}) || rep.Problems[0] != "master https://127.0.0.1:8081: unreachable: connection refused" {
		t.Errorf("two on one host: unchecked %v, problems %q", rep.Unchecked, rep.Problems)
	}
}

// TestJudgeClusterVotersDisagree (issue 20, finding 2): masters whose Raft
// configurations differ make the cluster unhealthy, naming both sets.
func TestJudgeClusterVotersDisagree(t *testing.T) {
	server := func(id string) api.ServerInfo {
		return api.ServerInfo{ID: id, URL: "https://" + id, Voter: true}
	}
	three := []api.ServerInfo{server("m1"), server("m2"), server("m3")}
	two := []api.ServerInfo{server("m1"), server("m3")}
	st := func(id string, servers []api.ServerInfo) *api.ClusterStatus {
		return &api.ClusterStatus{ID: id, ClusterID: "c", CaughtUp: true, Leader: &three[0], Servers: servers}
	}
	rep := &clusterReport{Masters: []opclient.MasterView{
		{URL: "https://m1", Status: st("m1", three)}, {URL: "https://m2", Status: st("m2", three)}, {URL: "https://m3", Status: st("m3", two)},
	}}
	judgeCluster(rep)
	want := "the masters disagree on the voters (a master started with another --peers, or a removal it missed): m1,m2,m3 seen by m1,m2; m1,m3 seen by m3; give every master the same --peers, and join or remove masters with carve cluster join|remove"
	if rep.Healthy || len(rep.Problems) != 1 || rep.Problems[0] != want {
		t.Errorf("healthy %t, problems %q; want %q", rep.Healthy, rep.Problems, want)
	}
}

func TestAgentsDelete(t *testing.T) {
	m := secureMaster(t)
	registerAgents(t, m, map[string]string{"h1": "198.18.0.11", "h2": "198.18.0.12", "h3": "198.18.0.13"})
	op := clientFlags(m, "op", pki.RoleOperator)

	// An agent certificate may not delete: the master's 403 is shown.
	_, code, err := run(t, agentsCmd, append([]string{"delete", "h1"}, clientFlags(m, "h1", pki.RoleAgent)...)...)
	if code != 1 || err == nil || !strings.Contains(err.Error(), "role agent may not") || !strings.Contains(err.Error(), "403") {
		t.Fatalf("delete with an agent certificate: exit %d, %v", code, err)
	}

	// An unknown name deletes nothing.
	_, code, err = run(t, agentsCmd, append([]string{"delete", "h1", "h9"}, op...)...)
	if code != 2 || err == nil || !strings.Contains(err.Error(), "h9") || !strings.Contains(err.Error(), "nothing deleted") {
		t.Fatalf("delete h1 h9: exit %d, %v", code, err)
	}

	// By id and by IP, flags after the names.
	out, code, err := run(t, agentsCmd, append(append([]string{"delete", "h1", "198.18.0.12"}, op...), "--json", "--request-id", "req-1")...)
	if code != 0 {
		t.Fatalf("delete h1 198.18.0.12: exit %d, %v\n%s", code, err, out)
	}
	var rep deleteReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.RequestID != "req-1" || len(rep.Agents) != 2 || rep.Agents[0].AgentID != "h1" || rep.Agents[1].AgentID != "h2" ||
		rep.Agents[1].Name != "198.18.0.12" {
		t.Fatalf("report: %+v", rep)
	}
	for _, a := range rep.Agents {
		if a.Result != deleteDone || a.Version == 0 || a.Version > rep.Index {
			t.Errorf("agent %+v: want deleted with its tombstone's version (index %d)", a, rep.Index)
		}
	}

	// Again: already deleted, and h3 still there.
	out, code, err = run(t, agentsCmd, append([]string{"delete", "h1"}, op...)...)
	if code != 0 || !strings.Contains(out, "already deleted") {
		t.Fatalf("delete h1 again: exit %d, %v\n%s", code, err, out)
	}
	c, err := apiclient.NewClientWith([]string{"https://" + m.HTTPAddr()}, apiclient.ClientOptions{TLS: m.CA.ClientTLS("op", pki.RoleOperator)})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.State(context.Background(), apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Agents) != 1 || st.Agents[0].AgentID != "h3" {
		t.Errorf("agents left: %+v, want h3", st.Agents)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"delete"}, op...), "name the agents to delete"},
		{append([]string{"delete", "bad/name"}, op...), `"bad/name" is neither an IP address nor an agent id`},
		{[]string{"remove", "h1"}, `"remove": unknown subcommand`},
	} {
		if _, code, err := run(t, agentsCmd, tc.args...); code != 2 || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("agents %q: exit %d, %v; want 2 and %q", tc.args, code, err, tc.want)
		}
	}
}

// TestClusterRemoveCommand (issue 20, finding 7): carve cluster remove of
// an id the cluster never knew fails with the masters' 404 naming the
// servers; join and remove refuse bad arguments before calling anything.
func TestClusterRemoveCommand(t *testing.T) {
	m := secureMaster(t)
	op := clientFlags(m, "op", pki.RoleOperator)
	_, code, err := run(t, clusterCmd, append([]string{"remove", "m9"}, op...)...)
	if code != 1 || err == nil || !strings.Contains(err.Error(), `no such master "m9": the cluster's servers are m1`) || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("remove m9: exit %d, %v; want 1 and a 404 naming m1", code, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"remove"}, op...), "name the master to remove"},
		{append([]string{"remove", "m2", "m3"}, op...), "one master at a time"},
		{append([]string{"remove"}, append(op, "m2", "--bogus")...), "flag provided but not defined: -bogus"},
		{append([]string{"join", "--raft-addr", "198.18.0.4:8300"}, op...), "--id is required"},
		{append([]string{"join", "--id", "m4", "--raft-addr", "198.18.0.4"}, op...), `--raft-addr "198.18.0.4": want HOST:PORT`},
		{append([]string{"join", "--id", "m4", "--raft-addr", "198.18.0.4:8300", "--http-addr", "x"}, op...), `--http-addr "x"`},
	} {
		if _, code, err := run(t, clusterCmd, tc.args...); code != 2 || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("cluster %q: exit %d, %v; want 2 and %q", tc.args, code, err, tc.want)
		}
	}
}

// TestJudgeClusterVersions (issue 20, finding 3; issue 27): versions
// beyond the supported skew (masters split across releases, agents more
// than a minor version behind) are a warning naming who runs what, not a
// problem; the report counts the agents by version. The rules themselves
// are buildinfo's TestSkewProblems.
func TestJudgeClusterVersions(t *testing.T) {
	lead := api.ServerInfo{ID: "m1", URL: "https://m1", Voter: true}
	servers := []api.ServerInfo{lead, {ID: "m2", URL: "https://m2", Voter: true}}
	st := func(id, version string) *api.ClusterStatus {
		return &api.ClusterStatus{ID: id, ClusterID: "c", CaughtUp: true, Leader: &lead, Servers: servers,
			Build: &api.BuildInfo{Version: version}, AgentVersions: map[string]int{"v0.3.1": 4, "v0.1.0": 1, "unknown": 2}}
	}
	rep := &clusterReport{Masters: []opclient.MasterView{{URL: "https://m1", Status: st("m1", "v0.3.0")}, {URL: "https://m2", Status: st("m2", "v0.2.0")}}}
	judgeCluster(rep)
	if !rep.Healthy || len(rep.Warnings) != 2 {
		t.Fatalf("healthy %t, warnings %q; want healthy with 2 warnings", rep.Healthy, rep.Warnings)
	}
	for i, want := range []string{
		"the masters run two releases (v0.2.0 on master m2; v0.3.0 on master m1): a rolling upgrade of the masters is under way",
		"agents run more than 1 minor version behind the masters (v0.1.0 on 1 agents; the masters: v0.2.0 on master m2; v0.3.0 on master m1)",
	} {
		if !strings.Contains(rep.Warnings[i], want) {
			t.Errorf("warning %d %q lacks %q", i, rep.Warnings[i], want)
		}
	}
	var out bytes.Buffer
	if err := printClusterReport(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"agent versions: unknown: 2, v0.1.0: 1, v0.3.1: 4", "warning: mixed versions", "v0.2.0", "healthy"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestJudgeClusterSilentAgents (issue 20, finding 7): the agents the
// leader has not heard from are a warning naming them; followers' views
// (which judge none) do not count.
func TestJudgeClusterSilentAgents(t *testing.T) {
	lead := api.ServerInfo{ID: "m1", URL: "https://m1", Voter: true}
	servers := []api.ServerInfo{lead, {ID: "m2", URL: "https://m2", Voter: true}}
	leader := &api.ClusterStatus{ID: "m1", Role: "leader", ClusterID: "c", CaughtUp: true, Leader: &lead, Servers: servers, SilentAfter: "3m0s",
		SilentAgents: []api.SilentAgent{{AgentID: "h4", LastHeard: "2026-11-27T10:00:00Z"}, {AgentID: "h5"}}}
	follower := &api.ClusterStatus{ID: "m2", Role: "follower", ClusterID: "c", CaughtUp: true, Leader: &lead, Servers: servers}
	rep := &clusterReport{Masters: []opclient.MasterView{{URL: "https://m2", Status: follower}, {URL: "https://m1", Status: leader}}}
	judgeCluster(rep)
	want := "2 agents not heard from for over 3m0s, as leader m1 sees it (their overlays show STATUS_FAILED): h4 (last heard 2026-11-27T10:00:00Z), h5"
	if !rep.Healthy || len(rep.Warnings) != 1 || !strings.HasPrefix(rep.Warnings[0], want) || len(rep.SilentAgents) != 2 {
		t.Errorf("healthy %t, warnings %q; want healthy and %q", rep.Healthy, rep.Warnings, want)
	}
}

// TestVersionCommand: carve version prints the build, as text and JSON.
func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	if err := runVersion(nil, &out); err != nil || !strings.HasPrefix(out.String(), "carve ") || !strings.Contains(out.String(), "go1.") {
		t.Errorf("carve version: %v, %q", err, out.String())
	}
	out.Reset()
	var info struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	if err := runVersion([]string{"--json"}, &out); err != nil || json.Unmarshal(out.Bytes(), &info) != nil || info.Version == "" || info.GoVersion == "" {
		t.Errorf("carve version --json: %v, %q", err, out.String())
	}
	if err := runVersion([]string{"extra"}, &out); cli.ExitCode(err) != 2 {
		t.Errorf("carve version extra: %v, want a usage error", err)
	}
}

// TestJudgeClusterExhaustion (issue 27, "health is the truth"): an overlay
// that leaves agents without a subnet, or is full, is a problem naming the
// overlay and the agents, as the leader sees it.
func TestJudgeClusterExhaustion(t *testing.T) {
	servers := []api.ServerInfo{{ID: "m1", URL: "https://m1", Voter: true}, {ID: "m2", URL: "https://m2", Voter: true}}
	view := func(id, role string, ex ...api.ExhaustedOverlay) opclient.MasterView {
		return opclient.MasterView{URL: "https://" + id, Status: &api.ClusterStatus{ID: id, Role: role, ClusterID: "c", CaughtUp: true, Leader: &servers[0],
			Servers: servers, ExhaustedOverlays: ex}}
	}
	unleased := api.ExhaustedOverlay{Overlay: "small", Family: 4, UnleasedCount: 12, Unleased: []string{"a1", "a2"}}
	full := api.ExhaustedOverlay{Overlay: "small", Family: 4, UnleasedCount: 12, Unleased: []string{"a1", "a2"}, Full: true}
	for _, tc := range []struct {
		name string
		rep  *clusterReport
		want []string
	}{
		{name: "healthy", rep: &clusterReport{Masters: []opclient.MasterView{view("m1", "leader"), view("m2", "follower")}}},
		{name: "agents without a subnet", rep: &clusterReport{Masters: []opclient.MasterView{view("m1", "leader", unleased), view("m2", "follower", unleased)}},
			want: []string{"overlay small (IPv4) is exhausted: 12 agents have no subnet of it (a1, a2 and 10 more)"}},
		{name: "full, as the leader judges", rep: &clusterReport{Masters: []opclient.MasterView{view("m2", "follower", unleased), view("m1", "leader", full)}},
			want: []string{"overlay small (IPv4) is exhausted", "overlay small (IPv4) is full: no block is left to grow into"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			judgeCluster(tc.rep)
			if tc.rep.Healthy != (len(tc.want) == 0) || len(tc.rep.Problems) != len(tc.want) {
				t.Fatalf("healthy %t, problems %q; want %q", tc.rep.Healthy, tc.rep.Problems, tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(tc.rep.Problems[i], w) {
					t.Errorf("problem %d: %q, want it to start %q", i, tc.rep.Problems[i], w)
				}
			}
		})
	}
}
