package ipamwire

import (
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// TestRoundTripProperty: every valid message of every kind, drawn at
// random, decodes from its encoding as itself, and a signed request or
// grant statement still verifies after the trip (and under no other key).
// The seed is printed; CARVE_IPAMWIRE_SEED replays one.
func TestRoundTripProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CARVE_IPAMWIRE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CARVE_IPAMWIRE_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (CARVE_IPAMWIRE_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x77697265))
	keys := []ed25519.PrivateKey{goldenKey("a"), goldenKey("b")}
	now := time.Unix(1700000000, 0)
	for i := range 500 {
		m := randomSpaceMessage(rng)
		key := keys[rng.IntN(2)]
		var g Grant
		switch m.Kind {
		case KindRequest:
			if rng.IntN(4) > 0 {
				SignSpaceRequest(key, &m)
			}
		case KindGrant:
			g = Grant{Overlay: m.Overlay, Prefix: m.GrantedPrefix(), Donor: m.From, Recipient: "r-" + m.From, RequestID: m.ID}
			m.Expires, m.GrantSig = SignGrant(key, m.ClusterID, g, now)
		}
		got, err := DecodeSpaceMessage(EncodeSpaceMessage(m))
		if err != nil {
			t.Fatalf("seed %d, message %d: %+v refused: %v", seed, i, m, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("seed %d, message %d: round trip\n%+v\n%+v", seed, i, m, got)
		}
		other := keys[0]
		if other.Equal(key) {
			other = keys[1]
		}
		pub, otherPub := key.Public().(ed25519.PublicKey), other.Public().(ed25519.PublicKey)
		switch {
		case m.Kind == KindRequest && m.Sig != "":
			if VerifySpaceRequest(pub, got) != nil || VerifySpaceRequest(otherPub, got) == nil {
				t.Fatalf("seed %d, message %d: the request's signature after the trip", seed, i)
			}
		case m.Kind == KindGrant:
			if VerifyGrant(pub, m.ClusterID, g, got, now) != nil || VerifyGrant(otherPub, m.ClusterID, g, got, now) == nil {
				t.Fatalf("seed %d, message %d: the grant statement after the trip", seed, i)
			}
		}
		r := randomRingMessage(rng)
		back, err := DecodeRingMessage(EncodeRingMessage(r))
		if err != nil {
			t.Fatalf("seed %d, message %d: %+v refused: %v", seed, i, r, err)
		}
		if !reflect.DeepEqual(back, r) {
			t.Fatalf("seed %d, message %d: round trip\n%+v\n%+v", seed, i, r, back)
		}
	}
}

func randomName(rng *rand.Rand, prefix string) string {
	return fmt.Sprintf("%s%d", prefix, rng.IntN(1000))
}

func randomFamily(rng *rand.Rand) (family string, width int) {
	if rng.IntN(2) == 0 {
		return "4", 32
	}
	return "6", 128
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

// randomSpaceMessage is a valid space message (unsigned) of a random kind.
func randomSpaceMessage(rng *rand.Rand) SpaceMessage {
	fam, width := randomFamily(rng)
	m := SpaceMessage{V: SpaceVersion, From: randomName(rng, "agent-"), ID: randomName(rng, "req-"), Overlay: randomName(rng, "o"), Family: fam}
	if rng.IntN(3) > 0 {
		m.ClusterID = randomName(rng, "cluster-")
	}
	switch rng.IntN(3) {
	case 0:
		m.Kind, m.Bits = KindRequest, 1+rng.IntN(width)
	case 1:
		bits := rng.IntN(width + 1)
		addr := netip.AddrFrom4([4]byte(randomBytes(rng, 4)))
		if width == 128 {
			addr = netip.AddrFrom16([16]byte(randomBytes(rng, 16)))
		}
		m.Kind, m.Prefix, m.Ring = KindGrant, netip.PrefixFrom(addr, bits).Masked().String(), randomBytes(rng, 1+rng.IntN(64))
	default:
		m.Kind, m.Reason = KindRefuse, []string{"", ReasonNoSpace, ReasonIPv6NotGranted, ReasonRecipientQuota, "cannot_grant: é ✓"}[rng.IntN(5)]
	}
	return m
}

// randomRingMessage is a valid ring message: deltas, a push, a digest or
// bucket hashes.
func randomRingMessage(rng *rand.Rand) RingMessage {
	var m RingMessage
	if rng.IntN(3) > 0 {
		m.ClusterID = randomName(rng, "cluster-")
	}
	for range rng.IntN(3) {
		fam, _ := randomFamily(rng)
		e := RingEntry{Overlay: randomName(rng, "o"), Family: fam, Ring: randomBytes(rng, 1+rng.IntN(64))}
		if rng.IntN(2) == 0 {
			e.N = 1 << rng.IntN(5)
			for b := range e.N {
				if rng.IntN(2) == 0 || b == e.N-1 && len(e.Buckets) == 0 {
					e.Buckets = append(e.Buckets, b)
				}
			}
		}
		m.Rings = append(m.Rings, e)
	}
	if rng.IntN(2) == 0 {
		m.From = randomName(rng, "agent-")
		for range 1 + rng.IntN(3) {
			fam, _ := randomFamily(rng)
			m.Digest = append(m.Digest, RingDigest{Overlay: randomName(rng, "o"), Family: fam, Hash: rng.Uint64()})
		}
	}
	for range rng.IntN(2) {
		fam, _ := randomFamily(rng)
		m.Buckets = append(m.Buckets, RingBuckets{Overlay: randomName(rng, "o"), Family: fam, Hashes: randomBytes(rng, 8<<rng.IntN(4))})
	}
	return m
}
