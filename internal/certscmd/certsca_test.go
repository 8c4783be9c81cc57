package certscmd

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/pki"
)

// TestJudgeAgentCAs: a CA rotation's step 3 is allowed when every live
// agent the leader sees presents a certificate of a CA of the new CA
// file, and refused otherwise, naming the agents on another CA (or not
// seen yet) and the fix.
func TestJudgeAgentCAs(t *testing.T) {
	const newCA, oldCA, otherCA = "aaaa000000000000000000000000000000000000000000000000000000000000", "bbbb111111111111111111111111111111111111111111111111111111111111", "cccc2222"
	cas := map[string]bool{newCA: true}
	status := func(agents int, silent int, byCA ...api.AgentCA) *api.ClusterStatus {
		st := &api.ClusterStatus{ID: "m1", Role: "leader", AgentVersions: map[string]int{"v1": agents}}
		for range silent {
			st.SilentAgents = append(st.SilentAgents, api.SilentAgent{AgentID: "gone"})
		}
		if len(byCA) > 0 {
			st.AgentTrust = &api.AgentTrust{ByCA: byCA}
		}
		return st
	}
	tests := []struct {
		name     string
		leader   *api.ClusterStatus
		live     int
		mentions []string // none: allowed
	}{
		{"every agent on the new CA", status(3, 0, api.AgentCA{CA: newCA, Count: 3, Agents: []string{"h1", "h2", "h3"}}), 3, nil},
		{"no agents", status(0, 0), 0, nil},
		{"every agent silent", status(2, 2), 0, nil},
		{"no leader", nil, 0, []string{"no master leads"}},
		{"agents on the old CA", status(3, 0,
			api.AgentCA{CA: newCA, Count: 1, Agents: []string{"h1"}},
			api.AgentCA{CA: oldCA, Count: 2, Agents: []string{"h3", "h2"}}), 3,
			[]string{"2 live agents present a certificate of another CA than NEW/ca.pem: h2 (CA bbbb111111111111), h3 (CA bbbb111111111111)", "carve certs issue --dir NEW", "SIGHUP the agents (step 2)"}},
		{"more agents than listed", status(300, 0,
			api.AgentCA{CA: oldCA, Count: 300, Agents: []string{"h1"}}), 300,
			[]string{"300 live agents", "h1 (CA bbbb111111111111) and 299 more"}},
		{"on two other CAs", status(2, 0,
			api.AgentCA{CA: oldCA, Count: 1, Agents: []string{"h2"}},
			api.AgentCA{CA: otherCA, Count: 1, Agents: []string{"h1"}}), 2,
			[]string{"h1 (CA cccc2222), h2 (CA bbbb111111111111)"}},
		{"agents not seen yet", status(2, 0,
			api.AgentCA{CA: newCA, Count: 1, Agents: []string{"h1"}},
			api.AgentCA{CA: "", Count: 1, Agents: []string{"h2"}}), 2,
			[]string{"1 live agents whose certificate the leader m1 has not seen yet: h2", "retry in a minute"}},
		{"masters that predate the check", status(2, 0), 0, []string{"does not say which CA", "upgrade the masters"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			live, err := judgeAgentCAs(tt.leader, "NEW/ca.pem", cas)
			if len(tt.mentions) == 0 {
				if err != nil || live != tt.live {
					t.Errorf("judged %d live agents, %v; want %d and allowed", live, err, tt.live)
				}
				return
			}
			if !errors.Is(err, errAgentsOnOtherCA) {
				t.Fatalf("judged %v, want errAgentsOnOtherCA", err)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

// TestJudgeMasterCAs: step 3 cuts off a master whose certificate is of
// another CA as surely as an agent: each master says which CA issued its
// own, and check-ca names those on another, or that cannot say.
func TestJudgeMasterCAs(t *testing.T) {
	const newCA, oldCA = "aaaa000000000000000000000000000000000000000000000000000000000000", "bbbb111111111111111111111111111111111111111111111111111111111111"
	cas := map[string]bool{newCA: true}
	view := func(id, ca string) opclient.MasterView {
		return opclient.MasterView{URL: "https://" + id, Status: &api.ClusterStatus{ID: id, CertificateCA: ca}}
	}
	tests := []struct {
		name     string
		views    []opclient.MasterView
		mentions []string // none: allowed
	}{
		{"every master on the new CA", []opclient.MasterView{view("m1", newCA), view("m2", newCA)}, nil},
		{"one on the old CA", []opclient.MasterView{view("m1", newCA), view("m2", oldCA)},
			[]string{"1 masters present a certificate of another CA than NEW/ca.pem: m2 (CA bbbb111111111111)", "--role master", "SIGHUP the masters"}},
		{"one that predates the check", []opclient.MasterView{view("m1", newCA), view("m2", "")}, []string{"m2 (it predates this check"}},
		{"one that does not answer", []opclient.MasterView{view("m1", newCA), {URL: "https://m3", Error: "connection refused"}}, []string{"https://m3 (no answer: connection refused)", "retry"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			problems := judgeMasterCAs(tt.views, "NEW/ca.pem", cas)
			if len(tt.mentions) == 0 {
				if len(problems) > 0 {
					t.Errorf("problems %q, want none", problems)
				}
				return
			}
			got := strings.Join(problems, "; ")
			for _, m := range tt.mentions {
				if !strings.Contains(got, m) {
					t.Errorf("problems %q do not mention %q", got, m)
				}
			}
		})
	}
}

// TestJudgeOwnCA: the operator running check-ca learns when its own
// certificate is of the old CA (real certificates of two CAs).
func TestJudgeOwnCA(t *testing.T) {
	oldDir, newDir := t.TempDir(), t.TempDir()
	for _, dir := range []string{oldDir, newDir} {
		if err := pki.CreateCA(dir, time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := pki.Issue(dir, pki.IssueRequest{Role: pki.RoleOperator, Name: "alice"}); err != nil {
			t.Fatal(err)
		}
	}
	newCAs, err := readCAs(filepath.Join(newDir, pki.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	if p := judgeOwnCA(pki.CertFile(newDir, "alice"), "NEW/ca.pem", newCAs); p != "" {
		t.Errorf("a certificate of the new CA judged %q", p)
	}
	if p := judgeOwnCA(pki.CertFile(oldDir, "alice"), "NEW/ca.pem", newCAs); !strings.Contains(p, "is not of a CA of NEW/ca.pem") || !strings.Contains(p, "--role operator") {
		t.Errorf("a certificate of the old CA judged %q, want it named with the fix", p)
	}
	if p := judgeOwnCA("", "NEW/ca.pem", newCAs); p != "" {
		t.Errorf("no certificate (--insecure) judged %q", p)
	}
}
