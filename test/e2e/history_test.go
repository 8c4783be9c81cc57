package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestRestoredHistoryRefusesOldDataDir replays issue 27, item 2, on three
// masters with TLS: carve snapshot save, writes the snapshot lacks, a
// whole-cluster restore (--restore-from onto empty data directories), then
// one master started again on its data directory of before. Its log
// reuses the indexes and terms of the restored one; raft alone would match
// it and leave it with the old history's records below the match. It must
// be refused instead: carve cluster status names the masters of different
// histories (non-zero exit), no master serves a record of the old history,
// and once the master's data directory is moved away, as the problem
// says, it joins the restored history and the cluster is healthy.
func TestRestoredHistoryRefusesOldDataDir(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	ctx := within(t, 6*converge)
	if err := c.StartMasters(ctx); err != nil {
		t.Fatal(err)
	}
	registered := 0
	registerAll := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			registered++
			ip := fmt.Sprintf("198.18.9.%d", 10+registered)
			register(ctx, t, c, api.RegisterRequest{AgentID: id, IP: ip, MeshAddr: ip + ":6783"})
		}
	}
	operator := func(args ...string) (string, error) {
		t.Helper()
		args = append(append(args, "--masters", strings.Join(c.MasterURLs(), ",")), c.OperatorArgs()...)
		out, err := c.RunCarve(ctx, c.Host(1), args...)
		return string(out), err
	}

	registerAll("kept-1", "kept-2")
	file := filepath.Join(t.TempDir(), "carve.json")
	if out, err := operator("snapshot", "save", file); err != nil {
		t.Fatalf("carve snapshot save: %v: %s", err, out)
	}
	// The old history goes on past the snapshot: its log grows longer than
	// the restored one will be.
	old := []string{"old-1", "old-2", "old-3", "old-4", "old-5", "old-6"}
	registerAll(old...)

	masters := c.Masters()
	stale := masters[2]
	for _, m := range masters {
		if err := c.StopMaster(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	oldDir := stale.DataDir
	for _, m := range masters {
		m.DataDir += ".restored" // the old one stays, as the procedure keeps it
		if err := c.StartMasterWith(m, "--restore-from", file); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, converge, "the masters to show the restore", func() error {
		st, err := c.State(ctx)
		if err != nil {
			return err
		}
		if st.Restore == nil {
			return errors.New("no restore yet")
		}
		return nil
	})

	// The mistake: one master started on its data directory of before.
	if err := c.StopMaster(ctx, stale); err != nil {
		t.Fatal(err)
	}
	stale.DataDir = oldDir
	if err := c.StartMaster(stale); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	registerAll("new-1", "new-2", "new-3")

	statusOf := func(m *labcluster.Master) (*api.State, error) {
		cl, err := apiclient.NewClient([]string{m.URL()}, c.HTTPClient())
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return cl.State(cctx, apiclient.StateOptions{})
	}
	agentsOf := func(st *api.State) []string {
		var ids []string
		for _, a := range st.Agents {
			ids = append(ids, a.AgentID)
		}
		slices.Sort(ids)
		return ids
	}
	type report struct {
		Healthy  bool     `json:"healthy"`
		Problems []string `json:"problems"`
	}
	clusterStatus := func() (report, error) {
		var rep report
		out, err := operator("cluster", "status", "--json")
		if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
			return rep, fmt.Errorf("carve cluster status --json: %v (%v): %s", jerr, err, out)
		}
		if rep.Healthy != (err == nil) {
			return rep, fmt.Errorf("carve cluster status: healthy %t but exit %v", rep.Healthy, err)
		}
		return rep, nil
	}
	testutil.Eventually(t, converge, "carve cluster status to report the master of the old history", func() error {
		rep, err := clusterStatus()
		if err != nil {
			return err
		}
		for _, p := range rep.Problems {
			if strings.Contains(p, "different histories") && strings.Contains(p, stale.ID) {
				return nil
			}
		}
		// What the stale master serves meanwhile says what went wrong.
		seen := "no state"
		if st, err := statusOf(stale); err == nil {
			seen = fmt.Sprintf("state index %d, agents %v", st.Index, agentsOf(st))
		}
		return fmt.Errorf("no problem names the histories (healthy %t, problems %q); %s serves %s", rep.Healthy, rep.Problems, stale.ID, seen)
	})

	// No master serves a record of the old history; the restored ones
	// serve the writes made after the restore.
	for _, m := range masters {
		st, err := statusOf(m)
		if m == stale {
			if err == nil {
				t.Errorf("%s, refused by the restored masters, serves state index %d, agents %v", m.ID, st.Index, agentsOf(st))
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", m.ID, err)
		}
		ids := agentsOf(st)
		for _, id := range old {
			if slices.Contains(ids, id) {
				t.Errorf("%s serves %s, a record of the history before the restore: agents %v", m.ID, id, ids)
			}
		}
	}

	// The fix the problem names: the data directory moved away, the master
	// started on an empty one.
	if err := c.StopMaster(ctx, stale); err != nil {
		t.Fatal(err)
	}
	stale.DataDir = oldDir + ".empty"
	if err := c.StartMaster(stale); err != nil {
		t.Fatal(err)
	}
	// A follower shows its last refusal of the stale master for two
	// minutes unless a handshake with the empty one ends it: wait longer.
	testutil.Eventually(t, 3*converge, "the cluster to be healthy with the master back", func() error {
		rep, err := clusterStatus()
		if err != nil {
			return err
		}
		if !rep.Healthy {
			return fmt.Errorf("problems %q", rep.Problems)
		}
		st, err := statusOf(stale)
		if err != nil {
			return err
		}
		if ids := agentsOf(st); !slices.Contains(ids, "new-3") || slices.Contains(ids, "old-1") {
			return fmt.Errorf("%s serves agents %v, want new-3 and no old-1", stale.ID, ids)
		}
		return nil
	})
}
