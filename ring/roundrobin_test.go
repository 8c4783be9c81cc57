package ring

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// TestAllocatorRoundRobin walks the allocation order: after the last address
// handed out, wrapping, so that a freed address comes back last.
func TestAllocatorRoundRobin(t *testing.T) {
	bridge := "10.0.1.0/29" // hosts .2 to .6
	type op struct {
		alloc   string // attachment to allocate ("" for none)
		release string // attachment to release ("" for none)
		claim   string // with alloc: claim this address instead
		want    string // the address allocated; "" for ErrFull
	}
	tests := []struct {
		name string
		ops  []op
	}{
		{"a freed address is not reused at once", []op{
			{alloc: "c1", want: "10.0.1.2"}, {alloc: "c2", want: "10.0.1.3"},
			{release: "c1"}, {alloc: "c3", want: "10.0.1.4"},
		}},
		{"the freed address comes back after the others", []op{
			{alloc: "c1", want: "10.0.1.2"}, {release: "c1"},
			{alloc: "c2", want: "10.0.1.3"}, {alloc: "c3", want: "10.0.1.4"},
			{alloc: "c4", want: "10.0.1.5"}, {alloc: "c5", want: "10.0.1.6"},
			{alloc: "c6", want: "10.0.1.2"}, {alloc: "c7"},
		}},
		{"the only free address is reused", []op{
			{alloc: "c1", want: "10.0.1.2"}, {alloc: "c2", want: "10.0.1.3"},
			{alloc: "c3", want: "10.0.1.4"}, {alloc: "c4", want: "10.0.1.5"},
			{alloc: "c5", want: "10.0.1.6"}, {release: "c3"},
			{alloc: "c6", want: "10.0.1.4"},
		}},
		{"wraps past held addresses", []op{
			{alloc: "c1", want: "10.0.1.2"}, {alloc: "c2", want: "10.0.1.3"},
			{alloc: "c3", want: "10.0.1.4"}, {alloc: "c4", want: "10.0.1.5"},
			{alloc: "c5", want: "10.0.1.6"}, {release: "c2"}, {release: "c4"},
			{alloc: "c6", want: "10.0.1.3"}, {alloc: "c7", want: "10.0.1.5"},
		}},
		{"a claim does not move the position", []op{
			{alloc: "c1", want: "10.0.1.2"}, {alloc: "c2", claim: "10.0.1.5", want: "10.0.1.5"},
			{alloc: "c3", want: "10.0.1.3"}, {alloc: "c4", want: "10.0.1.4"},
			{alloc: "c5", want: "10.0.1.6"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := seededAllocator(t, "a")
			for i, o := range tt.ops {
				if o.release != "" {
					if _, ok := a.Release(Attachment{o.release, "eth0"}); !ok {
						t.Fatalf("op %d: release %s: held nothing", i, o.release)
					}
					continue
				}
				at := Attachment{o.alloc, "eth0"}
				var got netip.Addr
				var err error
				if o.claim != "" {
					got, err = ip(t, o.claim), a.Claim(at, ip(t, o.claim))
				} else {
					got, err = a.Allocate(at, pfx(t, bridge))
				}
				if o.want == "" {
					if !errors.Is(err, ErrFull) {
						t.Fatalf("op %d: allocate %s = %v, %v; want ErrFull", i, o.alloc, got, err)
					}
					continue
				}
				if err != nil || got != ip(t, o.want) {
					t.Fatalf("op %d: allocate %s = %v, %v; want %s", i, o.alloc, got, err, o.want)
				}
			}
			checkInvariant(t, a)
		})
	}
}

// TestAllocatorRoundRobinRestart: an allocator rebuilt from its state (what
// a restarted agent does) has no position and starts after the highest
// address in use; a subnet given away and back starts afresh.
func TestAllocatorRoundRobinRestart(t *testing.T) {
	a := seededAllocator(t, "a")
	bridge := pfx(t, "10.0.1.0/28")
	for _, c := range []string{"c1", "c2", "c3", "c4"} { // .2 .3 .4 .5
		if _, err := a.Allocate(Attachment{c, "eth0"}, bridge); err != nil {
			t.Fatal(err)
		}
	}
	a.Release(Attachment{"c4", "eth0"})
	a.Release(Attachment{"c2", "eth0"})
	b, err := RestoreAllocator(a.State())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Allocate(Attachment{"c5", "eth0"}, bridge); err != nil || got != ip(t, "10.0.1.5") {
		t.Fatalf("first allocation after a restart = %v, %v; want 10.0.1.5, after the highest in use", got, err)
	}
	if got, _ := b.Allocate(Attachment{"c6", "eth0"}, bridge); got != ip(t, "10.0.1.6") {
		t.Fatalf("second allocation after a restart = %v; want 10.0.1.6", got)
	}

	// Grant the /28 away and take it back: the position is forgotten.
	c := seededAllocator(t, "a")
	if _, err := c.Allocate(Attachment{"c1", "eth0"}, bridge); err != nil {
		t.Fatal(err)
	}
	c.Release(Attachment{"c1", "eth0"})
	if err := c.Grant("b", bridge); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.last[bridge]; ok {
		t.Fatalf("position of %v kept after granting it away", bridge)
	}
}

// TestRoundRobinProperty runs random allocations, claims and releases over
// two bridges and checks, against a model of who holds what:
//   - no address is handed out (or claimed) while another holds it;
//   - an address handed out before is not handed out again while its bridge
//     has a free address never taken (allocated or claimed) yet;
//   - the round-robin lap: when x is freed, let c be the address last handed
//     out in its bridge; every address free then in the cycle after c and
//     before x is taken (allocated or claimed) before x is handed out again.
//     When everything handed out after x is still held at its release, that
//     is every other free address of the bridge: an address freed now is the
//     last to be reused.
func TestRoundRobinProperty(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 8, rand.Uint64()}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Logf("seed %d", seed)
			checkRoundRobin(t, seed)
		})
	}
}

func checkRoundRobin(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 28))
	a := seededAllocator(t, "a")
	bridges := []netip.Prefix{pfx(t, "10.0.1.0/27"), pfx(t, "10.0.1.32/28")}
	hosts := map[netip.Prefix][]netip.Addr{}
	bridgeOf := map[netip.Addr]netip.Prefix{}
	for _, b := range bridges {
		for x, end := b.Addr().Next().Next(), lastAddr(b).Prev(); x.Compare(end) <= 0; x = x.Next() {
			hosts[b] = append(hosts[b], x)
			bridgeOf[x] = b
		}
	}
	held := map[netip.Addr]Attachment{}
	everUsed := map[netip.Addr]bool{}  // allocated or claimed
	handedOut := map[netip.Addr]bool{} // allocated
	last := map[netip.Prefix]netip.Addr{}
	// owed[x]: the addresses that must be taken before x is handed out again.
	owed := map[netip.Addr]map[netip.Addr]bool{}
	take := func(x netip.Addr, at Attachment, how string, step int) {
		if other, ok := held[x]; ok {
			t.Fatalf("seed %d step %d: %s %v to %v while %v holds it", seed, step, how, x, at, other)
		}
		for y, set := range owed {
			delete(set, x)
			if y == x && how == "allocate" && len(set) > 0 {
				t.Fatalf("seed %d step %d: %v handed out again before %v (free at its release, ahead of it)", seed, step, x, set)
			}
		}
		delete(owed, x)
		held[x] = at
		everUsed[x] = true
	}
	next := 0
	for step := range 4000 {
		switch op := rng.IntN(10); {
		case op < 5: // allocate
			b := bridges[rng.IntN(len(bridges))]
			next++
			at := Attachment{fmt.Sprint("c", next), "eth0"}
			x, err := a.Allocate(at, b)
			free := 0
			for _, h := range hosts[b] {
				if _, ok := held[h]; !ok {
					free++
				}
			}
			if free == 0 {
				if !errors.Is(err, ErrFull) {
					t.Fatalf("seed %d step %d: Allocate in a full %v = %v, %v", seed, step, b, x, err)
				}
				continue
			}
			if err != nil || bridgeOf[x] != b {
				t.Fatalf("seed %d step %d: Allocate(%v) = %v, %v", seed, step, b, x, err)
			}
			if handedOut[x] {
				for _, h := range hosts[b] {
					if _, busy := held[h]; !busy && !everUsed[h] {
						t.Fatalf("seed %d step %d: %v handed out again while %v never was", seed, step, x, h)
					}
				}
			}
			take(x, at, "allocate", step)
			handedOut[x] = true
			last[b] = x
		case op < 6: // claim a random host
			b := bridges[rng.IntN(len(bridges))]
			x := hosts[b][rng.IntN(len(hosts[b]))]
			next++
			at := Attachment{fmt.Sprint("c", next), "eth0"}
			err := a.Claim(at, x)
			if _, busy := held[x]; busy != errors.Is(err, ErrAddressInUse) || (!busy && err != nil) {
				t.Fatalf("seed %d step %d: Claim(%v) = %v; held %v", seed, step, x, err, busy)
			}
			if err == nil {
				take(x, at, "claim", step)
			}
		default: // release a random holder
			if len(held) == 0 {
				continue
			}
			var xs []netip.Addr
			for _, b := range bridges {
				for _, h := range hosts[b] {
					if _, ok := held[h]; ok {
						xs = append(xs, h)
					}
				}
			}
			x := xs[rng.IntN(len(xs))]
			if got, ok := a.Release(held[x]); !ok || got != x {
				t.Fatalf("seed %d step %d: Release(%v) = %v, %v; want %v", seed, step, held[x], got, ok, x)
			}
			delete(held, x)
			b := bridgeOf[x]
			c, ok := last[b]
			if !ok {
				continue
			}
			ahead := map[netip.Addr]bool{}
			hs := hosts[b]
			ci := slices.Index(hs, c)
			for k := 1; k < len(hs); k++ {
				y := hs[(ci+k)%len(hs)]
				if y == x {
					break
				}
				if _, busy := held[y]; !busy {
					ahead[y] = true
				}
			}
			owed[x] = ahead
		}
		checkInvariant(t, a)
	}
}
