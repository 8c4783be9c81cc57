package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// checkReport is what `carve ipam check --json` prints.
type checkReport struct {
	Index       uint64 `json:"index"`
	Agents      int    `json:"agents"`
	Allocations int    `json:"allocations"`
	Clean       bool   `json:"clean"`
	Problems    []struct {
		Kind    string `json:"kind"`
		Network string `json:"network"`
		Address string `json:"address"`
		Holders []struct {
			AgentID     string `json:"agent_id"`
			ContainerID string `json:"container_id"`
			IfName      string `json:"ifname"`
		} `json:"holders"`
		Detail string `json:"detail"`
	} `json:"problems"`
}

// holders names a problem's holders as agent/container.
func (r *checkReport) find(kind, address string) []string {
	for _, p := range r.Problems {
		if p.Kind != kind || p.Address != address {
			continue
		}
		var out []string
		for _, h := range p.Holders {
			out = append(out, h.AgentID+"/"+h.ContainerID)
		}
		slices.Sort(out)
		return out
	}
	return nil
}

// ipamCheck runs the real `carve ipam check --json` from host 1, as an
// operator, and returns its report and exit code.
func ipamCheck(ctx context.Context, t *testing.T, c *labcluster.Cluster) (*checkReport, int) {
	t.Helper()
	args := append([]string{"ipam", "check", "--json", "--settle", "1s", "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
	out, err := c.RunCarve(ctx, c.Host(1), args...)
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	var rep checkReport
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		t.Fatalf("carve ipam check printed no JSON report (%v; exit %d: %v):\n%s", jerr, code, err, out)
	}
	t.Logf("carve ipam check: exit %d, %d allocations on %d agents, %d problems: %s", code, rep.Allocations, rep.Agents, len(rep.Problems), out)
	return &rep, code
}

// checkIPAMAfterChurn is `carve ipam check` after the CNI churn: it reports
// the cluster clean, then the leak and the duplicate this injects, each
// naming the address, the agent and the container.
//
// The leak is an allocation made through host 2's IPAM socket for a
// container no CNI runtime ever attached (an ADD whose runtime died before
// caching the result): no entry in the host's CNI cache.
//
// The duplicate is an agent restarted on a data dir that holds an address
// another agent hands out, as after restoring a backup or cloning a host:
// host 3's agent is stopped, an allocation of live container's address on
// host 1 is written into its store (agent.db, the IPAM's allocation bucket,
// the record the agent itself writes), and the agent is started again.
func checkIPAMAfterChurn(ctx context.Context, t *testing.T, c *labcluster.Cluster, overlay string, live []*labcluster.Container) {
	t.Helper()
	rep, code := ipamCheck(ctx, t, c)
	if code != 0 || !rep.Clean || len(rep.Problems) != 0 {
		t.Fatalf("after the churn: exit %d, clean %v, problems %+v; want a clean cluster", code, rep.Clean, rep.Problems)
	}
	if rep.Agents != len(c.Hosts()) || rep.Allocations != len(live) {
		t.Errorf("checked %d allocations on %d agents, want the %d live ones on %d", rep.Allocations, rep.Agents, len(live), len(c.Hosts()))
	}

	// The leak.
	h2 := c.Host(2)
	leak, err := c.IPAMClient(h2).Allocate(ctx, api.IPAMRequest{Network: overlay, ContainerID: "leaked-e2e", IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	leakAddr := strings.Split(leak.IPs[0].Address, "/")[0]
	rep, code = ipamCheck(ctx, t, c)
	if want := []string{h2.AgentID() + "/leaked-e2e"}; code == 0 || rep.Clean || !slices.Equal(rep.find("leak", leakAddr), want) {
		t.Errorf("with a leak: exit %d, clean %v, leak of %s held by %v; want a non-zero exit and the leak held by %v", code, rep.Clean, leakAddr, rep.find("leak", leakAddr), want)
	}

	// The duplicate.
	victim := live[0]
	h3 := c.Host(3)
	if err := c.StopAgent(ctx, h3); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(h3.AgentDataDir, "agent.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("ipam-allocations"))
		if b == nil {
			return errors.New("no ipam-allocations bucket in host 3's store")
		}
		rec := fmt.Sprintf(`{"bridge":"mesos","v4":%q}`, victim.Addr.Addr())
		return b.Put([]byte(overlay+"\x00dup-e2e\x00eth0"), []byte(rec))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("write host 3's store: %v", err)
	}
	if err := c.StartAgent(h3); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitAgent(ctx, h3); err != nil {
		t.Fatal(err)
	}
	addr := victim.Addr.Addr().String()
	want := []string{h3.AgentID() + "/dup-e2e", victim.Host.AgentID() + "/" + victim.ContainerID}
	slices.Sort(want)
	rep, code = ipamCheck(ctx, t, c)
	if code == 0 || rep.Clean || !slices.Equal(rep.find("duplicate", addr), want) {
		t.Errorf("with a duplicate: exit %d, clean %v, %s held by %v; want a non-zero exit and %s held by %v", code, rep.Clean, addr, rep.find("duplicate", addr), addr, want)
	}
	if got := rep.find("leak", leakAddr); len(got) != 1 {
		t.Errorf("the leak is no longer reported: %+v", rep.Problems)
	}

	// Cleaned up, the cluster is clean again.
	if _, err := c.IPAMClient(h2).Release(ctx, api.IPAMRequest{Network: overlay, ContainerID: "leaked-e2e", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.IPAMClient(h3).Release(ctx, api.IPAMRequest{Network: overlay, ContainerID: "dup-e2e", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if rep, code = ipamCheck(ctx, t, c); code != 0 || !rep.Clean {
		t.Errorf("after releasing both: exit %d, problems %+v", code, rep.Problems)
	}
}
