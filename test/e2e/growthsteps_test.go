package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// addConcurrently attaches n containers to overlay on h through CNI ADD,
// from workers goroutines, and fails the test unless every ADD succeeds
// with a distinct address.
func addConcurrently(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host, overlay string, n, workers int) []*labcluster.Container {
	t.Helper()
	cs := make([]*labcluster.Container, n)
	errs := make([]error, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				cs[i], errs[i] = c.AddCNIContainer(ctx, h, overlay, labcluster.CNIOptions{})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("ADDs on %s: %v", h.Name, err)
	}
	seen := map[netip.Addr]string{}
	for _, ct := range cs {
		if o, dup := seen[ct.Addr.Addr()]; dup {
			t.Fatalf("%s and %s both got %s", o, ct.Name, ct.Addr)
		}
		seen[ct.Addr.Addr()] = ct.Name
	}
	return cs
}

// fillUntilGrant adds containers to "full" on r, one at a time, until one
// gets an address in a granted block not in known, and returns it with its
// block (as r's IPAM lists it). Every ADD must succeed.
func fillUntilGrant(ctx context.Context, t *testing.T, c *labcluster.Cluster, r *labcluster.Host, known []netip.Prefix) (*labcluster.Container, api.IPAMBlockUsage) {
	t.Helper()
	for i := 0; i < 40; i++ {
		ct, err := c.AddCNIContainer(ctx, r, full, labcluster.CNIOptions{})
		if err != nil {
			t.Fatalf("ADD %d on %s: %v\nIPAM: %+v", i, r.Name, err, ipamStatus(ctx, t, c, r, full).Blocks)
		}
		b := blockOf(ipamStatus(ctx, t, c, r, full), ct.Addr.Addr())
		if b == nil {
			t.Fatalf("%s: none of %s's blocks holds it", ct, r.Name)
		}
		p := netip.MustParsePrefix(b.Prefix)
		if b.Origin == api.BlockGranted && !slices.Contains(known, p) {
			if b.Donor == "" || b.Donor == r.AgentID() {
				t.Fatalf("granted block %+v names donor %q", b, b.Donor)
			}
			if ct.Gateway != p.Addr().Next() {
				t.Errorf("%s: gateway %s, want the first host of its block %s", ct, ct.Gateway, p)
			}
			return ct, *b
		}
		if b.Origin == api.BlockGrown {
			t.Fatalf("%s came from a block grown at the masters (%s), but %q is fully leased", ct, b.Prefix, full)
		}
	}
	t.Fatalf("40 ADDs on %s and no new granted block: %+v", r.Name, ipamStatus(ctx, t, c, r, full).Blocks)
	return nil, api.IPAMBlockUsage{}
}

// waitRoutedEverywhere waits until every other host with a running agent
// routes p via r's VTEP IP: the longest match of every address of p (a
// small block) among the routes of carve's protocol (202), read through netlink
// in the host's namespace, goes via r's VTEP.
func waitRoutedEverywhere(ctx context.Context, t *testing.T, c *labcluster.Cluster, r *labcluster.Host, p netip.Prefix) {
	t.Helper()
	info, err := c.AgentClient(r).Overlay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var vtep netip.Addr
	for _, ov := range info.Overlays {
		if ov.Backend != nil && ov.Backend.VXLAN != nil {
			vtep = netip.MustParsePrefix(ov.Backend.VXLAN.VTEPIP).Addr()
		}
	}
	if !vtep.IsValid() {
		t.Fatalf("%s reports no VTEP IP: %+v", r.Name, info)
	}
	for _, h := range others(c, r) {
		if !h.Agent.Running() {
			continue
		}
		err := retry.Until(ctx, 100*time.Millisecond, func() error {
			ks, err := c.Kernel(h)
			if err != nil {
				return err
			}
			// Adjacent ranges of one owner may come as one route: what
			// counts is where the longest match of every address of p
			// points.
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				if rt, via := longestMatch(ks.Routes, a); via != vtep {
					return fmt.Errorf("%s of %s: longest match %v via %v, want via %s", a, p, rt, via, vtep)
				}
			}
			return nil
		})
		if err != nil {
			ks, _ := c.Kernel(h)
			t.Fatalf("%s: %v\n%s", h.Name, err, ks)
		}
	}
}

// longestMatch is the most specific route of routes that contains a, and
// its next hop (invalid when none does).
func longestMatch(routes map[netip.Prefix]netip.Addr, a netip.Addr) (netip.Prefix, netip.Addr) {
	var best netip.Prefix
	var via netip.Addr
	for p, gw := range routes {
		if p.Contains(a) && (!best.IsValid() || p.Bits() > best.Bits()) {
			best, via = p, gw
		}
	}
	return best, via
}

// pingNoStop runs the ping matrix and reports failed pairs without stopping
// the test.
func pingNoStop(ctx context.Context, t *testing.T, cs []*labcluster.Container) {
	t.Helper()
	m := labcluster.Ping(ctx, cs)
	if err := m.Err(); err != nil {
		t.Errorf("%v\n%s", err, m)
		return
	}
	t.Logf("ping matrix:\n%s", m)
}
