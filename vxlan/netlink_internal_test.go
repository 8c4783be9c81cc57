package vxlan

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestBatchErrorMapping sends batches split into many small chunks, with
// messages the kernel refuses in between, and checks that every error lands
// on its own entry and every other entry is programmed.
func TestBatchErrorMapping(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	h := lab.Hosts()[0]
	nh, err := h.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vt"}, VxlanId: 5, Port: 4789, SrcAddr: net.ParseIP("198.18.0.11")}
	if err := nh.LinkAdd(vx); err != nil {
		t.Fatal(err)
	}
	l, _ := nh.LinkByName("vt")
	if err := nh.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	idx := l.Attrs().Index

	s, err := openSocket(h.Do)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	s.maxBatch = 7

	const n = 100
	bad := func(i int) bool { return i%9 == 4 || i == n-1 } // includes a chunk's closing message
	var b batch
	for i := range n {
		target := idx
		if bad(i) {
			target = 999999
		}
		b.neighSet(target, netip.AddrFrom4([4]byte{100, 64, 1, byte(i)}), mac{0x70, 0xb3, 0xd5, 0x40, 1, byte(i)})
	}
	errs := s.exec(&b, func() error { return nil })
	good := 0
	for i, err := range errs {
		if bad(i) != (err != nil) {
			t.Fatalf("entry %d: err %v, bad %v", i, err, bad(i))
		}
		if err != nil && !errors.Is(err, unix.ENODEV) {
			t.Fatalf("entry %d: %v, want ENODEV", i, err)
		}
		if err == nil {
			good++
		}
	}
	cur, err := s.readKernel(idx)
	if err != nil {
		t.Fatal(err)
	}
	// Only the batch's range counts: the kernel may add entries of its own
	// to a device just set up (seen once under load: 89 for 88).
	programmed := netip.MustParsePrefix("100.64.1.0/24")
	for ip := range cur.neigh {
		if !programmed.Contains(ip) {
			delete(cur.neigh, ip)
		}
	}
	if len(cur.neigh) != good {
		t.Fatalf("kernel has %d neighbours in %s, want %d", len(cur.neigh), programmed, good)
	}
	for ip, c := range cur.neigh {
		if !c.good || !c.ours || c.mac[5] != ip.As4()[3] {
			t.Fatalf("neighbour %s: %+v", ip, c)
		}
	}

	// Deleting what is gone reports "gone", which callers treat as done.
	b = batch{}
	b.neighDel(idx, netip.MustParseAddr("100.64.9.9"))
	b.routeDel(routeKey{netip.MustParsePrefix("10.9.9.0/24"), 1030})
	for _, err := range s.exec(&b, func() error { return nil }) {
		if !isGone(err) {
			t.Fatalf("delete of a missing entry: %v", err)
		}
	}

	// A canceled reconcile stops before sending anything more.
	b = batch{}
	b.neighDel(idx, netip.MustParseAddr("100.64.1.0"))
	stop := errors.New("stop")
	if errs := s.exec(&b, func() error { return stop }); !errors.Is(errs[0], stop) {
		t.Fatalf("canceled: %v", errs[0])
	}
	cur, err = s.readKernel(idx)
	if err != nil {
		t.Fatal(err)
	}
	inRange := 0
	for ip := range cur.neigh {
		if programmed.Contains(ip) {
			inRange++ // the batch's range only, as above
		}
	}
	if inRange != good {
		t.Fatalf("canceled batch was sent: %d neighbours in %s, want %d", inRange, programmed, good)
	}
}
