package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/testutil"
)

// Grants through the ring as the growth tests make them, and the masters
// recording them (what only the lessee's word may then give back).

// grantedCluster is agents a and b, a holding 32 containers: more than
// its mesos bridge's first block, so b granted it a block through the
// ring. It returns b's data dir too.
func grantedCluster(t *testing.T, seed uint64, growth GrowthConfig) (*cluster, string) {
	t.Helper()
	c := newCluster(t, seed, growth)
	dirB := t.TempDir()
	c.start("a", t.TempDir(), "")
	c.start("b", dirB, "")
	c.gossipRounds()
	a := c.nodes["a"]
	for i := range 32 {
		a.alloc(t, fmt.Sprint("c", i))
	}
	if n := len(a.svc.Status("carve").Blocks[api.BridgeMesos]); n < 2 {
		t.Fatalf("%d blocks, want a grant", n)
	}
	// The recipient reports the grant to the masters in the background.
	testutil.Eventually(t, 10*time.Second, "the grant reported to the masters", func() error {
		if n := len(c.masters.reported()); n == 0 {
			return errors.New("none reported yet")
		}
		return nil
	})
	return c, dirB
}

// recordGrant syncs every node with the masters' records after they
// recorded a grant: the recipient's record lists the block (a newer
// version), the donor's no more.
func recordGrant(t *testing.T, c *cluster, g GrantReport) {
	t.Helper()
	for id, nd := range c.nodes {
		v := growthView(id)
		for i, p := range v.Peers {
			switch p.ID {
			case g.Recipient:
				v.Peers[i].Version += 100
				v.Peers[i].Subnets = append(v.Peers[i].Subnets, g.Prefix.String())
			case g.Donor:
				v.Peers[i].Version += 100
				var rest []string
				for _, sub := range p.Subnets {
					for _, q := range cutOut(netip.MustParsePrefix(sub), g.Prefix) {
						rest = append(rest, q.String())
					}
				}
				v.Peers[i].Subnets = rest
			}
		}
		if id == g.Recipient {
			v.Blocks = []MasterBlock{{Overlay: g.Overlay, Bridge: api.BridgeMesos, Prefix: g.Prefix, Version: v.Self.Version + 100, Donor: g.Donor}}
		}
		nd.svc.Sync(v)
	}
	c.gossipRounds()
}

// cutOut is p without q: p itself when they do not overlap, nothing when
// q covers p, else the halves of p cut again.
func cutOut(p, q netip.Prefix) []netip.Prefix {
	switch {
	case !p.Overlaps(q):
		return []netip.Prefix{p}
	case q.Bits() <= p.Bits():
		return nil
	}
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	hiAddr := p.Addr().As4()
	bit := p.Bits()
	hiAddr[bit/8] |= 0x80 >> (bit % 8)
	hi := netip.PrefixFrom(netip.AddrFrom4(hiAddr), p.Bits()+1)
	return append(cutOut(lo, q), cutOut(hi, q)...)
}
