package vxlan

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

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
			c := curRoute{via: gw, oif: oif, ours: proto == Protocol}
			c.good = c.ours && typ == unix.RTN_UNICAST && oif != 0 && gw.IsValid() && !multipath &&
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
