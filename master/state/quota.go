package state

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
)

// ErrQuota: a grow or a grant would give an agent more grown and granted
// space in an overlay than the overlay's quota_prefix allows (409 quota).
var ErrQuota = errors.New("quota")

// checkQuota refuses to give agent the block add in the overlay of def
// when its grown and granted blocks of add's family (blocks: what it holds
// now) would then hold more addresses than its quota. The origin lease
// does not count: every agent has one.
func checkQuota(def overlayDef, agent string, blocks []leaseBlock, add netip.Prefix) error {
	is4 := add.Addr().Is4()
	bits := def.QuotaBits(is4)
	if bits == 0 {
		return nil // no subnet of that family: the grow or grant is refused elsewhere
	}
	width := add.Addr().BitLen()
	held := addresses(add, width)
	for _, b := range blocks {
		if b.Prefix.Addr().Is4() == is4 && b.Origin != api.BlockLeased {
			held.Add(held, addresses(b.Prefix, width))
		}
	}
	limit := new(big.Int).Lsh(big.NewInt(1), uint(width-bits))
	if held.Cmp(limit) <= 0 {
		return nil
	}
	return fmt.Errorf("%w: agent %q would hold %s addresses of grown and granted space in overlay %q with %s, beyond its quota of a /%d (%s addresses): return blocks it no longer needs, or raise the overlay's quota_prefix%s in the network configuration",
		ErrQuota, agent, held, def.Name(), add, bits, limit, map[bool]string{true: "", false: "6"}[is4])
}

// addresses is the number of addresses of p, whose family is width bits.
func addresses(p netip.Prefix, width int) *big.Int {
	return new(big.Int).Lsh(big.NewInt(1), uint(width-p.Bits()))
}

// grantWithinQuota checks a grant against its recipient's quota: the
// recipient's blocks that the granted prefix overlaps are replaced by it.
func (t *LeaseTable) grantWithinQuota(c *logcmd.Grant, recip *agentRecord) error {
	def, ok := t.net.Overlay(c.Overlay)
	if !ok {
		return fmt.Errorf("%w: overlay %q is not configured", ErrInvalidBlock, c.Overlay)
	}
	var kept []leaseBlock
	for _, b := range recip.Leases[c.Overlay].Blocks {
		if !b.Prefix.Overlaps(c.Prefix) {
			kept = append(kept, b)
		}
	}
	return checkQuota(def, c.Recipient, kept, c.Prefix)
}
