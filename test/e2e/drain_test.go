package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestOverlayDrain is issue 20's finding 4 on real agents and CNI
// containers: disabling an overlay drains it.
//
//  1. Containers on two hosts on the overlay "extra" (and on "carve",
//     which stays) ping each other.
//  2. "extra" is disabled (the masters restarted with "enabled": false):
//     a new ADD on it is refused, the attached containers keep pinging,
//     their bridges and conflists stay.
//  3. The containers leave one host at a time, through the runtime's DEL
//     (which reads the conflist): each DEL works, and a host whose last
//     container left loses the bridge and the conflist; "carve" keeps
//     pinging throughout; carve ipam check is clean.
//  4. "extra" enabled again: new containers attach and ping.
//  5. Its bridge deleted under a live container (the agent puts the bridge
//     back, without the container's veth): carve ipam check reports the
//     container detached.
func TestOverlayDrain(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	const extra = "extra"
	netCfg := netconfig.Default()
	netCfg.Overlays = append(netCfg.Overlays, api.OverlayNetwork{Name: extra, Subnet: "10.64.0.0/16", Prefix: 24})
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix, Network: &netCfg})
	h1, h2 := c.Host(1), c.Host(2)
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	add := func(ctx context.Context, t *testing.T, h *labcluster.Host, overlay string) *labcluster.Container {
		t.Helper()
		ct, err := c.AddCNIContainer(ctx, h, overlay, labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return ct
	}
	ping := func(ctx context.Context, t *testing.T, cs ...*labcluster.Container) {
		t.Helper()
		if m := labcluster.Ping(ctx, cs); !m.OK() {
			t.Fatalf("ping: %v", m.Err())
		}
	}
	var x1, x2, k1, k2, y *labcluster.Container
	step("containers on two overlays ping", func(t *testing.T) {
		ctx := within(t, converge)
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		x1, x2 = add(ctx, t, h1, extra), add(ctx, t, h2, extra)
		k1, k2 = add(ctx, t, h1, "carve"), add(ctx, t, h2, "carve")
		ping(ctx, t, x1, x2)
		ping(ctx, t, k1, k2)
	})
	step("disabled, it drains", func(t *testing.T) {
		ctx := within(t, 2*converge)
		setEnabled(ctx, t, c, extra, false)
		testutil.Eventually(t, converge, "a new ADD on the disabled overlay is refused", func() error {
			ct, err := c.AddCNIContainer(ctx, h1, extra, labcluster.CNIOptions{})
			if err == nil {
				_ = c.DelCNIContainer(ctx, ct)
				return fmt.Errorf("ADD on %s succeeded", extra)
			}
			t.Logf("ADD refused: %v", err)
			return nil
		})
		ping(ctx, t, x1, x2)
		for _, h := range []*labcluster.Host{h1, h2} {
			requireBridge(t, h, "m-"+extra, true)
			if _, err := c.Conflist(h, extra); err != nil {
				t.Errorf("%s: %v", h.Name, err)
			}
		}
	})
	step("the last container leaves, the overlay goes", func(t *testing.T) {
		ctx := within(t, 2*converge)
		if err := c.DelCNIContainer(ctx, x2); err != nil {
			t.Fatalf("DEL on a draining overlay: %v", err)
		}
		waitGone(t, c, h2, extra)
		requireBridge(t, h1, "m-"+extra, true) // x1 is still attached on h1
		if _, err := c.Conflist(h1, extra); err != nil {
			t.Error(err)
		}
		if err := c.DelCNIContainer(ctx, x1); err != nil {
			t.Fatalf("DEL on a draining overlay: %v", err)
		}
		waitGone(t, c, h1, extra)
		ping(ctx, t, k1, k2)
		// Drained as asked, not failed (issue 27, item 7): every host
		// reports the disabled overlay OK.
		testutil.Eventually(t, converge, "every host reports the drained overlay OK", func() error {
			st, err := c.State(ctx)
			if err != nil {
				return err
			}
			for _, a := range st.Agents {
				if ov := a.Overlay(extra); ov != nil && ov.State.Status != api.StatusOK {
					return fmt.Errorf("%s reports %s %s: %s", a.AgentID, extra, ov.State.Status, ov.State.Error)
				}
			}
			return nil
		})
		if rep, code := ipamCheck(ctx, t, c); code != 0 || len(rep.Problems) != 0 {
			t.Errorf("carve ipam check after the drain: exit %d, problems %+v", code, rep.Problems)
		}
	})
	step("enabled again, it serves", func(t *testing.T) {
		ctx := within(t, 2*converge)
		setEnabled(ctx, t, c, extra, true)
		var y1, y2 *labcluster.Container
		testutil.Eventually(t, converge, "ADD on the overlay enabled again", func() error {
			var err error
			if y1 == nil {
				if y1, err = c.AddCNIContainer(ctx, h1, extra, labcluster.CNIOptions{}); err != nil {
					y1 = nil
					return err
				}
			}
			if y2 == nil {
				if y2, err = c.AddCNIContainer(ctx, h2, extra, labcluster.CNIOptions{}); err != nil {
					y2 = nil
					return err
				}
			}
			return nil
		})
		ping(ctx, t, y1, y2)
		ping(ctx, t, k1, k2)
		y = y1
	})
	step("a bridge removed under a container is reported", func(t *testing.T) {
		ctx := within(t, 2*converge)
		deleteLink(t, h1, "m-"+extra)
		testutil.Eventually(t, converge, "carve ipam check reports the detached container", func() error {
			rep, code := ipamCheck(ctx, t, c)
			for _, p := range rep.Problems {
				if p.Kind == "detached" && len(p.Holders) == 1 && p.Holders[0].ContainerID == y.ContainerID {
					return nil
				}
			}
			return fmt.Errorf("exit %d, problems %+v", code, rep.Problems)
		})
	})
}

// setEnabled changes the masters' network configuration to overlay
// enabled or not with carve config apply, as an operator does.
func setEnabled(ctx context.Context, t *testing.T, c *labcluster.Cluster, overlay string, enabled bool) {
	t.Helper()
	cfg := c.Network()
	for i := range cfg.Overlays {
		if cfg.Overlays[i].Name == overlay {
			cfg.Overlays[i].Enabled = &enabled
		}
	}
	if err := c.ApplyConfig(ctx, c.Host(1), cfg); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, converge, fmt.Sprintf("the masters' configuration has %s enabled=%v", overlay, enabled), func() error {
		st, err := c.State(ctx)
		if err != nil {
			return err
		}
		for _, o := range st.Network.Overlays {
			if o.Name == overlay && o.IsEnabled() == enabled {
				return nil
			}
		}
		return fmt.Errorf("not yet")
	})
}

// requireBridge checks that h has (or has not) the bridge.
func requireBridge(t *testing.T, h *labcluster.Host, name string, want bool) {
	t.Helper()
	if got := hasLink(t, h, name); got != want {
		t.Errorf("%s: bridge %s present %v, want %v", h.Name, name, got, want)
	}
}

func hasLink(t *testing.T, h *labcluster.Host, name string) bool {
	t.Helper()
	nh, err := netlink.NewHandleAt(h.NS.NsHandle())
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	_, err = nh.LinkByName(name)
	return err == nil
}

// waitGone waits until h has neither the overlay's bridge nor its conflist.
func waitGone(t *testing.T, c *labcluster.Cluster, h *labcluster.Host, overlay string) {
	t.Helper()
	testutil.Eventually(t, converge, fmt.Sprintf("%s drops the bridge and the conflist of %s", h.Name, overlay), func() error {
		if hasLink(t, h, "m-"+overlay) {
			return fmt.Errorf("m-%s still there", overlay)
		}
		if _, err := c.Conflist(h, overlay); err == nil {
			return fmt.Errorf("the conflist of %s still there", overlay)
		}
		return nil
	})
}
