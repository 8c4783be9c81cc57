package main

import (
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/opclient"
)

// TestJudgeClusterHistories: masters of different histories (one on a
// data directory from before a whole-cluster restore, issue 27 item 2)
// are a problem naming the master not of the leader's history and the
// fix; a master that refused a peer of another history this report did
// not reach is one too; masters of one history are healthy and the report
// names it.
func TestJudgeClusterHistories(t *testing.T) {
	view := func(id, role, history, conflict string) opclient.MasterView {
		l := api.ServerInfo{ID: "m1", URL: "https://m1", Voter: true}
		return opclient.MasterView{URL: "https://" + id, Status: &api.ClusterStatus{ID: id, Role: role, ClusterID: "c", CaughtUp: true, Leader: &l,
			Servers: []api.ServerInfo{{ID: "m1", URL: "https://m1", Voter: true}, {ID: "m2", URL: "https://m2", Voter: true}, {ID: "m3", URL: "https://m3", Voter: true}},
			History: history, HistoryConflict: conflict}}
	}
	tests := []struct {
		name    string
		masters []opclient.MasterView
		history string
		want    []string // substrings of the one problem; none: healthy
	}{
		{"one history", []opclient.MasterView{view("m1", "leader", "c/200", ""), view("m2", "follower", "c/200", ""), view("m3", "follower", "c/200", "")}, "c/200", nil},
		{"a master of versions before histories", []opclient.MasterView{view("m1", "leader", "c/200", ""), view("m2", "follower", "", "")}, "c/200", nil},
		{"a master on its data directory of before", []opclient.MasterView{view("m1", "leader", "c/200", ""), view("m2", "follower", "c/200", ""), view("m3", "follower", "c", "")}, "",
			[]string{"different histories", "c on m3; c/200 on m1,m2", "stop m3 (not of the leader's history)", "move its data directory away"}},
		{"a refused peer not asked", []opclient.MasterView{view("m1", "leader", "c/200", "raft peer 198.18.0.13:8300 is of history c"), view("m2", "follower", "c/200", "")}, "c/200",
			[]string{"master m1 (https://m1): raft peer 198.18.0.13:8300 is of history c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := &clusterReport{Masters: tc.masters}
			judgeCluster(rep)
			if rep.History != tc.history {
				t.Errorf("history %q, want %q", rep.History, tc.history)
			}
			if len(tc.want) == 0 {
				if !rep.Healthy {
					t.Errorf("problems %q, want healthy", rep.Problems)
				}
				return
			}
			if rep.Healthy || len(rep.Problems) != 1 {
				t.Fatalf("healthy %t, problems %q; want one problem", rep.Healthy, rep.Problems)
			}
			for _, w := range tc.want {
				if !strings.Contains(rep.Problems[0], w) {
					t.Errorf("problem %q does not say %q", rep.Problems[0], w)
				}
			}
		})
	}
}
