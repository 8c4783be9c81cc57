package vxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// mac is a MAC address usable as a map key.
type mac [6]byte

func toMAC(m net.HardwareAddr) mac {
	var k mac
	copy(k[:], m)
	return k
}

func (m mac) String() string { return net.HardwareAddr(m[:]).String() }

// The three per-peer entries, keyed the way the kernel keys them (on the
// VTEP device): a neighbour by IP, an FDB entry by MAC, a route by prefix
// and metric (see RouteMetric).
type (
	neighEntry struct {
		mac  mac
		peer string
	}
	fdbEntry struct {
		dst  netip.Addr
		peer string
	}
	routeEntry struct {
		via  netip.Addr
		oif  int // the VTEP, or the underlay device of a routed peer
		peer string
	}
)

// entrySet is a set of per-peer entries: what is desired, or what carve
// knows it has programmed.
type entrySet struct {
	neigh map[netip.Addr]neighEntry
	fdb   map[mac]fdbEntry
	route map[routeKey]routeEntry
}

// routeKey identifies a route in the main table the way NLM_F_REPLACE and
// RTM_DELROUTE match it (for carve's routes: destination and metric).
type routeKey struct {
	dst    netip.Prefix
	metric uint32
}

// RouteMetric is the metric of carve's route via the next hop via: 1024
// plus the low 16 bits of the next hop.
//
// Why not one metric for all: Linux hashes IPv4 route information without
// the gateway, so thousands of routes through one device with distinct
// gateways and the same metric share a single hash chain and each insertion
// walks all of them (measured: 74, 127, 277 µs per route at 5k, 10k, 20k
// peers; with distinct metrics a flat 10-11 µs). Peers' VTEP IPs differ in
// their low bits, so this spreads them. Only the relative order of routes to
// the same prefix depends on metrics, and carve installs one per prefix;
// starting at 1024 lets an operator override a carve route with a route of
// lower metric, which carve leaves alone.
func RouteMetric(via netip.Addr) uint32 {
	b := via.As16()
	return 1024 + uint32(b[14])<<8 | uint32(b[15])
}

func newEntrySet(n int) *entrySet {
	return &entrySet{
		neigh: make(map[netip.Addr]neighEntry, n),
		fdb:   make(map[mac]fdbEntry, n),
		route: make(map[routeKey]routeEntry, n),
	}
}

// buildEntries turns the peers into the entries to program. Invalid peers,
// and entries conflicting with an earlier peer (by ID order, so the outcome
// does not depend on input order), are reported and left out; the others
// are programmed.
//
// vtepIdx is the VTEP's ifindex; u is the underlay of routed mode (nil:
// every peer on VXLAN). A peer on u's segment (see underlay.onSegment) gets
// its subnets of the underlay's family routed via its underlay IP on u's
// device, and neither neighbour nor FDB entry unless it also has subnets of
// the other family (Linux routes no IPv6 prefix via an IPv4 next hop: those
// stay on VXLAN).
func buildEntries(d *Desired, rep *Report, vtepIdx int, u *underlay) *entrySet {
	// Sorted pointers: cheaper to sort than the structs.
	peers := make([]*Peer, len(d.Peers))
	for i := range d.Peers {
		peers[i] = &d.Peers[i]
	}
	slices.SortStableFunc(peers, func(a, b *Peer) int { return strings.Compare(a.ID, b.ID) })
	set := newEntrySet(len(peers))
	ownIP := d.VTEP.Address.Addr()
	ownMAC := toMAC(d.VTEP.MAC)
	localIs4 := d.VTEP.Local.Is4()
	// Who claimed what, for conflict messages (typed maps: this runs on
	// every Apply over all peers).
	ipOwner := make(map[netip.Addr]string, len(peers))
	macOwner := make(map[mac]string, len(peers))
	routeOwner := make(map[netip.Prefix]string, len(peers))
	// Local prefixes: a peer subnet overlapping one would replace (or shadow)
	// this agent's own connected routes, so it is refused.
	local := []netip.Prefix{d.VTEP.Address}
	if d.VTEP.Address6.IsValid() {
		local = append(local, d.VTEP.Address6)
	}
	for _, b := range d.Bridges {
		local = append(local, b.addresses()...)
	}
	rep.Modes = make(map[string]Mode, len(peers))
	for _, p := range peers {
		if !p.UnderlayIP.IsValid() {
			continue // an agent without an IP is not reachable: skip it
		}
		reject := func(err error) { rep.fail(KindPeer, p.ID, p.ID, "validate", err) }
		switch {
		case p.UnderlayIP.Unmap().Is4() != localIs4 || p.UnderlayIP.IsUnspecified():
			reject(fmt.Errorf("underlay IP %s does not match the family of the local underlay IP %s", p.UnderlayIP, d.VTEP.Local))
			continue
		case !p.VTEPIP.IsValid() || !p.VTEPIP.Unmap().Is4():
			reject(fmt.Errorf("VTEP IP %v is not an IPv4 address", p.VTEPIP))
			continue
		case p.VTEPIP.Unmap() == ownIP:
			reject(fmt.Errorf("VTEP IP %s is this agent's own", p.VTEPIP))
			continue
		}
		if err := validMAC(p.VTEPMAC); err != nil {
			reject(fmt.Errorf("VTEP MAC: %w", err))
			continue
		}
		m := toMAC(p.VTEPMAC)
		if m == ownMAC {
			reject(fmt.Errorf("VTEP MAC %s is this agent's own", m))
			continue
		}
		vip := p.VTEPIP.Unmap()
		if o, ok := ipOwner[vip]; ok {
			reject(fmt.Errorf("VTEP IP %s already belongs to peer %s", vip, o))
			continue
		}
		if o, ok := macOwner[m]; ok {
			reject(fmt.Errorf("VTEP MAC %s already belongs to peer %s", m, o))
			continue
		}
		ipOwner[vip] = p.ID
		macOwner[m] = p.ID
		routed := u.onSegment(p.UnderlayIP.Unmap(), d.Segments)
		// A routed peer needs the VTEP only for subnets of the other family.
		tunnel := !routed || slices.ContainsFunc(p.Subnets, func(s netip.Prefix) bool { return s.Addr().Is4() != localIs4 })
		rep.Modes[p.ID] = ModeVXLAN
		if routed {
			rep.Modes[p.ID] = ModeRouted
		}
		if tunnel {
			set.neigh[vip] = neighEntry{mac: m, peer: p.ID}
		}
		if v6 := p.VTEPIP6; v6.IsValid() {
			switch {
			case !v6.Is6() || v6.Is4In6() || v6.Zone() != "":
				reject(fmt.Errorf("VTEP IP6 %v is not an IPv6 address", v6))
			case d.VTEP.Address6.IsValid() && v6 == d.VTEP.Address6.Addr():
				reject(fmt.Errorf("VTEP IP6 %s is this agent's own", v6))
			case ipOwner[v6] != "":
				reject(fmt.Errorf("VTEP IP6 %s already belongs to peer %s", v6, ipOwner[v6]))
			default:
				ipOwner[v6] = p.ID
				if tunnel {
					set.neigh[v6] = neighEntry{mac: m, peer: p.ID}
				}
			}
		}
		if tunnel {
			set.fdb[m] = fdbEntry{dst: p.UnderlayIP.Unmap(), peer: p.ID}
		}
		ll := LinkLocal(p.VTEPMAC)
		for _, s := range p.Subnets {
			switch {
			case !s.IsValid() || s.Addr().Zone() != "":
				reject(fmt.Errorf("invalid subnet %v", s))
				continue
			case s.Masked() != s:
				reject(fmt.Errorf("subnet %s has host bits set", s))
				continue
			}
			if i := slices.IndexFunc(local, func(l netip.Prefix) bool { return shadows(s, l) }); i >= 0 {
				reject(fmt.Errorf("subnet %s overlaps local subnet %s", s, local[i].Masked()))
				continue
			}
			if o, ok := routeOwner[s]; ok {
				reject(fmt.Errorf("subnet %s already routed to peer %s", s, o))
				continue
			}
			routeOwner[s] = p.ID
			via, oif := vip, vtepIdx
			switch {
			case routed && s.Addr().Is4() == localIs4:
				via, oif = p.UnderlayIP.Unmap(), u.index
			case s.Addr().Is6():
				via = ll
				set.neigh[ll] = neighEntry{mac: m, peer: p.ID}
			}
			set.route[routeKey{s, RouteMetric(via)}] = routeEntry{via: via, oif: oif, peer: p.ID}
		}
	}
	return set
}

// Kernel view of an entry, as read back by a full resync, or the
// remembered view of one carve programmed.
type (
	curNeigh struct {
		mac  mac
		ours bool // carries carve's protocol mark
		good bool // ours, permanent: exactly what carve would write for mac
	}
	curFDB struct {
		dst  netip.Addr
		good bool // permanent, self, default port and VNI
	}
	curRoute struct {
		via  netip.Addr
		oif  int
		ours bool // carries carve's protocol mark
		good bool // ours, unicast, single next hop (onlink for IPv4); diff checks oif
	}
)

// current is what is (believed to be) on the VTEP. FDB entries have no
// ownership mark in the kernel: every unicast FDB entry on carve's VTEP is
// carve's (learning is off, so the kernel adds none).
type current struct {
	neigh map[netip.Addr]curNeigh
	fdb   map[mac]curFDB
	route map[routeKey]curRoute
}

// Operations of a plan. A "set" creates or replaces (NLM_F_REPLACE), so it is
// correct whether or not the entry exists; isNew only drives the counts.
type (
	neighOp struct {
		ip    netip.Addr
		mac   mac
		peer  string
		isNew bool
	}
	fdbOp struct {
		mac   mac
		dst   netip.Addr
		peer  string
		isNew bool
	}
	routeOp struct {
		key   routeKey
		via   netip.Addr
		oif   int
		peer  string
		isNew bool // for a delete: the prefix stays routed (by a new route)
	}
)

// plan is the difference between current and desired. It is executed in
// phases: the routes to prefixes no longer routed; then additions
// neighbour, FDB, route; then the old routes of prefixes that stay routed
// (routeMove: their next hop changed, e.g. a switch between VXLAN and
// routed mode), FDB and neighbour removals. A route never points at a peer
// whose neighbour or FDB entry is missing, and a prefix that stays routed
// is never without a route: make before break (the new route has another
// metric, so both exist for a moment and the kernel uses the lower).
type plan struct {
	routeDel  []routeOp
	routeMove []routeOp
	fdbDel    []fdbOp
	neighDel  []neighOp
	neighSet  []neighOp
	fdbSet    []fdbOp
	routeSet  []routeOp
}

func (p *plan) empty() bool {
	return len(p.routeDel)+len(p.routeMove)+len(p.fdbDel)+len(p.neighDel)+len(p.neighSet)+len(p.fdbSet)+len(p.routeSet) == 0
}

// diff computes the plan that turns cur into want. Entries in cur that are
// not carve's are only touched when want has the same key.
func diff(cur *current, want *entrySet) *plan {
	p := &plan{}
	wantDst := make(map[netip.Prefix]bool, len(want.route))
	for k := range want.route {
		wantDst[k.dst] = true
	}
	curDst := make(map[netip.Prefix]bool, len(cur.route))
	for k, c := range cur.route {
		if c.ours {
			curDst[k.dst] = true
		}
		if _, ok := want.route[k]; !ok && c.ours {
			// A route of carve's to a prefix that stays desired has
			// another metric: its next hop changed.
			if wantDst[k.dst] {
				p.routeMove = append(p.routeMove, routeOp{key: k, via: c.via, isNew: true})
			} else {
				p.routeDel = append(p.routeDel, routeOp{key: k, via: c.via})
			}
		}
	}
	for k, c := range cur.fdb {
		if _, ok := want.fdb[k]; !ok {
			p.fdbDel = append(p.fdbDel, fdbOp{mac: k, dst: c.dst})
		}
	}
	for k, c := range cur.neigh {
		if _, ok := want.neigh[k]; !ok && c.ours {
			p.neighDel = append(p.neighDel, neighOp{ip: k, mac: c.mac})
		}
	}
	for k, w := range want.neigh {
		c, ok := cur.neigh[k]
		if !ok || !c.good || c.mac != w.mac {
			p.neighSet = append(p.neighSet, neighOp{ip: k, mac: w.mac, peer: w.peer, isNew: !ok})
		}
	}
	for k, w := range want.fdb {
		c, ok := cur.fdb[k]
		if !ok || !c.good || c.dst != w.dst {
			p.fdbSet = append(p.fdbSet, fdbOp{mac: k, dst: w.dst, peer: w.peer, isNew: !ok})
		}
	}
	for k, w := range want.route {
		c, ok := cur.route[k]
		if !ok || !c.good || c.via != w.via || c.oif != w.oif {
			p.routeSet = append(p.routeSet, routeOp{key: k, via: w.via, oif: w.oif, peer: w.peer, isNew: !ok && !curDst[k.dst]})
		}
	}
	// Deterministic order: easier to read in logs, and stable in tests.
	slices.SortFunc(p.routeDel, func(a, b routeOp) int { return a.key.dst.Addr().Compare(b.key.dst.Addr()) })
	slices.SortFunc(p.routeMove, func(a, b routeOp) int { return a.key.dst.Addr().Compare(b.key.dst.Addr()) })
	slices.SortFunc(p.routeSet, func(a, b routeOp) int { return a.key.dst.Addr().Compare(b.key.dst.Addr()) })
	slices.SortFunc(p.neighDel, func(a, b neighOp) int { return a.ip.Compare(b.ip) })
	slices.SortFunc(p.neighSet, func(a, b neighOp) int { return a.ip.Compare(b.ip) })
	cmpMAC := func(a, b fdbOp) int { return strings.Compare(string(a.mac[:]), string(b.mac[:])) }
	slices.SortFunc(p.fdbDel, cmpMAC)
	slices.SortFunc(p.fdbSet, cmpMAC)
	return p
}

// isGone tells whether a delete failed only because the entry was already
// gone, which is the outcome a delete wants.
func isGone(err error) bool {
	return errors.Is(err, errNoEntry) || errors.Is(err, errNoRoute)
}

// shadows reports whether a route to a peer's subnet s would take traffic
// from the local subnet of address l (a gateway or the VTEP address with
// its prefix): s is l's subnet or longer and holds l's address. A shorter
// peer route (a donor's subnet around a block granted to this host) loses
// to the local one by longest match; a longer one that leaves the local
// address alone (a block this host granted a peer) carves it out, as a
// grant must.
func shadows(s, l netip.Prefix) bool {
	return s.Overlaps(l) && s.Bits() >= l.Bits() && (s.Bits() == l.Bits() || s.Contains(l.Addr()))
}
