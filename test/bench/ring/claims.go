package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net/netip"
	"time"

	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/benchtable"
)

// benchClaims measures what attributed claims cost a receiver and a
// writer on a ring of 5,000 agents' leases: admitting a received change
// of one signed token (the ed25519 verification included) beside admitting
// it with no signature check, and the bytes of that change's encoding
// beside the same change unsigned.
func benchClaims(t *benchtable.Table) error {
	u := netip.MustParsePrefix("10.0.0.0/8")
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	pub := key.Public().(ed25519.PublicKey)
	sets := make([]ring.LeaseSet, 0, 5000)
	for i := range 5000 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)
		sets = append(sets, ring.LeaseSet{Owner: fmt.Sprintf("agent-%04d", i), Version: uint64(i + 1), Prefixes: []netip.Prefix{p}})
	}
	writer := func(sign bool) (*ring.Allocator, error) {
		a, err := ring.NewAllocator("agent-0042", u)
		if err != nil {
			return nil, err
		}
		if sign {
			a.SetSigner(func(msg []byte) []byte { return ed25519.Sign(key, msg) })
		}
		_, err = a.SeedSets(sets, nil)
		return a, err
	}
	receiver, err := ring.NewRing(u)
	if err != nil {
		return err
	}
	if _, err := receiver.SeedSets(sets, nil); err != nil {
		return err
	}
	change := func(sign bool) (*ring.Ring, error) {
		a, err := writer(sign)
		if err != nil {
			return nil, err
		}
		before := a.Ring()
		if _, err := a.Allocate(ring.Attachment{ContainerID: "c1", Interface: "eth0"}, netip.MustParsePrefix("10.0.42.0/24")); err != nil {
			return nil, err
		}
		if _, err := a.SyncFree(); err != nil {
			return nil, err
		}
		d, ok := a.Ring().Delta(before)
		if !ok {
			return nil, fmt.Errorf("the allocation changed no free count")
		}
		return d.Claims(), nil
	}
	signed, err := change(true)
	if err != nil {
		return err
	}
	unsigned, err := change(false)
	if err != nil {
		return err
	}
	verify := func(c ring.Claim) (string, bool) { return "bad_signature", ed25519.Verify(pub, c.Msg, c.Sig) }
	none := func(ring.Claim) (string, bool) { return "", true }
	var refusals int
	admit := func(check func(ring.Claim) (string, bool), r *ring.Ring) func() {
		return func() {
			_, refused := receiver.Admit(r, check)
			refusals += len(refused)
		}
	}
	withSig := measure(measureT, admit(verify, signed))
	withoutSig := measure(measureT, admit(none, unsigned))
	if refusals != 0 {
		return fmt.Errorf("the signed change was refused %d times", refusals)
	}
	t.Add(benchtable.Row{Name: "claims: admit a received change of one signed token (5,000 agents' leases)", Value: us(withSig), Unit: "µs/op",
		Baseline: "the same change unsigned, no signature check", BaseVal: us(withoutSig), Note: "ed25519 verification of the writer's claim"})
	t.Add(benchtable.Row{Name: "claims: encoded change of one free count", Value: float64(len(signed.Encode())), Unit: "B",
		Baseline: "the same change unsigned", BaseVal: float64(len(unsigned.Encode())), Note: "writer index and 64-byte signature per token"})
	return nil
}

// us is d in microseconds, with a fraction.
func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
