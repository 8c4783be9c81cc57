package vxlan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// This file speaks rtnetlink directly for the per-peer entries, because they
// are the part that scales with the cluster: instead of one request and one
// acknowledgement per entry (two system calls and a wake-up each), a batch of
// messages goes out in one sendmsg and only failures are answered, plus one
// acknowledgement that closes the batch. Reading back is one dump per table.

var (
	errNoEntry = unix.ENOENT // neighbour / FDB entry already gone
	errNoRoute = unix.ESRCH  // route already gone
	// errAckLost marks entries whose outcome is unknown because the kernel
	// dropped acknowledgements (receive buffer overrun); they are retried.
	errAckLost = errors.New("netlink acknowledgement lost, outcome unknown")
)

var native = binary.NativeEndian

// Kernel constants not exported by x/sys/unix under these names.
const (
	ndaDst      = 1
	ndaLLAddr   = 2
	ndaPort     = 6
	ndaVNI      = 7
	ndaIfindex  = 8
	ndaProtocol = 12

	rtaDst       = 1
	rtaOif       = 4
	rtaGateway   = 5
	rtaPriority  = 6
	rtaMultipath = 9
	rtaTable     = 15
	rtaVia       = 18

	sizeofNdmsg     = 12
	sizeofRtmsg     = 12
	sizeofIfinfomsg = 16
	sizeofNlmsghdr  = 16

	maxBatchBytes = 64 << 10 // well under the default socket send buffer
	rcvBufSize    = 8 << 20
	sockTimeout   = 30 * time.Second
)

// nlSocket is a NETLINK_ROUTE socket opened inside the dataplane's namespace
// (a socket stays in the namespace it was created in, whatever thread uses it).
type nlSocket struct {
	fd       int
	seq      uint32
	rbuf     []byte
	maxBatch int // messages per sendmsg, bounded by what the receive buffer holds
}

// openSocket opens the socket with inNS, which runs a function inside the
// namespace to program.
func openSocket(inNS func(func() error) error) (*nlSocket, error) {
	fd := -1
	err := inNS(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	s := &nlSocket{fd: fd, seq: uint32(time.Now().UnixNano()), rbuf: make([]byte, 1<<20)}
	fail := func(err error) (*nlSocket, error) {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fail(fmt.Errorf("netlink bind: %w", err))
	}
	// Errors carry only the failing message's header, not a copy of it, and
	// a text message from the kernel when it has one.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	// A big receive buffer so that the kernel never drops error messages of
	// a batch; FORCE needs CAP_NET_ADMIN, which programming routes needs anyway.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBufSize); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBufSize)
	}
	tv := unix.NsecToTimeval(sockTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail(err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return fail(err)
	}
	// An error message costs about 1 KiB of receive buffer (skb overhead);
	// size batches so that all of them failing still fits, twice over.
	rb, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		rb = 212992
	}
	s.maxBatch = min(max(rb/4096, 16), 1024)
	return s, nil
}

func (s *nlSocket) close() {
	if s != nil && s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

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

func (b *batch) routeSet(ifindex int, k routeKey, via netip.Addr) {
	dst := k.dst
	var flags uint32
	if via.Is4() {
		// onlink: the next hop is reachable through the VTEP without a
		// covering connected route (DESIGN: "via vtep_ip dev VTEP onlink").
		// IPv6 link-local next hops are on-link by definition.
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

// exec sends the batch in chunks and returns one error per message (nil on
// success). Messages carry no ACK flag except the last of each chunk: the
// kernel processes a chunk synchronously inside sendmsg, reporting each
// failure, so once the closing acknowledgement arrives every failure of the
// chunk has been read. canceled is checked between chunks.
func (s *nlSocket) exec(b *batch, canceled func() error) []error {
	errs := make([]error, b.len())
	for i := 0; i < b.len(); {
		if err := canceled(); err != nil {
			for k := i; k < b.len(); k++ {
				errs[k] = err
			}
			return errs
		}
		j := i + 1
		for j < b.len() && j-i < s.maxBatch && b.msgEnd(j)-b.offs[i] <= maxBatchBytes {
			j++
		}
		s.execChunk(b, i, j, errs)
		i = j
	}
	return errs
}

func (b *batch) msgEnd(k int) int {
	if k+1 < len(b.offs) {
		return b.offs[k+1]
	}
	return len(b.buf)
}

func (s *nlSocket) execChunk(b *batch, i, j int, errs []error) {
	base := s.seq + 1
	for k := i; k < j; k++ {
		h := b.buf[b.offs[k]:]
		native.PutUint32(h[8:], base+uint32(k-i))
		fl := native.Uint16(h[6:]) &^ unix.NLM_F_ACK
		if k == j-1 {
			fl |= unix.NLM_F_ACK
		}
		native.PutUint16(h[6:], fl)
	}
	s.seq = base + uint32(j-i-1)
	last := s.seq
	setAll := func(err error) {
		for k := i; k < j; k++ {
			if errs[k] == nil {
				errs[k] = err
			}
		}
	}
	if err := unix.Sendto(s.fd, b.buf[b.offs[i]:b.msgEnd(j-1)], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		setAll(fmt.Errorf("netlink send: %w", err))
		return
	}
	lost := false
	for {
		n, _, err := unix.Recvfrom(s.fd, s.rbuf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOBUFS) {
			lost = true // some error messages were dropped; keep reading
			continue
		}
		if err != nil {
			setAll(fmt.Errorf("netlink receive: %w", err))
			return
		}
		done := false
		forEachMsg(s.rbuf[:n], func(h *unix.NlMsghdr, data []byte) {
			if h.Type != unix.NLMSG_ERROR || h.Seq < base || h.Seq > last || len(data) < 4 {
				return
			}
			if errno := -int32(native.Uint32(data)); errno != 0 {
				errs[i+int(h.Seq-base)] = ackError(h, data, unix.Errno(errno))
			}
			if h.Seq == last {
				done = true
			}
		})
		if done {
			break
		}
	}
	if lost {
		setAll(errAckLost)
	}
}

// ackError adds the kernel's extended-ack message, when there is one.
func ackError(h *unix.NlMsghdr, data []byte, errno unix.Errno) error {
	if h.Flags&unix.NLM_F_ACK_TLVS == 0 || len(data) < 4+sizeofNlmsghdr {
		return errno
	}
	// With NETLINK_CAP_ACK only the header of the request is echoed.
	off := 4 + sizeofNlmsghdr
	if h.Flags&unix.NLM_F_CAPPED == 0 {
		off = 4 + int(native.Uint32(data[4:]))
	}
	if off > len(data) {
		return errno
	}
	msg := ""
	forEachAttr(data[off:], func(typ uint16, v []byte) {
		if typ == unix.NLMSGERR_ATTR_MSG && len(v) > 0 {
			msg = string(trimNul(v))
		}
	})
	if msg == "" {
		return errno
	}
	return fmt.Errorf("%w (%s)", errno, msg)
}

func trimNul(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

// forEachMsg walks the netlink messages of one datagram.
func forEachMsg(b []byte, fn func(h *unix.NlMsghdr, data []byte)) {
	for len(b) >= sizeofNlmsghdr {
		h := unix.NlMsghdr{
			Len:   native.Uint32(b[0:]),
			Type:  native.Uint16(b[4:]),
			Flags: native.Uint16(b[6:]),
			Seq:   native.Uint32(b[8:]),
			Pid:   native.Uint32(b[12:]),
		}
		if h.Len < sizeofNlmsghdr || int(h.Len) > len(b) {
			return
		}
		fn(&h, b[sizeofNlmsghdr:h.Len])
		adv := (int(h.Len) + 3) &^ 3
		if adv > len(b) {
			return
		}
		b = b[adv:]
	}
}

// forEachAttr walks rtattrs.
func forEachAttr(b []byte, fn func(typ uint16, v []byte)) {
	for len(b) >= 4 {
		l := int(native.Uint16(b[0:]))
		if l < 4 || l > len(b) {
			return
		}
		fn(native.Uint16(b[2:])&^unix.NLA_F_NESTED, b[4:l])
		adv := (l + 3) &^ 3
		if adv > len(b) {
			return
		}
		b = b[adv:]
	}
}

// dump sends one dump request and calls fn for every answer. A dump that
// the kernel flags as interrupted (the table changed while it was read) is
// started again, so fn may see a prefix of the answers twice: reset is
// called before each attempt. (netlinksafe does this for the netlink
// library's calls; these dumps are carve's own, on its batch socket.)
func (s *nlSocket) dump(typ uint16, hdr []byte, reset func(), fn func(data []byte)) error {
	for attempt := 0; ; attempt++ {
		reset()
		intr, err := s.dumpOnce(typ, hdr, fn)
		if err != nil {
			return err
		}
		if !intr {
			return nil
		}
		if attempt == 4 {
			return errors.New("netlink dump interrupted 5 times in a row")
		}
	}
}

func (s *nlSocket) dumpOnce(typ uint16, hdr []byte, fn func(data []byte)) (interrupted bool, err error) {
	var b batch
	b.begin(typ, unix.NLM_F_DUMP)
	b.raw(hdr)
	b.end()
	s.seq++
	seq := s.seq
	native.PutUint32(b.buf[8:], seq)
	if err := unix.Sendto(s.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("netlink dump: %w", err)
	}
	for {
		n, _, err := unix.Recvfrom(s.fd, s.rbuf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("netlink dump: %w", err)
		}
		done := false
		var derr error
		forEachMsg(s.rbuf[:n], func(h *unix.NlMsghdr, data []byte) {
			if h.Seq != seq || done {
				return
			}
			if h.Flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch h.Type {
			case unix.NLMSG_DONE:
				done = true
			case unix.NLMSG_ERROR:
				if len(data) >= 4 {
					if errno := -int32(native.Uint32(data)); errno != 0 {
						derr = unix.Errno(errno)
					}
				}
				done = true
			default:
				fn(data)
			}
		})
		if derr != nil {
			return false, fmt.Errorf("netlink dump: %w", derr)
		}
		if done {
			return interrupted, nil
		}
	}
}

// readKernel reads back the neighbours, FDB entries and main-table routes
// of the VTEP with one dump each, into the same shape as remembered state.
func (s *nlSocket) readKernel(ifindex int) (cur *current, err error) {
	cur = &current{}
	// Neighbours (IPv4 and IPv6) of the VTEP.
	err = s.dump(unix.RTM_GETNEIGH, append(ndmsg(unix.AF_UNSPEC, 0, 0, 0), attrBytes(ndaIfindex, u32(uint32(ifindex)))...),
		func() { cur.neigh = map[netip.Addr]curNeigh{} },
		func(d []byte) {
			if len(d) < sizeofNdmsg {
				return
			}
			fam, idx, state := d[0], int(native.Uint32(d[4:])), native.Uint16(d[8:])
			if idx != ifindex || (fam != unix.AF_INET && fam != unix.AF_INET6) {
				return
			}
			var ip netip.Addr
			var ll []byte
			var proto byte
			forEachAttr(d[sizeofNdmsg:], func(t uint16, v []byte) {
				switch t {
				case ndaDst:
					ip, _ = netip.AddrFromSlice(v)
				case ndaLLAddr:
					ll = v
				case ndaProtocol:
					if len(v) > 0 {
						proto = v[0]
					}
				}
			})
			if !ip.IsValid() {
				return
			}
			c := curNeigh{ours: proto == Protocol}
			if len(ll) == 6 {
				copy(c.mac[:], ll)
				c.good = c.ours && state&unix.NUD_PERMANENT != 0
			}
			cur.neigh[ip.Unmap()] = c
		})
	if err != nil {
		return nil, fmt.Errorf("read neighbours: %w", err)
	}
	// FDB of the VTEP. An ifinfomsg-sized header (not an ndmsg) is how the
	// kernel's legacy FDB dump takes a port filter.
	ifi := make([]byte, sizeofIfinfomsg)
	ifi[0] = unix.AF_BRIDGE
	native.PutUint32(ifi[4:], uint32(ifindex))
	err = s.dump(unix.RTM_GETNEIGH, ifi,
		func() { cur.fdb = map[mac]curFDB{} },
		func(d []byte) {
			if len(d) < sizeofNdmsg {
				return
			}
			fam, idx, state, flags := d[0], int(native.Uint32(d[4:])), native.Uint16(d[8:]), d[10]
			if fam != unix.AF_BRIDGE || idx != ifindex || flags&unix.NTF_SELF == 0 {
				return
			}
			var m mac
			var ok, extra bool
			var dst netip.Addr
			forEachAttr(d[sizeofNdmsg:], func(t uint16, v []byte) {
				switch t {
				case ndaLLAddr:
					if len(v) == 6 {
						copy(m[:], v)
						ok = true
					}
				case ndaDst:
					dst, _ = netip.AddrFromSlice(v)
				case ndaPort, ndaVNI, ndaIfindex:
					// present only when the entry overrides the
					// device's port, VNI or outgoing interface
					extra = true
				}
			})
			// Multicast and all-zero entries (flooding defaults) are
			// not carve's: never listed, so never removed.
			if !ok || m[0]&1 != 0 || m == (mac{}) {
				return
			}
			// The kernel keeps a single destination per unicast MAC
			// (it refuses to append to one), so one message per MAC.
			cur.fdb[m] = curFDB{dst: dst.Unmap(), good: state&unix.NUD_PERMANENT != 0 && !extra && dst.IsValid()}
		})
	if err != nil {
		return nil, fmt.Errorf("read fdb: %w", err)
	}
	// Main-table routes, both families.
	err = s.dump(unix.RTM_GETROUTE, rtmsg(unix.AF_UNSPEC, 0, 0, 0, 0, 0),
		func() { cur.route = map[routeKey]curRoute{} },
		func(d []byte) {
			if len(d) < sizeofRtmsg {
				return
			}
			fam, dstLen, table, proto, typ := d[0], int(d[1]), uint32(d[4]), d[5], d[7]
			flags := native.Uint32(d[8:])
			if (fam != unix.AF_INET && fam != unix.AF_INET6) || flags&unix.RTM_F_CLONED != 0 {
				return
			}
			var dst, gw netip.Addr
			oif := 0
			var metric uint32
			multipath := false
			forEachAttr(d[sizeofRtmsg:], func(t uint16, v []byte) {
				switch t {
				case rtaDst:
					dst, _ = netip.AddrFromSlice(v)
				case rtaGateway:
					gw, _ = netip.AddrFromSlice(v)
				case rtaOif:
					if len(v) == 4 {
						oif = int(native.Uint32(v))
					}
				case rtaPriority:
					if len(v) == 4 {
						metric = native.Uint32(v)
					}
				case rtaTable:
					if len(v) == 4 {
						table = native.Uint32(v)
					}
				case rtaMultipath, rtaVia:
					multipath = true
				}
			})
			if table != unix.RT_TABLE_MAIN {
				return
			}
			if !dst.IsValid() { // default route
				if fam == unix.AF_INET {
					dst = netip.IPv4Unspecified()
				} else {
					dst = netip.IPv6Unspecified()
				}
			}
			k := routeKey{netip.PrefixFrom(dst, dstLen), metric}
			c := curRoute{via: gw, ours: proto == Protocol}
			c.good = c.ours && typ == unix.RTN_UNICAST && oif == ifindex && gw.IsValid() && !multipath &&
				(fam == unix.AF_INET6 || flags&unix.RTNH_F_ONLINK != 0)
			// Routes differing only in TOS share a key: carve's (a
			// correct one above all) wins the slot.
			if old, ok := cur.route[k]; ok && (old.good || (old.ours && !c.ours)) {
				return
			}
			cur.route[k] = c
		})
	if err != nil {
		return nil, fmt.Errorf("read routes: %w", err)
	}
	return cur, nil
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
