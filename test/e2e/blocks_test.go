package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// ipamStatus is h's IPAM status on overlay, through its socket.
func ipamStatus(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host, overlay string) *api.IPAMStatus {
	t.Helper()
	st, err := c.IPAMClient(h).Status(ctx, overlay)
	if err != nil {
		t.Fatalf("IPAM status of %s: %v", h.Name, err)
	}
	return st
}

// blockOf is the mesos bridge's block of st that holds addr, or nil.
func blockOf(st *api.IPAMStatus, addr netip.Addr) *api.IPAMBlockUsage {
	for i, b := range st.Blocks[api.BridgeMesos] {
		if p, err := netip.ParsePrefix(b.Prefix); err == nil && p.Contains(addr) {
			return &st.Blocks[api.BridgeMesos][i]
		}
	}
	return nil
}

// findUsage is the mesos bridge's block p of st, or nil.
func findUsage(st *api.IPAMStatus, p netip.Prefix) *api.IPAMBlockUsage {
	for i, b := range st.Blocks[api.BridgeMesos] {
		if b.Prefix == p.String() {
			return &st.Blocks[api.BridgeMesos][i]
		}
	}
	return nil
}

// blockSet lists the mesos bridge's blocks of st as "prefix origin donor".
func blockSet(st *api.IPAMStatus) []string { return blockSetOf(st.Blocks[api.BridgeMesos]) }

func blockSetOf(bs []api.IPAMBlockUsage) []string {
	out := make([]string, 0, len(bs))
	for _, b := range bs {
		out = append(out, strings.TrimSpace(b.Prefix+" "+b.Origin+" "+b.Donor))
	}
	slices.Sort(out)
	return out
}

// findBlock is the block p of bs, or nil.
func findBlock(bs []api.Block, p netip.Prefix) *api.Block {
	for i, b := range bs {
		if b.Prefix == p.String() {
			return &bs[i]
		}
	}
	return nil
}

// masterBlocks are the blocks of agent id on overlay in the masters' state.
func masterBlocks(st *api.State, id, overlay string) []api.Block {
	for _, a := range st.Agents {
		if a.AgentID != id {
			continue
		}
		for _, ov := range a.Overlays {
			if ov.Info.Name == overlay {
				return ov.Blocks
			}
		}
	}
	return nil
}

// agentBlocks are the prefixes of masterBlocks.
func agentBlocks(st *api.State, id, overlay string) []netip.Prefix {
	var out []netip.Prefix
	for _, b := range masterBlocks(st, id, overlay) {
		out = append(out, netip.MustParsePrefix(b.Prefix))
	}
	return out
}

// disjointBlocks checks that no two blocks of the masters' state on overlay
// overlap, nor any block a quarantined prefix.
func disjointBlocks(st *api.State, overlay string) error {
	type owned struct {
		p     netip.Prefix
		owner string
	}
	var all []owned
	for _, a := range st.Agents {
		for _, p := range agentBlocks(st, a.AgentID, overlay) {
			all = append(all, owned{p, a.AgentID})
		}
	}
	for _, q := range st.Quarantine {
		if q.Overlay == overlay {
			all = append(all, owned{netip.MustParsePrefix(q.Prefix), "quarantine of " + q.From})
		}
	}
	var probs []string
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[i].p.Overlaps(all[j].p) {
				probs = append(probs, fmt.Sprintf("%s (%s) overlaps %s (%s)", all[i].p, all[i].owner, all[j].p, all[j].owner))
			}
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("the masters' blocks on %s overlap: %s", overlay, strings.Join(probs, "; "))
	}
	return nil
}

// waitMasterBlocks waits until check accepts h's blocks on overlay in the
// masters' state.
func waitMasterBlocks(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host, overlay string, check func([]api.Block) error) {
	t.Helper()
	var last []api.Block
	err := retry.Until(ctx, 200*time.Millisecond, func() error {
		st, err := c.State(ctx)
		if err != nil {
			return err
		}
		last = masterBlocks(st, h.AgentID(), overlay)
		return check(last)
	})
	if err != nil {
		t.Fatalf("%s's blocks on %s at the masters: %v (last: %+v)", h.Name, overlay, err, last)
	}
}

// waitMasterGrant waits until the masters' state shows g as r's block on
// "full", origin grant, from g's donor.
func waitMasterGrant(ctx context.Context, t *testing.T, c *labcluster.Cluster, r *labcluster.Host, g api.IPAMBlockUsage) {
	t.Helper()
	p := netip.MustParsePrefix(g.Prefix)
	waitMasterBlocks(ctx, t, c, r, full, func(bs []api.Block) error {
		b := findBlock(bs, p)
		if b == nil || b.Origin != api.BlockGranted || b.Donor != g.Donor {
			return fmt.Errorf("block %s is %+v, want origin %q from %s", p, b, api.BlockGranted, g.Donor)
		}
		return nil
	})
}
