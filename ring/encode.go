package ring

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
)

// formatV3 is the first byte of every encoded ring of this layout. Formats
// 1 (leases disjoint, without lease-set versions) and 2 (tokens without
// their writer and signature) are no longer read: a ring persisted in one
// is seeded again from the masters' records, and what peers wrote in it
// (unattributed) is dropped.
const formatV3 = 3

// maxSigLen bounds a token's signature (ed25519's is 64 bytes).
const maxSigLen = 128

// maxOwnerLen bounds an agent id in the encoding.
const maxOwnerLen = 255

// Encode writes the replicated state in a compact, canonical form, the same
// for gossip and for disk:
//
//	format byte (formatV3)
//	family byte (4 or 6), universe address (4 or 16 bytes), prefix length byte
//	owners:     count, then each as length + bytes, sorted, each used below
//	tokens:     count, then each: start as a delta from the previous one
//	            (the first is 0), owner index (0 = nobody, else 1-based),
//	            version epoch, version counter, free count, signer index
//	            (0 = none), signature length and bytes
//	leases:     count, then each: start as a delta from the previous lease's
//	            start, prefix length byte, owner index, Raft index; sorted
//	            by (start, prefix length, owner), none below its owner's
//	            lease-set version
//	lease sets: count, then each: owner index (increasing), version
//	tombstones: count, then each: owner index (increasing), Raft index
//
// Integers are unsigned varints; 128-bit values are two varints (high, low).
// Equal states encode to equal bytes.
func (r *Ring) Encode() []byte {
	return r.appendEncode(make([]byte, 0, 32+12*len(r.st.raw)+8*len(r.st.leases)))
}

// appendEncode appends the encoding of r to b.
func (r *Ring) appendEncode(b []byte) []byte {
	owners := r.owners()
	index := make(map[string]uint64, len(owners))
	for i, o := range owners {
		index[o] = uint64(i + 1)
	}
	ownerIdx := func(o string) uint64 {
		if o == "" {
			return 0
		}
		return index[o]
	}
	b = append(b, formatV3)
	a := r.u.prefix.Addr()
	if a.Is4() {
		b = append(b, 4)
		b = append(b, a.AsSlice()...)
	} else {
		b = append(b, 6)
		b = append(b, a.AsSlice()...)
	}
	b = append(b, byte(r.u.prefix.Bits()))
	b = binary.AppendUvarint(b, uint64(len(owners)))
	for _, o := range owners {
		b = binary.AppendUvarint(b, uint64(len(o)))
		b = append(b, o...)
	}
	b = binary.AppendUvarint(b, uint64(len(r.st.raw)))
	prev := Uint128{}
	for _, t := range r.st.raw {
		b = appendU128(b, t.start.Sub(prev))
		prev = t.start
		b = binary.AppendUvarint(b, ownerIdx(t.owner))
		b = binary.AppendUvarint(b, t.version>>epochShift)
		b = binary.AppendUvarint(b, t.version&counterMask)
		b = appendU128(b, t.free)
		b = binary.AppendUvarint(b, ownerIdx(t.signer))
		b = binary.AppendUvarint(b, uint64(len(t.sig)))
		b = append(b, t.sig...)
	}
	b = binary.AppendUvarint(b, uint64(len(r.st.leases)))
	prev = Uint128{}
	for _, l := range r.st.leases {
		b = appendU128(b, l.start.Sub(prev))
		prev = l.start
		b = append(b, byte(l.bits))
		b = binary.AppendUvarint(b, ownerIdx(l.owner))
		b = binary.AppendUvarint(b, l.index)
	}
	b = binary.AppendUvarint(b, uint64(len(r.st.sets)))
	for _, t := range r.st.sets {
		b = binary.AppendUvarint(b, ownerIdx(t.Owner))
		b = binary.AppendUvarint(b, t.Version)
	}
	b = binary.AppendUvarint(b, uint64(len(r.st.tombs)))
	for _, t := range r.st.tombs {
		b = binary.AppendUvarint(b, ownerIdx(t.Owner))
		b = binary.AppendUvarint(b, t.Version)
	}
	return b
}

func (r *Ring) owners() []string {
	seen := map[string]bool{}
	var out []string
	add := func(o string) {
		if o != "" && !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	for _, t := range r.st.raw {
		add(t.owner)
		add(t.signer)
	}
	for _, l := range r.st.leases {
		add(l.owner)
	}
	for _, t := range r.st.sets {
		add(t.Owner)
	}
	for _, t := range r.st.tombs {
		add(t.Owner)
	}
	sort.Strings(out)
	return out
}

func appendU128(b []byte, v Uint128) []byte {
	return binary.AppendUvarint(binary.AppendUvarint(b, v.Hi), v.Lo)
}

// decoder reads the encoding and refuses anything non-canonical, so that
// decoding then encoding gives back the same bytes.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
	}
}

func (d *decoder) byte1(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.fail("truncated at %s", what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bytes(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.fail("truncated at %s", what)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint at %s", what)
		return 0
	}
	if n != len(binary.AppendUvarint(nil, v)) {
		d.fail("non-minimal varint at %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u128(what string) Uint128 {
	hi := d.uvarint(what)
	return Uint128{Hi: hi, Lo: d.uvarint(what)}
}

// count reads a list length, bounded by the bytes left so that a forged
// length cannot make us allocate.
func (d *decoder) count(what string, minBytes int) int {
	n := d.uvarint(what)
	if d.err == nil && n > uint64(len(d.b)/minBytes) {
		d.fail("%s count %d exceeds the data", what, n)
		return 0
	}
	return int(n)
}

// Decode reads an encoded ring and validates everything: format, universe,
// owners, tokens sorted without repeats and inside the universe, free counts
// possible for their range sizes, leases aligned, inside and sorted, none
// below its owner's lease-set version, lease sets and tombstones sorted. It never panics on any input.
func Decode(b []byte) (*Ring, error) {
	d := &decoder{b: b}
	if f := d.byte1("format"); d.err == nil && f != formatV3 {
		return nil, fmt.Errorf("%w: unknown format %d", ErrInvalid, f)
	}
	var addr netip.Addr
	switch fam := d.byte1("family"); {
	case d.err != nil:
	case fam == 4:
		if s := d.bytes(4, "universe"); s != nil {
			addr = netip.AddrFrom4([4]byte(s))
		}
	case fam == 6:
		if s := d.bytes(16, "universe"); s != nil {
			addr = netip.AddrFrom16([16]byte(s))
		}
	default:
		d.fail("unknown family %d", fam)
	}
	bits := int(d.byte1("universe length"))
	if d.err != nil {
		return nil, d.err
	}
	if bits > addr.BitLen() {
		return nil, fmt.Errorf("%w: universe length %d", ErrInvalid, bits)
	}
	u, err := newUniverse(netip.PrefixFrom(addr, bits))
	if err != nil {
		return nil, err
	}

	nOwners := d.count("owners", 2)
	owners := make([]string, 0, nOwners)
	for i := 0; i < nOwners && d.err == nil; i++ {
		n := d.uvarint("owner length")
		if d.err == nil && (n == 0 || n > maxOwnerLen) {
			d.fail("owner length %d", n)
		}
		o := string(d.bytes(int(n), "owner"))
		if d.err == nil && i > 0 && owners[i-1] >= o {
			d.fail("owners not sorted at %q", o)
		}
		owners = append(owners, o)
	}
	used := make([]bool, len(owners))
	owner := func(idx uint64, allowNone bool) string {
		if d.err != nil {
			return ""
		}
		if idx == 0 {
			if !allowNone {
				d.fail("missing owner")
			}
			return ""
		}
		if idx > uint64(len(owners)) {
			d.fail("owner index %d of %d", idx, len(owners))
			return ""
		}
		used[idx-1] = true
		return owners[idx-1]
	}

	nTokens := d.count("tokens", 9)
	if d.err == nil && nTokens == 0 {
		d.fail("no token")
	}
	raw := make([]rawToken, 0, nTokens)
	pos := Uint128{}
	for i := 0; i < nTokens && d.err == nil; i++ {
		delta := d.u128("token start")
		if d.err == nil && (i == 0) != delta.IsZero() {
			d.fail("token %d: starts must begin at 0 and increase", i)
		}
		pos = pos.Add(delta)
		if d.err == nil && (pos.Less(delta) || !pos.Less(u.size)) {
			d.fail("token %d outside the universe", i)
		}
		t := rawToken{start: pos, owner: owner(d.uvarint("token owner"), true)}
		epoch, counter := d.uvarint("version"), d.uvarint("version")
		if d.err == nil && (epoch > maxRaftIndex || counter > counterMask) {
			d.fail("token %d: version %d.%d", i, epoch, counter)
		}
		t.version = epoch<<epochShift | counter
		t.free = d.u128("free")
		t.signer = owner(d.uvarint("token signer"), true)
		n := d.uvarint("signature length")
		if d.err == nil && (n > maxSigLen || (n > 0 && t.signer == "")) {
			d.fail("token %d: signature of %d bytes by %q", i, n, t.signer)
		}
		t.sig = string(d.bytes(int(n), "signature"))
		raw = append(raw, t)
	}
	for i := 0; i < len(raw) && d.err == nil; i++ {
		if size := u.size.Sub(raw[i].start); size.Less(raw[i].free) {
			d.fail("token %d: free count %v exceeds the %v addresses from its start to the universe's end", i, raw[i].free, size)
		}
	}

	width := addr.BitLen()
	nLeases := d.count("leases", 5)
	leases := make([]leaseEntry, 0, nLeases)
	pos = Uint128{}
	for i := 0; i < nLeases && d.err == nil; i++ {
		delta := d.u128("lease start")
		start := pos.Add(delta)
		lbits := int(d.byte1("lease length"))
		l := leaseEntry{start: start, bits: lbits, owner: owner(d.uvarint("lease owner"), false), index: d.uvarint("lease index")}
		if d.err != nil {
			break
		}
		if start.Less(delta) || lbits < bits || lbits > width || start.trailingZeros() < width-lbits {
			d.fail("lease %d: bad prefix", i)
			break
		}
		l.end = start.Add(pow2(width - lbits))
		if u.size.Less(l.end) || !start.Less(l.end) {
			d.fail("lease %d outside the universe", i)
		}
		if l.index == 0 || l.index > maxRaftIndex {
			d.fail("lease %d: index %d", i, l.index)
		}
		if i > 0 && !leases[i-1].keyLess(l) {
			d.fail("lease %d: leases not sorted", i)
		}
		leases = append(leases, l)
		pos = l.start
	}

	sets := d.ownerVersions("lease sets", owner)
	tombs := d.ownerVersions("tombstones", owner)
	for i, l := range leases {
		if d.err == nil && l.index < tombIndex(sets, l.owner) {
			d.fail("lease %d: below its owner's lease set", i)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	for i, ok := range used {
		if d.err == nil && !ok {
			d.fail("owner %q unused", owners[i])
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	r := &Ring{u: u}
	r.st = r.derive(raw, leases, sets, tombs)
	return r, nil
}

// ownerVersions reads a list of (owner index, Raft index), owners increasing.
func (d *decoder) ownerVersions(what string, owner func(uint64, bool) string) []Tombstone {
	n := d.count(what, 2)
	out := make([]Tombstone, 0, n)
	lastIdx := uint64(0)
	for i := 0; i < n && d.err == nil; i++ {
		idx := d.uvarint(what + " owner")
		if d.err == nil && idx <= lastIdx {
			d.fail("%s not sorted", what)
		}
		lastIdx = idx
		t := Tombstone{Owner: owner(idx, false), Version: d.uvarint(what + " index")}
		if d.err == nil && (t.Version == 0 || t.Version > maxRaftIndex) {
			d.fail("%s %d: index %d", what, i, t.Version)
		}
		out = append(out, t)
	}
	return out
}
