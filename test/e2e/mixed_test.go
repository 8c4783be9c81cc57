package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/dockerlab"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestMixedContainers is the DC/OS design's own example: a Docker container
// (a real dockerd on host 2, the agent's Docker network for the overlay,
// named after it as DC/OS names it, with carve's IPAM plugin) and a CNI
// container on host 1's m-<overlay> (the reference bridge plugin with
// carve-ipam, as a runtime attaches it) ping each other both ways through
// the overlay. It skips only when dockerd cannot run on this machine (and
// fails then under CI: testutil.Require).
func TestMixedContainers(t *testing.T) {
	_, err := dockerlab.Binaries()
	testutil.Require(t, err == nil, "no Docker engine to run (deploy/install-deps.sh installs it): %v", err)
	_, err = enginelab.StaticBusybox()
	testutil.Require(t, err == nil, "no image for the Docker container: %v", err)
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix, DockerBridge: true})
	ctx := within(t, 3*converge)
	const overlay = "carve"
	h1, h2 := c.Host(1), c.Host(2)

	// The engine first: an agent that found none tries again only every 30s.
	eng, err := c.StartDocker(ctx, h2)
	testutil.Require(t, !errors.Is(err, dockerlab.ErrCannotRun), "dockerd cannot run on this machine: %v", err)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}

	// The Docker network is the overlay's name, on the bridge d-<overlay>.
	dc, err := c.RunDockerContainer(ctx, h2, eng, overlay)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.AgentClient(h2).Overlay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ov := info.Overlay(overlay)
	if ov == nil || ov.DockerBridge == nil || ov.DockerBridge.Name != "d-"+overlay {
		t.Fatalf("host 2's agent reports no docker bridge d-%s: %+v", overlay, info)
	}
	dockerRange := netip.MustParsePrefix(ov.DockerBridge.IP)
	if err := inBridge(dc.Addr, dockerRange); err != nil {
		t.Fatalf("Docker container %.12s: %v", dc.ID, err)
	}
	if dc.Gateway != dockerRange.Masked().Addr().Next() {
		t.Errorf("Docker container gateway %s, want the bridge's %s", dc.Gateway, dockerRange.Masked().Addr().Next())
	}
	held := false
	list, err := c.IPAMClient(h2).List(ctx, overlay)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list.Allocations {
		for _, ip := range a.IPs {
			if p, err := netip.ParsePrefix(ip.Address); err == nil && p.Addr() == dc.Addr.Addr() && a.Bridge == "docker" {
				held = true
			}
		}
	}
	if !held {
		t.Errorf("host 2's IPAM does not hold the Docker container's %s: %+v", dc.Addr, list.Allocations)
	}

	ct, err := c.AddCNIContainer(ctx, h1, overlay, labcluster.CNIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Docker container %.12s on %s (network %s) at %s; CNI container %s on %s at %s", dc.ID, h2.Name, overlay, dc.Addr, ct.Name, h1.Name, ct.Addr)

	if err := ct.NS.PingRetry(ctx, dc.Addr.Addr(), 20); err != nil {
		t.Errorf("CNI container on %s -> Docker container on %s: %v", h1.Name, h2.Name, err)
	}
	if err := dc.Ping(ctx, ct.Addr.Addr(), 20); err != nil {
		t.Errorf("Docker container on %s -> CNI container on %s: %v", h2.Name, h1.Name, err)
	}

	// The operator's view: the Docker container is its address's owner,
	// found by its id as `docker ps` prints it (the agent learns it from
	// the engine once the endpoint exists), and carve ipam check compares
	// the allocations with the engine's running containers: clean.
	testutil.Eventually(t, converge, "carve ipam show --owner finds the Docker container", func() error {
		args := append([]string{"ipam", "show", "--json", "--owner", dc.ID[:12], "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
		out, err := c.RunCarve(ctx, h1, args...)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		var rep struct {
			Holders []struct {
				Owner *api.Owner `json:"owner"`
				IPs   []api.IPConfig
			} `json:"holders"`
		}
		if err := json.Unmarshal(out, &rep); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if len(rep.Holders) == 0 || rep.Holders[0].Owner == nil || rep.Holders[0].Owner.ContainerID != dc.ID || rep.Holders[0].Owner.ContainerName == "" {
			return fmt.Errorf("holders %s", out)
		}
		return nil
	})
	if rep, code := ipamCheck(ctx, t, c); code != 0 || !rep.Clean {
		t.Errorf("carve ipam check with a Docker container: exit %d, problems %+v; want clean", code, rep.Problems)
	}
}
