// Package e2e holds the end-to-end tests of carve (issues 4 and 5): real
// `carve master` and `carve agent` processes in network namespaces,
// containers attached to the agents' bridges through CNI (the agent's
// conflist, the reference bridge plugin, carve-ipam), and pings through the
// VXLAN overlay. They need root and skip without it.
//
// Every test runs its own lab cluster (its namespaces named apart by
// netnslab), so the tests of carve alone run in parallel (t.Parallel; at
// most -parallel at once: `make test` gives them four): most of their time
// is spent waiting on the cluster. The tests that run real engines
// (TestEngines, TestMixedContainers, TestCritest) stay serial.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
	"github.com/vishvananda/netlink"
)

// prefix names this package's namespaces, so that a killed run's leftovers
// are found and removed by the next one.
const prefix = "carvee2e"

// TestMain runs the tests, or one go-cni call when the test binary is the
// Nomad-like client of TestEngines (goCNIClientEnv).
func TestMain(m *testing.M) {
	if os.Getenv(goCNIClientEnv) != "" {
		os.Exit(goCNIClient())
	}
	os.Exit(labcluster.RunTests(m, prefix))
}

// converge bounds every wait for the cluster to settle. It is a deadline,
// not a measurement: a healthy cluster settles in a few seconds.
const converge = 60 * time.Second

func within(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// register registers an agent record as an agent would: again while the
// masters answer 503 (no leader, or a write whose outcome an election left
// unknown: a registration repeated is the same record), for up to
// converge. On a loaded machine the masters elect again now and then; any
// other error fails at once.
func register(ctx context.Context, t *testing.T, c *labcluster.Cluster, req api.RegisterRequest) *api.AgentInfo {
	t.Helper()
	var info *api.AgentInfo
	testutil.Eventually(t, converge, "register "+req.AgentID, func() error {
		var err error
		info, err = c.Client().Register(ctx, req)
		if err != nil && !api.IsCode(err, api.CodeNoLeader) && !api.IsCode(err, api.CodeUnavailable) {
			return retry.Permanent(err)
		}
		return err
	})
	return info
}

// TestOverlay is issue 4's end-to-end scenario on four hosts: masters on
// hosts 1-3 (co-located with agents), an agent on every host, a container
// per host on m-carve.
//
//  1. Every container pings every container on the other hosts, and every
//     host's kernel holds exactly the other agents' neighbour, FDB entry and
//     route.
//  2. An agent deleted at the masters (its process stopped first, so that it
//     does not register again) disappears from every other kernel; started
//     again, it registers again and is programmed everywhere.
//  3. An agent whose host changes its underlay IP (host 4: it runs no master,
//     whose Raft address is fixed) is followed by every other host's FDB
//     entry for its VTEP MAC; the pings still pass.
//  4. With every master stopped, an agent killed with SIGKILL, whose VTEP is
//     then deleted, and started again programs everything back from its
//     persisted state, its peers keep it programmed, and the pings still pass.
func TestOverlay(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 4, Masters: 3, Prefix: prefix})
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	var containers []*labcluster.Container

	step("converge and ping", func(t *testing.T) {
		ctx := within(t, converge)
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		containers = containerPerHost(ctx, t, c)
		waitKernelMatchesMasters(ctx, t, c)
		pingAll(ctx, t, containers)
	})

	step("delete an agent", func(t *testing.T) {
		ctx := within(t, converge)
		h := c.Host(3)
		id := h.AgentID()
		gone := entriesAtMasters(ctx, t, c, id)
		if err := c.StopAgent(ctx, h); err != nil {
			t.Fatal(err)
		}
		if err := c.Client().DeleteAgent(ctx, id); err != nil {
			t.Fatal(err)
		}
		for _, o := range others(c, h) {
			err := retry.Until(ctx, 100*time.Millisecond, func() error {
				ks, err := c.Kernel(o)
				if err != nil {
					return err
				}
				if err := ks.LacksPeer(gone); err != nil {
					return err
				}
				peers, err := c.AgentClient(o).Peers(ctx)
				if err != nil {
					return err
				}
				for _, p := range peers.Peers {
					if p.AgentID == id {
						return fmt.Errorf("peers of %s still list %s", o.Name, id)
					}
				}
				if !slices.ContainsFunc(peers.Tombstones, func(tb api.Tombstone) bool { return tb.AgentID == id }) {
					return fmt.Errorf("peers of %s lack the tombstone of %s", o.Name, id)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%s after deleting %s (%s): %v", o.Name, id, h.Name, err)
			}
			// The agents follow the masters' changes, not whole states.
			if n := changesRead(ctx, t, c, o); n == 0 {
				t.Errorf("%s read no changes from the masters (carve_agent_master_reads_total{kind=\"changes\"} is 0)", o.Name)
			}
		}

		// Started again with its data dir, it keeps its id, registers again
		// (the masters lift the tombstone) and is programmed everywhere.
		if err := c.StartAgent(h); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitConverged(ctx); err != nil {
			t.Fatal(err)
		}
		if h.AgentID() != id {
			t.Fatalf("agent on %s came back as %s, want its persisted id %s", h.Name, h.AgentID(), id)
		}
		back := entriesAtMasters(ctx, t, c, id)
		if ct := containers[h.Index-1]; !slices.ContainsFunc(back.Subnets, func(p netip.Prefix) bool { return p.Contains(ct.Addr.Addr()) }) {
			// First fit gives the freed subnet back; if it did not, the
			// container needs an address in the new one.
			t.Logf("%s got subnets %v, not the old one of %s: new container", h.Name, back.Subnets, ct.Addr)
			nc, err := c.AddCNIContainer(ctx, h, "carve", labcluster.CNIOptions{})
			if err != nil {
				t.Fatal(err)
			}
			containers[h.Index-1] = nc
		}
		waitKernelMatchesMasters(ctx, t, c)
		pingAll(ctx, t, containers)
	})

	step("change an agent's underlay IP", func(t *testing.T) {
		ctx := within(t, converge)
		h := c.Host(4)
		id := h.AgentID()
		before := entriesAtMasters(ctx, t, c, id)
		newIP := netip.MustParsePrefix("198.18.1.14/15")
		if err := c.StopAgent(ctx, h); err != nil {
			t.Fatal(err)
		}
		if err := c.SetUnderlayIP(h, newIP); err != nil {
			t.Fatal(err)
		}
		if err := c.StartAgent(h); err != nil {
			t.Fatal(err)
		}
		if h.Agent.Args()[slices.Index(h.Agent.Args(), "--ip")+1] != newIP.Addr().String() {
			t.Fatalf("agent restarted with %v, want --ip %s", h.Agent.Args(), newIP.Addr())
		}
		for _, o := range others(c, h) {
			err := retry.Until(ctx, 100*time.Millisecond, func() error {
				ks, err := c.Kernel(o)
				if err != nil {
					return err
				}
				if got := ks.FDB[before.VTEPMAC]; len(got) != 1 || got[0] != newIP.Addr() {
					return fmt.Errorf("fdb %s -> %v, want [%s]", before.VTEPMAC, got, newIP.Addr())
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%s does not follow %s to its new IP: %v", o.Name, h.Name, err)
			}
		}
		if err := c.WaitConverged(ctx); err != nil {
			t.Fatal(err)
		}
		after := entriesAtMasters(ctx, t, c, id)
		if after.UnderlayIP != newIP.Addr() || after.VTEPMAC != before.VTEPMAC || after.VTEPIP != before.VTEPIP {
			t.Fatalf("masters' record after the move: %+v, want ip %s and the same VTEP %s %s", after, newIP.Addr(), before.VTEPIP, before.VTEPMAC)
		}
		waitKernelMatchesMasters(ctx, t, c)
		pingAll(ctx, t, containers)
	})

	step("every master down, an agent restarted", func(t *testing.T) {
		ctx := within(t, converge)
		st, err := c.State(ctx) // the last word of the masters, to compare kernels with
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range c.Masters() {
			if err := c.StopMaster(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		h := c.Host(4)
		id := h.AgentID()
		if err := c.KillAgent(h); err != nil {
			t.Fatal(err)
		}
		// Without its VTEP (and with it every neighbour, FDB entry and
		// route), what the agent programs can only come from its disk.
		deleteVTEP(t, c, h)
		if err := c.StartAgent(h); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitAgent(ctx, h); err != nil {
			t.Fatal(err)
		}
		if h.AgentID() != id {
			t.Fatalf("agent on %s restarted as %s, want %s", h.Name, h.AgentID(), id)
		}
		if err := c.WaitConverged(ctx); err != nil {
			t.Fatal(err)
		}
		err = retry.Until(ctx, 100*time.Millisecond, func() error {
			p, err := c.AgentClient(h).Peers(ctx)
			if err != nil {
				return err
			}
			if p.MastersReachable {
				return fmt.Errorf("agent on %s reports the masters reachable", h.Name)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, hh := range c.Hosts() {
			ks, err := c.Kernel(hh)
			if err != nil {
				t.Fatal(err)
			}
			if err := matches(ks, st, hh.AgentID()); err != nil {
				t.Fatalf("%s: %v\n%s", hh.Name, err, ks)
			}
		}
		pingAll(ctx, t, containers)
	})
}

// deleteLink deletes a device of h, as an operator's mistake or a crash would.
func deleteLink(t *testing.T, h *labcluster.Host, name string) {
	t.Helper()
	nh, err := netlink.NewHandleAt(h.NS.NsHandle())
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	l, err := nh.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkDel(l); err != nil {
		t.Fatal(err)
	}
}

// deleteVTEP deletes h's VTEP device, which takes carve's neighbours, FDB
// entries and routes on it along.
func deleteVTEP(t *testing.T, c *labcluster.Cluster, h *labcluster.Host) {
	t.Helper()
	deleteLink(t, h, c.Network().VTEPName)
	ks, err := c.Kernel(h)
	if err != nil {
		t.Fatal(err)
	}
	if ks.VTEP != nil || len(ks.Routes) > 0 {
		t.Fatalf("%s after deleting its VTEP:\n%s", h.Name, ks)
	}
}

// containerPerHost attaches a container to overlay "carve" on every host.
func containerPerHost(ctx context.Context, t *testing.T, c *labcluster.Cluster) []*labcluster.Container {
	t.Helper()
	var out []*labcluster.Container
	for _, h := range c.Hosts() {
		ct, err := c.AddCNIContainer(ctx, h, "carve", labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ct)
	}
	return out
}

// others are the hosts other than h.
func others(c *labcluster.Cluster, h *labcluster.Host) []*labcluster.Host {
	var out []*labcluster.Host
	for _, o := range c.Hosts() {
		if o != h {
			out = append(out, o)
		}
	}
	return out
}

// entriesAtMasters is the kernel entries that the masters' record of id asks
// the other hosts for.
func entriesAtMasters(ctx context.Context, t *testing.T, c *labcluster.Cluster, id string) labcluster.PeerEntries {
	t.Helper()
	a, err := c.Client().Agent(ctx, id)
	if err != nil {
		t.Fatalf("agent %s at the masters: %v", id, err)
	}
	pe, err := labcluster.EntriesOf(*a)
	if err != nil {
		t.Fatal(err)
	}
	return pe
}

// matches returns nil when ks holds exactly the entries of every agent of st
// but self: each one's neighbour, FDB entry and routes, and nothing else.
func matches(ks *labcluster.KernelState, st *api.State, self string) error {
	var probs []string
	neigh, fdb, routes := 0, 0, 0
	for _, a := range st.Agents {
		if a.AgentID == self || a.IP == "" {
			continue
		}
		pe, err := labcluster.EntriesOf(a)
		if err != nil {
			return err
		}
		if err := ks.HasPeer(pe); err != nil {
			probs = append(probs, err.Error())
		}
		neigh, fdb, routes = neigh+1, fdb+1, routes+len(pe.Subnets)
	}
	if len(ks.Neighbours) != neigh || len(ks.FDB) != fdb || len(ks.Routes) != routes {
		probs = append(probs, fmt.Sprintf("%d neighbours, %d fdb entries, %d routes; want %d, %d, %d",
			len(ks.Neighbours), len(ks.FDB), len(ks.Routes), neigh, fdb, routes))
	}
	if len(probs) > 0 {
		return fmt.Errorf("kernel differs from the masters' state: %s", strings.Join(probs, "; "))
	}
	return nil
}

// waitKernelMatchesMasters waits until every host's kernel holds exactly
// the other agents' entries as the masters have them.
func waitKernelMatchesMasters(ctx context.Context, t *testing.T, c *labcluster.Cluster) {
	t.Helper()
	waitKernelsMatch(ctx, t, c, c.Hosts()...)
}

// waitKernelsMatch is waitKernelMatchesMasters on the hosts given.
func waitKernelsMatch(ctx context.Context, t *testing.T, c *labcluster.Cluster, hosts ...*labcluster.Host) {
	t.Helper()
	for _, h := range hosts {
		err := retry.Until(ctx, 100*time.Millisecond, func() error {
			st, err := c.State(ctx)
			if err != nil {
				return err
			}
			ks, err := c.Kernel(h)
			if err != nil {
				return err
			}
			return matches(ks, st, h.AgentID())
		})
		if err != nil {
			ks, _ := c.Kernel(h)
			t.Fatalf("%s: %v\n%s", h.Name, err, ks)
		}
	}
}

// pingAll runs the ping matrix and fails with the table when a pair fails.
func pingAll(ctx context.Context, t *testing.T, cs []*labcluster.Container) {
	t.Helper()
	m := labcluster.Ping(ctx, cs)
	if err := m.Err(); err != nil {
		t.Fatalf("%v\n%s", err, m)
	}
	t.Logf("ping matrix:\n%s", m)
}

// changesRead is how many changes answers of the masters h's agent read
// (its carve_agent_master_reads_total{kind="changes"}).
func changesRead(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.AgentURL()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.HTTPClient().Do(req)
	if err != nil {
		t.Fatalf("metrics of %s: %v", h.Name, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("metrics of %s: %v", h.Name, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, `carve_agent_master_reads_total{kind="changes"} `); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metrics of %s: %q: %v", h.Name, line, err)
			}
			return n
		}
	}
	t.Fatalf("metrics of %s lack carve_agent_master_reads_total{kind=\"changes\"}", h.Name)
	return 0
}
