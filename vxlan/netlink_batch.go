package vxlan

// Building batches of rtnetlink messages: the per-peer entries (neighbour,
// FDB entry, route) as set and delete requests, back to back in one buffer.

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// batch accumulates netlink messages back to back in one buffer, so that any
// run of them can be sent with a single sendmsg without copying.
type batch struct {
	buf   []byte
	offs  []int // start of each message
	start int   // start of the message being built
}

func (b *batch) len() int { return len(b.offs) }

func (b *batch) begin(typ, flags uint16) {
	b.start = len(b.buf)
	b.offs = append(b.offs, b.start)
	var h [sizeofNlmsghdr]byte
	native.PutUint16(h[4:], typ)
	native.PutUint16(h[6:], flags|unix.NLM_F_REQUEST)
	b.buf = append(b.buf, h[:]...)
}

func (b *batch) end() {
	native.PutUint32(b.buf[b.start:], uint32(len(b.buf)-b.start))
}

func (b *batch) raw(p []byte) { b.buf = append(b.buf, p...) }

func (b *batch) attr(typ uint16, data []byte) {
	var h [4]byte
	native.PutUint16(h[0:], uint16(4+len(data)))
	native.PutUint16(h[2:], typ)
	b.buf = append(b.buf, h[:]...)
	b.buf = append(b.buf, data...)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

func (b *batch) attrU32(typ uint16, v uint32) {
	var d [4]byte
	native.PutUint32(d[:], v)
	b.attr(typ, d[:])
}

func ndmsg(family uint8, ifindex int, state uint16, flags uint8) []byte {
	var m [sizeofNdmsg]byte
	m[0] = family
	native.PutUint32(m[4:], uint32(ifindex))
	native.PutUint16(m[8:], state)
	m[10] = flags
	return m[:]
}

func rtmsg(family, dstLen, protocol, scope, typ uint8, flags uint32) []byte {
	var m [sizeofRtmsg]byte
	m[0] = family
	m[1] = dstLen
	m[4] = unix.RT_TABLE_MAIN
	m[5] = protocol
	m[6] = scope
	m[7] = typ
	native.PutUint32(m[8:], flags)
	return m[:]
}

func addrFamily(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// Message builders for the per-peer entries. Sets use CREATE|REPLACE so that
// they fix an entry whatever state it is in.
const setFlags = unix.NLM_F_CREATE | unix.NLM_F_REPLACE

func (b *batch) neighSet(ifindex int, ip netip.Addr, m mac) {
	b.begin(unix.RTM_NEWNEIGH, setFlags)
	b.raw(ndmsg(addrFamily(ip), ifindex, unix.NUD_PERMANENT, 0))
	b.attr(ndaDst, ip.AsSlice())
	b.attr(ndaLLAddr, m[:])
	b.attr(ndaProtocol, []byte{Protocol})
	b.end()
}

func (b *batch) neighDel(ifindex int, ip netip.Addr) {
	b.begin(unix.RTM_DELNEIGH, 0)
	b.raw(ndmsg(addrFamily(ip), ifindex, 0, 0))
	b.attr(ndaDst, ip.AsSlice())
	b.end()
}

func (b *batch) fdbSet(ifindex int, m mac, dst netip.Addr) {
	b.begin(unix.RTM_NEWNEIGH, setFlags)
	b.raw(ndmsg(unix.AF_BRIDGE, ifindex, unix.NUD_PERMANENT, unix.NTF_SELF))
	b.attr(ndaLLAddr, m[:])
	b.attr(ndaDst, dst.AsSlice())
	b.end()
}

// fdbDel deletes the whole entry of a MAC (every destination), as no
// destination is given.
func (b *batch) fdbDel(ifindex int, m mac) {
	b.begin(unix.RTM_DELNEIGH, 0)
	b.raw(ndmsg(unix.AF_BRIDGE, ifindex, 0, unix.NTF_SELF))
	b.attr(ndaLLAddr, m[:])
	b.end()
}

func (b *batch) routeSet(ifindex int, k routeKey, via netip.Addr, routed bool) {
	dst := k.dst
	var flags uint32
	if via.Is4() || routed {
		// onlink: the next hop is reachable through the VTEP without a
		// covering connected route (DESIGN: "via vtep_ip dev VTEP onlink").
		// IPv6 link-local next hops are on-link by definition. A routed
		// peer's underlay IP is on the segment, which an operator may
		// have declared wider than the connected prefix.
		flags = unix.RTNH_F_ONLINK
	}
	b.begin(unix.RTM_NEWROUTE, setFlags)
	b.raw(rtmsg(addrFamily(dst.Addr()), uint8(dst.Bits()), Protocol, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST, flags))
	b.attr(rtaDst, dst.Addr().AsSlice())
	b.attr(rtaGateway, via.AsSlice())
	b.attrU32(rtaOif, uint32(ifindex))
	b.attrU32(rtaPriority, k.metric)
	b.end()
}

// routeDel deletes the main-table route to k.dst with metric k.metric only
// if it carries carve's protocol mark: the kernel matches rtm_protocol on
// delete, so a route an operator put in place of carve's is left alone.
func (b *batch) routeDel(k routeKey) {
	b.begin(unix.RTM_DELROUTE, 0)
	b.raw(rtmsg(addrFamily(k.dst.Addr()), uint8(k.dst.Bits()), Protocol, unix.RT_SCOPE_NOWHERE, 0, 0))
	b.attr(rtaDst, k.dst.Addr().AsSlice())
	b.attrU32(rtaPriority, k.metric)
	b.end()
}

func (b *batch) msgEnd(k int) int {
	if k+1 < len(b.offs) {
		return b.offs[k+1]
	}
	return len(b.buf)
}

func u32(v uint32) []byte {
	var b [4]byte
	native.PutUint32(b[:], v)
	return b[:]
}

func attrBytes(typ uint16, data []byte) []byte {
	var b batch
	b.attr(typ, data)
	return b.buf
}
