package fastpath_test

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/fastpath"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// devices makes n veths (this kernel may have no dummy links) in a
// namespace of its own and returns it with their ifindexes.
func devices(t *testing.T, n int) (*netnslab.Namespace, []int) {
	t.Helper()
	lab := netnslab.ForTest(t, netnslab.Options{})
	ns, err := lab.AddNamespace("fp")
	if err != nil {
		t.Fatal(err)
	}
	nh, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	var idx []int
	for i := range n {
		name := "fp" + string(rune('a'+i))
		if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		l, err := nh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		idx = append(idx, l.Attrs().Index)
	}
	return ns, idx
}

func newPath(t *testing.T) *fastpath.Path {
	t.Helper()
	p, err := fastpath.New()
	if err != nil {
		t.Fatalf("load the fast path (the verifier must accept it on this kernel): %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestSyncIsReadBack: random sequences of wanted states, each synced
// (sometimes with a full read-back) and then read back from the kernel:
// the blocks map holds exactly what was wanted, and the program is
// attached at exactly the devices named. Printed seed.
func TestSyncIsReadBack(t *testing.T) {
	ns, idx := devices(t, 4)
	p := newPath(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for step := range 30 {
		want := fastpath.Want{Blocks: map[netip.Prefix]fastpath.Target{}, Ports: map[int]fastpath.Port{}}
		for range rng.IntN(6) {
			pfx := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(4)), 0}), 24)
			want.Blocks[pfx] = fastpath.Target{Ifindex: idx[rng.IntN(2)], Kind: fastpath.Kind(1 + rng.IntN(2))}
		}
		if rng.IntN(2) == 0 {
			want.Ports[idx[2+rng.IntN(2)]] = fastpath.Port{Bridge: idx[1], MAC: [6]byte{2, 0, 0, 0, 0, byte(step)}}
		}
		full := rng.IntN(3) == 0
		if err := ns.Do(func() error { return p.Sync(want, full) }); err != nil {
			t.Fatalf("step %d: sync: %v", step, err)
		}
		got, err := p.Blocks()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want.Blocks) {
			t.Fatalf("step %d: the kernel holds %v, want %v", step, got, want.Blocks)
		}
		for pfx, tg := range want.Blocks {
			if got[pfx] != tg {
				t.Fatalf("step %d: %s -> %v in the kernel, want %v", step, pfx, got[pfx], tg)
			}
		}
		named := map[int]bool{}
		for _, tg := range want.Blocks {
			named[tg.Ifindex] = true
		}
		for i := range want.Ports {
			named[i] = true
		}
		err = ns.Do(func() error {
			for _, i := range idx {
				if got := p.Attached(i); got != named[i] {
					t.Errorf("step %d: attached at ifindex %d: %v, want %v", step, i, got, named[i])
				}
			}
			return nil
		})
		if err != nil || t.Failed() {
			t.FailNow()
		}
	}
}

// TestSyncRefusesIPv6: an IPv6 prefix is an error for that entry only.
func TestSyncRefusesIPv6(t *testing.T) {
	ns, idx := devices(t, 1)
	p := newPath(t)
	v4 := netip.MustParsePrefix("10.1.0.0/24")
	want := fastpath.Want{Blocks: map[netip.Prefix]fastpath.Target{
		netip.MustParsePrefix("fd00::/64"): {Ifindex: idx[0], Kind: fastpath.KindPeer},
		v4:                                 {Ifindex: idx[0], Kind: fastpath.KindPeer},
	}}
	err := ns.Do(func() error { return p.Sync(want, false) })
	if err == nil {
		t.Fatal("an IPv6 prefix was taken")
	}
	got, rerr := p.Blocks()
	if rerr != nil {
		t.Fatal(rerr)
	}
	if len(got) != 1 || got[v4] != want.Blocks[v4] {
		t.Errorf("the kernel holds %v, want only %s", got, v4)
	}
	if !strings.Contains(err.Error(), "fd00::/64") {
		t.Errorf("the error does not name the prefix: %v", err)
	}
}
