package certscmd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestJudgeAgentMesh: a round of a mesh password change is finished when
// every live agent the leader sees reports the round's pair (the password
// sent, the one accepted besides or none), and not otherwise: the error
// names the agents on another pair (or reporting none) and the fix.
func TestJudgeAgentMesh(t *testing.T) {
	oldFP, nextFP := api.MeshPasswordFingerprint([]byte("old")), api.MeshPasswordFingerprint([]byte("next"))
	round2 := meshRound{password: nextFP, accepted: oldFP, passwordFile: "next.pw", acceptedFile: "old.pw"}
	round3 := meshRound{password: nextFP, passwordFile: "next.pw"}
	status := func(agents, silent int, byMesh ...api.AgentMesh) *api.ClusterStatus {
		st := &api.ClusterStatus{ID: "m1", Role: "leader", AgentVersions: map[string]int{"v1": agents}}
		for range silent {
			st.SilentAgents = append(st.SilentAgents, api.SilentAgent{AgentID: "gone"})
		}
		if len(byMesh) > 0 {
			st.AgentTrust = &api.AgentTrust{ByMesh: byMesh}
		}
		return st
	}
	tests := []struct {
		name     string
		leader   *api.ClusterStatus
		round    meshRound
		live     int
		mentions []string // none: finished
	}{
		{"round 2 everywhere", status(3, 0, api.AgentMesh{Password: nextFP, Accepted: oldFP, Count: 3, Agents: []string{"h1", "h2", "h3"}}), round2, 3, nil},
		{"round 3 everywhere", status(2, 0, api.AgentMesh{Password: nextFP, Count: 2, Agents: []string{"h1", "h2"}}), round3, 2, nil},
		{"no agents", status(0, 0), round3, 0, nil},
		{"every agent silent", status(2, 2), round3, 0, nil},
		{"no leader", nil, round3, 0, []string{"no master leads"}},
		{"an agent still on round 1", status(3, 0,
			api.AgentMesh{Password: nextFP, Accepted: oldFP, Count: 2, Agents: []string{"h1", "h3"}},
			api.AgentMesh{Password: oldFP, Accepted: nextFP, Count: 1, Agents: []string{"h2"}}), round2, 3,
			[]string{"1 live agents are not on this round", "h2 (sends the password of old.pw and accepts the password of next.pw besides)",
				"SIGHUP them", "--mesh-accepted-password-file holding old.pw's"}},
		{"round 3 not finished: an agent still accepts the old password", status(2, 0,
			api.AgentMesh{Password: nextFP, Count: 1, Agents: []string{"h1"}},
			api.AgentMesh{Password: nextFP, Accepted: oldFP, Count: 1, Agents: []string{"h2"}}), round3, 2,
			[]string{"h2 (sends the password of next.pw and accepts password " + oldFP + " besides)", "--mesh-accepted-password-file empty"}},
		{"more agents than listed", status(300, 0,
			api.AgentMesh{Password: oldFP, Count: 300, Agents: []string{"h1"}}), round3, 300,
			[]string{"300 live agents", "and 299 more"}},
		{"agents reporting none", status(2, 0,
			api.AgentMesh{Password: nextFP, Count: 1, Agents: []string{"h1"}},
			api.AgentMesh{Count: 1, Agents: []string{"h2"}}), round3, 2,
			[]string{"1 live agents report no mesh password to the leader m1: h2", "retry in a minute"}},
		{"masters or agents that predate the check", status(2, 0), round3, 0, []string{"none reports a mesh password", "upgrade them"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			live, err := judgeAgentMesh(tt.leader, tt.round)
			if len(tt.mentions) == 0 {
				if err != nil || live != tt.live {
					t.Errorf("judged %d live agents, %v; want %d and finished", live, err, tt.live)
				}
				return
			}
			if !errors.Is(err, errAgentsOnOtherMeshRound) {
				t.Fatalf("judged %v, want errAgentsOnOtherMeshRound", err)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

// TestReadMeshRound: the round's files are read as the agent reads them
// (one trailing newline ignored; an empty or absent accepted file: none),
// and a missing password file is refused naming the flag.
func TestReadMeshRound(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	next, old, empty := write("next", "next\n"), write("old", "old"), write("empty", "")
	tests := []struct {
		name                 string
		password, accepted   string
		wantP, wantA, errHas string
	}{
		{"sent and accepted", next, old, api.MeshPasswordFingerprint([]byte("next")), api.MeshPasswordFingerprint([]byte("old")), ""},
		{"no accepted file", next, "", api.MeshPasswordFingerprint([]byte("next")), "", ""},
		{"an empty accepted file", next, empty, api.MeshPasswordFingerprint([]byte("next")), "", ""},
		{"an absent accepted file", next, filepath.Join(dir, "absent"), api.MeshPasswordFingerprint([]byte("next")), "", ""},
		{"an absent password file", filepath.Join(dir, "absent"), "", "", "", "--password-file"},
		{"an empty password file", empty, "", "", "", "--password-file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := readMeshRound(tt.password, tt.accepted)
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("error %v, want one naming %s", err, tt.errHas)
				}
				return
			}
			if err != nil || r.password != tt.wantP || r.accepted != tt.wantA {
				t.Errorf("read %q/%q, %v; want %q/%q", r.password, r.accepted, err, tt.wantP, tt.wantA)
			}
		})
	}
}
