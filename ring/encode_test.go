package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// enc writes the encoding field by field, so that tests can forge any
// malformed ring.
type enc struct {
	format, family byte
	addr           []byte
	bits           byte
	owners         []string
	toks           []encTok
	leases         []encLease
	sets           []encTomb
	tombs          []encTomb
	trailing       []byte
	rawVarint      []byte // replaces the token count when set
}

type encTok struct {
	delta                 Uint128
	owner, epoch, counter uint64
	free                  Uint128
	signer                uint64
	sig                   []byte
}

type encLease struct {
	delta        Uint128
	bits         byte
	owner, index uint64
}

type encTomb struct{ owner, index uint64 }

func (e enc) bytes() []byte {
	b := []byte{e.format, e.family}
	b = append(b, e.addr...)
	b = append(b, e.bits)
	b = binary.AppendUvarint(b, uint64(len(e.owners)))
	for _, o := range e.owners {
		b = binary.AppendUvarint(b, uint64(len(o)))
		b = append(b, o...)
	}
	if e.rawVarint != nil {
		b = append(b, e.rawVarint...)
	} else {
		b = binary.AppendUvarint(b, uint64(len(e.toks)))
	}
	for _, t := range e.toks {
		b = appendU128(b, t.delta)
		b = binary.AppendUvarint(b, t.owner)
		b = binary.AppendUvarint(b, t.epoch)
		b = binary.AppendUvarint(b, t.counter)
		b = appendU128(b, t.free)
		b = binary.AppendUvarint(b, t.signer)
		b = binary.AppendUvarint(b, uint64(len(t.sig)))
		b = append(b, t.sig...)
	}
	b = binary.AppendUvarint(b, uint64(len(e.leases)))
	for _, l := range e.leases {
		b = appendU128(b, l.delta)
		b = append(b, l.bits)
		b = binary.AppendUvarint(b, l.owner)
		b = binary.AppendUvarint(b, l.index)
	}
	b = binary.AppendUvarint(b, uint64(len(e.sets)))
	for _, t := range e.sets {
		b = binary.AppendUvarint(b, t.owner)
		b = binary.AppendUvarint(b, t.index)
	}
	b = binary.AppendUvarint(b, uint64(len(e.tombs)))
	for _, t := range e.tombs {
		b = binary.AppendUvarint(b, t.owner)
		b = binary.AppendUvarint(b, t.index)
	}
	return append(b, e.trailing...)
}

// validEnc is 10.0.0.0/16 with a owning 10.0.1.0/24 (lease 5, then a free
// count report it signed) and a /26 of it in a lease of c at 6 (its lease
// set), and b deleted at 7.
func validEnc() enc {
	return enc{
		format: formatV3, family: 4, addr: []byte{10, 0, 0, 0}, bits: 16,
		owners: []string{"a", "b", "c"},
		toks: []encTok{
			{U128(0), 0, 0, 0, U128(0), 0, nil},
			{U128(256), 1, 5, 1, U128(100), 1, bytes.Repeat([]byte{7}, 64)},
			{U128(256), 0, 0, 0, U128(0), 0, nil},
		},
		leases: []encLease{{U128(256), 24, 1, 5}, {U128(64), 26, 3, 6}},
		sets:   []encTomb{{3, 6}},
		tombs:  []encTomb{{2, 7}},
	}
}

func TestDecodeValid(t *testing.T) {
	b := validEnc().bytes()
	r, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !bytes.Equal(r.Encode(), b) {
		t.Fatalf("re-encoding differs:\n%x\n%x", r.Encode(), b)
	}
	if o := ownerOf(t, r, "10.0.1.9"); o != "a" {
		t.Fatalf("owner = %q", o)
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*enc)
	}{
		{"unknown format", func(e *enc) { e.format = 4 }},
		{"format 1", func(e *enc) { e.format = 1 }},
		{"format 2 (tokens without writer)", func(e *enc) { e.format = 2 }},
		{"signer index out of range", func(e *enc) { e.toks[1].signer = 4 }},
		{"signature without signer", func(e *enc) { e.toks[2].sig = []byte{1} }},
		{"signature too long", func(e *enc) { e.toks[1].sig = make([]byte, maxSigLen+1) }},
		{"signature truncated", func(e *enc) { e.toks[2].signer, e.toks[2].sig, e.trailing = 1, nil, []byte{9} }},
		{"unknown family", func(e *enc) { e.family = 5 }},
		{"universe length too long", func(e *enc) { e.bits = 33 }},
		{"universe host bits", func(e *enc) { e.addr = []byte{10, 0, 0, 1} }},
		{"ipv6 whole space", func(e *enc) { e.family, e.addr, e.bits = 6, make([]byte, 16), 0 }},
		{"empty owner", func(e *enc) { e.owners[0] = "" }},
		{"owner too long", func(e *enc) { e.owners[1] = string(make([]byte, 256)) }},
		{"owners unsorted", func(e *enc) { e.owners[0], e.owners[1] = "b", "a" }},
		{"owners repeated", func(e *enc) { e.owners[1] = "a" }},
		{"owner unused", func(e *enc) { e.owners = append(e.owners, "c") }},
		{"no token", func(e *enc) { e.toks = nil }},
		{"first token not at 0", func(e *enc) { e.toks[0].delta = U128(1) }},
		{"repeated token", func(e *enc) { e.toks[2].delta = U128(0) }},
		{"token outside universe", func(e *enc) { e.toks[2].delta = U128(1 << 16) }},
		{"token delta wraps", func(e *enc) { e.toks[2].delta = Uint128{Hi: ^uint64(0), Lo: ^uint64(0)} }},
		{"owner index out of range", func(e *enc) { e.toks[1].owner = 4 }},
		{"epoch too big", func(e *enc) { e.toks[1].epoch = 1 << 32 }},
		{"counter too big", func(e *enc) { e.toks[1].counter = 1 << 32 }},
		{"free count above the universe's end", func(e *enc) { e.toks[1].free = U128(1<<16 - 256 + 1) }},
		{"free count above last range size", func(e *enc) { e.toks[2].owner, e.toks[2].free = 2, U128(1<<16-512+1) }},
		{"lease misaligned", func(e *enc) { e.leases[0].delta = U128(257) }},
		{"lease larger than universe", func(e *enc) { e.leases[0].delta, e.leases[0].bits = U128(0), 15 }},
		{"lease length too long", func(e *enc) { e.leases[0].bits = 33 }},
		{"lease outside universe", func(e *enc) { e.leases[0].delta = U128(1 << 16) }},
		{"lease without owner", func(e *enc) { e.leases[0].owner = 0 }},
		{"lease index 0", func(e *enc) { e.leases[0].index = 0 }},
		{"lease index too big", func(e *enc) { e.leases[0].index = 1 << 32 }},
		{"lease delta wraps", func(e *enc) { e.leases[1].delta = Uint128{Hi: ^uint64(0), Lo: ^uint64(0) - 255} }},
		{"leases unsorted", func(e *enc) { e.leases[1].delta, e.leases[1].bits = U128(0), 23 }},
		{"lease repeated", func(e *enc) { e.leases[1] = encLease{U128(0), 24, 1, 6} }},
		{"lease below its owner's set", func(e *enc) { e.sets[0].index = 7 }},
		{"lease set without owner", func(e *enc) { e.sets[0].owner = 0 }},
		{"lease set index 0", func(e *enc) { e.sets[0].index = 0 }},
		{"lease sets unsorted", func(e *enc) { e.sets = []encTomb{{3, 6}, {1, 3}} }},
		{"tombstone without owner", func(e *enc) { e.tombs[0].owner = 0 }},
		{"tombstones unsorted", func(e *enc) { e.tombs = []encTomb{{2, 7}, {1, 3}} }},
		{"tombstone index 0", func(e *enc) { e.tombs[0].index = 0 }},
		{"trailing bytes", func(e *enc) { e.trailing = []byte{0} }},
		{"non-minimal varint", func(e *enc) { e.rawVarint = []byte{0x83, 0x00} }},
		{"token count beyond data", func(e *enc) { e.rawVarint = binary.AppendUvarint(nil, 1<<40) }},
		{"truncated", func(e *enc) {
			e.tombs = nil
			e.trailing = nil
			e.leases = nil
			e.toks = e.toks[:1]
			e.rawVarint = []byte{3}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := validEnc()
			tt.mutate(&e)
			r, err := Decode(e.bytes())
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode = %v, %v; want ErrInvalid", r, err)
			}
		})
	}
	// Every prefix of a valid encoding is refused.
	b := validEnc().bytes()
	for n := range len(b) {
		if _, err := Decode(b[:n]); err == nil {
			t.Fatalf("Decode accepted the first %d of %d bytes", n, len(b))
		}
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	v4 := newRing(t, "10.128.0.0/9")
	mustSeed(t, v4, []Lease{{"agent-1", pfx(t, "10.128.0.0/24"), 3}, {"agent-2", pfx(t, "10.255.255.0/24"), 4}, {"agent-3", pfx(t, "10.200.0.0/24"), 8}},
		[]Tombstone{{"agent-3", 9}})
	if err := v4.Grant("agent-1", "agent-2", pfx(t, "10.128.0.64/26")); err != nil {
		t.Fatal(err)
	}
	v6 := newRing(t, "fd00::/48")
	mustSeed(t, v6, []Lease{{"a", pfx(t, "fd00:0:0:ffff::/64"), 1 << 31}}, nil)
	if err := v6.Grant("a", "b", pfx(t, "fd00:0:0:ffff:8000::/65")); err != nil {
		t.Fatal(err)
	}
	overlapping := newRing(t, "10.0.0.0/16")
	mustSeedSets(t, overlapping, []LeaseSet{{"d", 5, []netip.Prefix{pfx(t, "10.0.1.0/25"), pfx(t, "10.0.1.128/25")}}})
	mustSeedSets(t, overlapping, []LeaseSet{{"r", 9, []netip.Prefix{pfx(t, "10.0.1.64/27"), pfx(t, "10.0.2.0/24")}}, {"e", 3, nil}})
	tests := []struct {
		name string
		r    *Ring
	}{
		{"empty v4", newRing(t, "10.0.0.0/8")},
		{"empty v4 /0", newRing(t, "0.0.0.0/0")},
		{"empty v6 /1", newRing(t, "8000::/1")},
		{"seeded v4", v4},
		{"seeded v6", v6},
		{"overlapping sets", overlapping},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.r.Encode()
			d, err := Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !d.Equal(tt.r) || !bytes.Equal(d.Encode(), b) {
				t.Fatalf("round trip differs:\n%v\n%v", tt.r, d)
			}
			if b[0] != formatV3 {
				t.Fatalf("format byte %d", b[0])
			}
			var u Ring
			if err := u.unmarshalBinary(b); err != nil || !u.Equal(tt.r) {
				t.Fatalf("unmarshalBinary: %v", err)
			}
		})
	}
}
