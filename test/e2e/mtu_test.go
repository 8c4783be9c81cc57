package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
	"golang.org/x/sys/unix"
)

// TestMTUFollowsTheUnderlay is issue 21's MTU scenario, with no MTU in the
// network configuration:
//
//  1. On a 9000-byte underlay the VTEPs, bridges, conflists and containers
//     get 8950 (9000 less VXLAN over IPv4's 50 bytes); a container's ping
//     across hosts of the largest size with Don't Fragment passes, and one
//     byte more fails at once with "message too long" (not a silent drop).
//  2. A third host whose underlay is 1500 bytes joins: every host agrees on
//     1450, its VTEP, bridge and conflist follow, a new container gets it and
//     its largest DF ping across hosts passes, one byte more fails the same
//     way, and the ping from a container of the first phase (its interface
//     still 8950) reaches the new host's container by path MTU discovery.
func TestMTUFollowsTheUnderlay(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 1, Prefix: prefix, UnderlayMTU: 9000})
	h1, h2, h3 := c.Host(1), c.Host(2), c.Host(3)
	if err := c.Lab.SetUnderlayMTU(h3.NS, 1500); err != nil {
		t.Fatal(err)
	}
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	var c1, c2 *labcluster.Container

	step("9000-byte underlay", func(t *testing.T) {
		ctx := within(t, converge)
		if err := c.StartMasters(ctx); err != nil {
			t.Fatal(err)
		}
		for _, h := range []*labcluster.Host{h1, h2} {
			if err := c.StartAgent(h); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.WaitConverged(ctx); err != nil {
			t.Fatal(err)
		}
		waitMTUs(ctx, t, c, 8950, h1, h2)
		var err error
		if c1, err = c.AddCNIContainer(ctx, h1, "carve", labcluster.CNIOptions{}); err != nil {
			t.Fatal(err)
		}
		if c2, err = c.AddCNIContainer(ctx, h2, "carve", labcluster.CNIOptions{}); err != nil {
			t.Fatal(err)
		}
		checkLinkMTU(t, c1.NS.Namespace, netnslab.ContainerLink, 8950)
		checkPathMTU(ctx, t, c1, c2, 8950)
	})

	step("a host with a 1500-byte underlay joins", func(t *testing.T) {
		ctx := within(t, converge)
		if err := c.StartAgent(h3); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitConverged(ctx); err != nil {
			t.Fatal(err)
		}
		waitMTUs(ctx, t, c, 1450, h1, h2, h3)
		c3, err := c.AddCNIContainer(ctx, h3, "carve", labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkLinkMTU(t, c3.NS.Namespace, netnslab.ContainerLink, 1450)
		checkPathMTU(ctx, t, c3, c1, 1450)
		// c1 was attached at 8950 and keeps it: a big packet to h3 is
		// refused by h1's VTEP with "fragmentation needed", which lowers
		// c1's path MTU to 1450; the next one of that size is refused by
		// c1's own kernel, and 1450 passes.
		big := 8950 - 28
		if err := c1.NS.PingDF(ctx, c3.Addr.Addr(), big); err == nil {
			t.Fatalf("DF ping of %d bytes from %s (MTU 8950) to %s (MTU 1450) passed", big, c1.Name, c3.Name)
		}
		err = retry.Until(ctx, 100*time.Millisecond, func() error {
			err := c1.NS.PingDF(ctx, c3.Addr.Addr(), big)
			if !errors.Is(err, unix.EMSGSIZE) {
				return fmt.Errorf("want message too long once the path MTU is learnt, got %v", err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s -> %s: %v", c1.Name, c3.Name, err)
		}
		if err := pingDFRetry(ctx, c1, c3, 1450-28); err != nil {
			t.Fatalf("%s -> %s at 1450: %v", c1.Name, c3.Name, err)
		}
	})
}

// waitMTUs waits until the VTEP and the m-carve bridge of every host in hs
// have mtu, and the conflist its agent wrote says it.
func waitMTUs(ctx context.Context, t *testing.T, c *labcluster.Cluster, mtu int, hs ...*labcluster.Host) {
	t.Helper()
	for _, h := range hs {
		err := retry.Until(ctx, 100*time.Millisecond, func() error {
			for _, link := range []string{c.Network().VTEPName, "m-carve"} {
				got, err := h.NS.LinkMTU(link)
				if err != nil {
					return err
				}
				if got != mtu {
					return fmt.Errorf("%s MTU %d, want %d", link, got, mtu)
				}
			}
			list, err := c.Conflist(h, "carve")
			if err != nil {
				return err
			}
			var bridge struct {
				MTU int `json:"mtu"`
			}
			if err := json.Unmarshal(list.Plugins[0].Bytes, &bridge); err != nil {
				return err
			}
			if bridge.MTU != mtu {
				return fmt.Errorf("conflist's bridge mtu %d, want %d", bridge.MTU, mtu)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
}

// checkPathMTU pings from a to b with Don't Fragment: the largest packet an
// interface of mtu bytes takes passes, one byte more is refused by the
// sender's kernel with "message too long".
func checkPathMTU(ctx context.Context, t *testing.T, a, b *labcluster.Container, mtu int) {
	t.Helper()
	largest := mtu - 28 // IPv4 and ICMP headers
	if err := pingDFRetry(ctx, a, b, largest); err != nil {
		t.Fatalf("DF ping of %d bytes (a %d-byte packet) %s -> %s: %v", largest, mtu, a.Name, b.Name, err)
	}
	err := a.NS.PingDF(ctx, b.Addr.Addr(), largest+1)
	if !errors.Is(err, unix.EMSGSIZE) || !strings.Contains(err.Error(), "message too long") {
		t.Fatalf("DF ping of %d bytes %s -> %s: %v, want message too long", largest+1, a.Name, b.Name, err)
	}
}

// pingDFRetry pings with Don't Fragment until a reply comes (the first
// echoes of a fresh path may be lost while neighbours resolve).
func pingDFRetry(ctx context.Context, a, b *labcluster.Container, payload int) error {
	attempts := 0
	return retry.Until(ctx, 100*time.Millisecond, func() error {
		attempts++
		pctx, cancel := context.WithTimeout(ctx, netnslab.DefaultPingTimeout)
		defer cancel()
		err := a.NS.PingDF(pctx, b.Addr.Addr(), payload)
		if err != nil && attempts >= labcluster.PingAttempts {
			return retry.Permanent(err)
		}
		return err
	})
}

func checkLinkMTU(t *testing.T, n *netnslab.Namespace, link string, want int) {
	t.Helper()
	got, err := n.LinkMTU(link)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("%s in %s: MTU %d, want %d", link, n.Name, got, want)
	}
}
