package cni

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// The tests run carve-ipam against a real carve agent: one host of a lab
// cluster (real `carve master` and `carve agent` processes in network
// namespaces), whose IPAM socket is a file the tests reach directly.

// The overlays of the tests' agents. The masters lease the lowest free
// slice, so the one agent of a test gets the first of each: ov 10.1.0.0/24
// (mesos bridge 10.1.0.0/25, gateway 10.1.0.1, first container 10.1.0.2),
// tiny 10.2.0.0/28 of 10.2.0.0/27 (mesos bridge 10.2.0.0/29: five container
// addresses; fillTiny leases the other slice, so tiny cannot grow),
// and other, to check that one overlay's calls leave another alone.
var (
	ovMesos   = netip.MustParsePrefix("10.1.0.0/25")
	tinyMesos = netip.MustParsePrefix("10.2.0.0/29")
)

func testNetwork() *api.NetworkConfig {
	cfg := netconfig.Default()
	cfg.Overlays = []api.OverlayNetwork{
		{Name: "ov", Subnet: "10.1.0.0/16", Prefix: 24},
		{Name: "tiny", Subnet: "10.2.0.0/27", Prefix: 28},
		{Name: "other", Subnet: "10.9.0.0/16", Prefix: 24},
	}
	return &cfg
}

// testAgent is the agent of a one-host lab cluster.
type testAgent struct {
	c    *labcluster.Cluster
	h    *labcluster.Host
	Sock string // its IPAM socket
	ipam *api.IPAMClient
}

// startAgent starts a one-host cluster. With ready, it waits until the
// agent holds its leases (and checks they are the ones the tests expect);
// without, only the agent runs, serving its IPAM socket without a lease,
// until StartMasters.
func startAgent(t *testing.T, ready bool) *testAgent {
	t.Helper()
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 1, Masters: 1, Prefix: labPrefix, Network: testNetwork()})
	a := &testAgent{c: c, h: c.Host(1)}
	a.Sock = a.h.SocketPath()
	a.ipam = c.IPAMClient(a.h)
	if !ready {
		if err := c.StartAgent(a.h); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 0, "the agent's IPAM socket", func() error {
			_, err := a.ipam.Status(bounded(t), "ov")
			if errors.Is(err, api.ErrAgentUnreachable) {
				return err
			}
			return nil
		})
		return a
	}
	if err := c.Start(bounded(t)); err != nil {
		t.Fatal(err)
	}
	a.checkLeases(t)
	return a
}

// fillTiny registers a second (synthetic) agent, which the masters lease
// the rest of tiny: the overlay is then wholly leased, and a full bridge
// cannot grow there (the synthetic agent answers no space request).
func (a *testAgent) fillTiny(t *testing.T) {
	t.Helper()
	info, err := a.c.Client().Register(bounded(t), api.RegisterRequest{AgentID: "filler", IP: "198.18.9.9", NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}})
	if err != nil {
		t.Fatal(err)
	}
	if ov := info.Overlay("tiny"); ov == nil || ov.Subnet != "10.2.0.16/28" {
		t.Fatalf("the filler agent's tiny lease: %+v", info)
	}
}

// StartMasters starts the master and waits until the agent is ready.
func (a *testAgent) StartMasters(t *testing.T) {
	t.Helper()
	if err := a.c.StartMasters(bounded(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.WaitAgent(bounded(t), a.h); err != nil {
		t.Fatal(err)
	}
	a.checkLeases(t)
}

// Stop stops the agent (SIGTERM): its socket goes, its allocations stay on
// disk.
func (a *testAgent) Stop(t *testing.T) {
	t.Helper()
	if err := a.c.StopAgent(bounded(t), a.h); err != nil {
		t.Fatal(err)
	}
}

// Start starts the agent again and waits until it is ready.
func (a *testAgent) Start(t *testing.T) {
	t.Helper()
	if err := a.c.StartAgent(a.h); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.WaitAgent(bounded(t), a.h); err != nil {
		t.Fatal(err)
	}
}

// checkLeases fails the test unless the agent's mesos bridges are the ones
// the tests' addresses are written for.
func (a *testAgent) checkLeases(t *testing.T) {
	t.Helper()
	info, err := a.c.AgentClient(a.h).Overlay(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]netip.Prefix{"ov": ovMesos, "tiny": tinyMesos} {
		ov := info.Overlay(name)
		if ov == nil || ov.MesosBridge == nil {
			t.Fatalf("the agent has no mesos bridge on %s: %+v", name, ov)
		}
		if got, err := netip.ParsePrefix(ov.MesosBridge.IP); err != nil || got.Masked() != want {
			t.Fatalf("the agent's mesos bridge on %s is %q, the tests expect %s", name, ov.MesosBridge.IP, want)
		}
	}
}

// Keys returns "cid/ifname" of every allocation the agent holds on the
// network, sorted.
func (a *testAgent) Keys(t *testing.T, network string) []string {
	t.Helper()
	list, err := a.ipam.List(bounded(t), network)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, al := range list.Allocations {
		out = append(out, al.ContainerID+"/"+al.IfName)
	}
	slices.Sort(out)
	return out
}
