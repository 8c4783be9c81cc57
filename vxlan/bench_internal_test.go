package vxlan

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
)

func benchDesired(n int) *Desired {
	d := &Desired{VTEP: VTEP{Name: "vtep1024", VNI: 1024, Port: 4789, Local: netip.MustParseAddr("198.18.0.11"),
		MAC: net.HardwareAddr{0x70, 0xb3, 0xd5, 0x40, 0, 1}, MTU: 1450, Address: netip.MustParsePrefix("100.64.0.1/16")}}
	for i := 2; i < n+2; i++ {
		d.Peers = append(d.Peers, Peer{ID: fmt.Sprintf("a%d", i),
			UnderlayIP: netip.AddrFrom4([4]byte{198, 18, byte((10 + i) >> 8), byte(10 + i)}),
			VTEPIP:     netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)}),
			VTEPMAC:    net.HardwareAddr{0x70, 0xb3, 0xd5, 0x40, byte(i >> 8), byte(i)},
			Subnets:    []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>8), byte(i), 0}), 24)}})
	}
	return d
}

// BenchmarkIncrementalDiff is the userspace part of an Apply at 10,000
// peers with one change: building the desired entries and diffing them
// against the applied ones.
func BenchmarkIncrementalDiff(b *testing.B) {
	prev := buildEntries(benchDesired(10000), &Report{}, 0, nil)
	cur := &current{neigh: map[netip.Addr]curNeigh{}, fdb: map[mac]curFDB{}, route: map[routeKey]curRoute{}}
	for k, v := range prev.neigh {
		cur.neigh[k] = curNeigh{mac: v.mac, ours: true, good: true}
	}
	for k, v := range prev.fdb {
		cur.fdb[k] = curFDB{dst: v.dst, good: true}
	}
	for k, v := range prev.route {
		cur.route[k] = curRoute{via: v.via, ours: true, good: true}
	}
	next := benchDesired(10001)
	for b.Loop() {
		var rep Report
		want := buildEntries(next, &rep, 0, nil)
		p := diff(cur, want)
		if len(p.routeSet) != 1 {
			b.Fatal(len(p.routeSet))
		}
	}
}
