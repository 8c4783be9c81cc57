// Command ring prints the ring benchmarks (make bench): allocation in a
// nearly full range, merge of two 10,000-token rings, encode/decode of a
// 10,000-token ring, and the cost of attributed claims (a signed change's
// admission and size), each beside a simple baseline measured in the same
// run.
package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/benchtable"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench ring:", err)
		os.Exit(1)
	}
}

// measure runs fn in batches until at least d has passed and returns the
// time of one call.
func measure(d time.Duration, fn func()) time.Duration {
	n := 1
	for {
		start := time.Now()
		for range n {
			fn()
		}
		if el := time.Since(start); el >= d {
			return el / time.Duration(n)
		}
		n *= 2
	}
}

const (
	rangeBits = 16 // one range of 65,536 addresses
	freeLeft  = 1  // percent of the range left free ("nearly full")
	measureT  = 700 * time.Millisecond
)

func run() error {
	t := &benchtable.Table{Title: "ring"}
	if err := benchAllocate(t); err != nil {
		return err
	}
	a, b, err := buildRings()
	if err != nil {
		return err
	}
	if err := benchMerge(t, a, b); err != nil {
		return err
	}
	if err := benchCodec(t, a); err != nil {
		return err
	}
	if err := benchClaims(t); err != nil {
		return err
	}
	return t.Print(os.Stdout)
}

// mapAllocator is the baseline: a map of addresses in use, and allocation
// by scanning up from the bottom of the subnet for the lowest free address,
// as a first cut would do.
type mapAllocator struct {
	lo, hi   uint32
	used     map[uint32]ring.Attachment
	byAttach map[ring.Attachment]uint32
}

func (m *mapAllocator) allocate(at ring.Attachment) (uint32, bool) {
	if x, ok := m.byAttach[at]; ok {
		return x, true
	}
	for x := m.lo; x <= m.hi; x++ {
		if _, ok := m.used[x]; !ok {
			m.used[x] = at
			m.byAttach[at] = x
			return x, true
		}
	}
	return 0, false
}

func (m *mapAllocator) release(at ring.Attachment) {
	if x, ok := m.byAttach[at]; ok {
		delete(m.byAttach, at)
		delete(m.used, x)
	}
}

func benchAllocate(t *benchtable.Table) error {
	subnet := netip.MustParsePrefix("10.1.0.0/16")
	a, err := ring.NewAllocator("self", netip.MustParsePrefix("10.0.0.0/8"))
	if err != nil {
		return err
	}
	if _, err := a.Seed([]ring.Lease{{Owner: "self", Prefix: subnet, Version: 1}}, nil); err != nil {
		return err
	}
	base := &mapAllocator{lo: 0x0a010002, hi: 0x0a01fffe, used: map[uint32]ring.Attachment{}, byAttach: map[ring.Attachment]uint32{}}
	// Fill the range, then free 1% at random.
	const hosts = 1<<rangeBits - 3
	var live []ring.Attachment
	for i := range hosts {
		at := ring.Attachment{ContainerID: fmt.Sprint("c", i), Interface: "eth0"}
		addr, err := a.Allocate(at, subnet)
		if err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		// Fill the baseline straight at the same address: its scan is
		// quadratic over a whole fill.
		x := uint32(addr.As4()[0])<<24 | uint32(addr.As4()[1])<<16 | uint32(addr.As4()[2])<<8 | uint32(addr.As4()[3])
		base.used[x], base.byAttach[at] = at, x
		live = append(live, at)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for range hosts * freeLeft / 100 {
		i := rng.IntN(len(live))
		a.Release(live[i])
		base.release(live[i])
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
	}
	free, _ := a.FreeCount().Uint64()

	// One op: release a random holder, allocate for a new one.
	cycle := func(alloc func(ring.Attachment) bool, release func(ring.Attachment)) func() {
		rng := rand.New(rand.NewPCG(2, 2))
		next := 0
		pool := slices.Clone(live)
		return func() {
			i := rng.IntN(len(pool))
			release(pool[i])
			at := ring.Attachment{ContainerID: fmt.Sprint("n", next), Interface: "eth0"}
			next++
			if !alloc(at) {
				panic("allocation failed in a range with free addresses")
			}
			pool[i] = at
		}
	}
	ours := measure(measureT, cycle(
		func(at ring.Attachment) bool { _, err := a.Allocate(at, subnet); return err == nil },
		func(at ring.Attachment) { a.Release(at) }))
	theirs := measure(measureT, cycle(
		func(at ring.Attachment) bool { _, ok := base.allocate(at); return ok },
		base.release))
	t.Add(benchtable.Row{
		Name:  "allocate+release, one /16 range 99% full",
		Value: 1 / ours.Seconds(), Unit: "ops/s",
		Baseline: "map allocator, lowest-free scan", BaseVal: 1 / theirs.Seconds(),
		HigherIsBetter: true,
		Note:           fmt.Sprintf("%d of 65,536 free; lowest free address each time (free holes drift up, so the scan grows)", free),
	})
	return nil
}

// buildRings makes two 10,000-token rings of 10.0.0.0/8 that share a lease
// table and differ in their writes: free counts reported at different times
// and grants of holes, as two peers that have not gossiped for a while.
func buildRings() (*ring.Ring, *ring.Ring, error) {
	base, err := ring.NewRing(netip.MustParsePrefix("10.0.0.0/8"))
	if err != nil {
		return nil, nil, err
	}
	var leases []ring.Lease
	for i := range 4000 {
		// every other /24, so that each lease has a start and an end token
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 7), byte(i&127) * 2, 0}), 24)
		leases = append(leases, ring.Lease{Owner: fmt.Sprintf("agent-%03d", i%100), Prefix: p, Version: uint64(i + 1)})
	}
	if _, err := base.Seed(leases, nil); err != nil {
		return nil, nil, err
	}
	mk := func(seed uint64) (*ring.Ring, error) {
		r := base.Clone()
		rng := rand.New(rand.NewPCG(seed, 3))
		free := map[string]map[netip.Addr]ring.Uint128{}
		for _, l := range leases {
			if free[l.Owner] == nil {
				free[l.Owner] = map[netip.Addr]ring.Uint128{}
			}
			free[l.Owner][l.Prefix.Addr()] = ring.U128(uint64(rng.IntN(256)))
		}
		for owner, f := range free {
			if _, err := r.ReportFree(owner, f); err != nil {
				return nil, err
			}
		}
		for len(r.Tokens()) < 10000 {
			for range 20 {
				l := leases[rng.IntN(len(leases))]
				hole := netip.PrefixFrom(l.Prefix.Addr().Next().Next().Next().Next(), 30)
				to := fmt.Sprintf("agent-%03d", rng.IntN(100))
				if to == l.Owner {
					continue
				}
				// A hole may already be granted: those fail, skip them.
				_ = r.Grant(l.Owner, to, hole)
			}
		}
		return r, nil
	}
	a, err := mk(1)
	if err != nil {
		return nil, nil, err
	}
	b, err := mk(2)
	if err != nil {
		return nil, nil, err
	}
	return a, b, nil
}

// mapMerge is the baseline merge: tokens into a map by start, the higher
// version winning, then sorted back into a list.
func mapMerge(a, b []ring.Token) []ring.Token {
	m := make(map[netip.Addr]ring.Token, len(a)+len(b))
	for _, l := range [][]ring.Token{a, b} {
		for _, t := range l {
			if cur, ok := m[t.Start]; !ok || t.Version > cur.Version {
				m[t.Start] = t
			}
		}
	}
	out := make([]ring.Token, 0, len(m))
	for _, t := range m {
		out = append(out, t)
	}
	slices.SortFunc(out, func(x, y ring.Token) int { return x.Start.Compare(y.Start) })
	return out
}

func benchMerge(t *benchtable.Table, a, b *ring.Ring) error {
	var mergeErr error
	ours := measure(measureT, func() {
		if _, err := a.Clone().Merge(b); err != nil {
			mergeErr = err
		}
	})
	if mergeErr != nil {
		return mergeErr
	}
	ta, tb := a.Tokens(), b.Tokens()
	theirs := measure(measureT, func() { mapMerge(ta, tb) })
	m := a.Clone()
	if _, err := m.Merge(b); err != nil {
		return err
	}
	t.Add(benchtable.Row{
		Name:  "merge two 10,000-token rings",
		Value: float64(ours.Microseconds()), Unit: "µs/op",
		Baseline: "map merge of the token lists", BaseVal: float64(theirs.Microseconds()),
		Note: fmt.Sprintf("%d and %d tokens -> %d; ours also joins leases and rebuilds the view", len(ta), len(tb), len(m.Tokens())),
	})
	return nil
}

func benchCodec(t *benchtable.Table, r *ring.Ring) error {
	enc := r.Encode()
	toks := r.Tokens()
	js, err := json.Marshal(toks)
	if err != nil {
		return err
	}
	encT := measure(measureT, func() { r.Encode() })
	jsEncT := measure(measureT, func() { _, _ = json.Marshal(toks) })
	var decErr error
	decT := measure(measureT, func() {
		if _, err := ring.Decode(enc); err != nil {
			decErr = err
		}
	})
	if decErr != nil {
		return decErr
	}
	jsDecT := measure(measureT, func() {
		var out []ring.Token
		_ = json.Unmarshal(js, &out)
	})
	note := fmt.Sprintf("%d tokens: %d bytes (%.1f B/token) vs JSON %d bytes", len(toks), len(enc), float64(len(enc))/float64(len(toks)), len(js))
	t.Add(benchtable.Row{
		Name: "encode a 10,000-token ring", Value: float64(encT.Microseconds()), Unit: "µs/op",
		Baseline: "encoding/json of its tokens", BaseVal: float64(jsEncT.Microseconds()), Note: note,
	})
	t.Add(benchtable.Row{
		Name: "decode (and validate) a 10,000-token ring", Value: float64(decT.Microseconds()), Unit: "µs/op",
		Baseline: "encoding/json of its tokens", BaseVal: float64(jsDecT.Microseconds()),
		Note: "ours validates everything and rebuilds the view",
	})
	return nil
}
