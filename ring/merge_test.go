package ring

import (
	"errors"
	"testing"
)

func TestMergeCases(t *testing.T) {
	const u = "10.0.0.0/24"
	type probe struct {
		addr    string
		owner   string
		version uint64 // epoch<<32|counter of the raw token whose range holds addr
		free    uint64
	}
	tests := []struct {
		name          string
		local, remote []tok
		wantChanged   bool
		probes        []probe
	}{
		{
			name:        "identical",
			local:       []tok{{"10.0.0.0", "a", 1, 0, 10}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.9", "a", 1 << 32, 10}},
		},
		{
			name:        "token only in remote",
			local:       []tok{{"10.0.0.0", "a", 1, 0, 10}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}, {"10.0.0.128", "b", 1, 1, 5}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.1", "a", 1 << 32, 10}, {"10.0.0.200", "b", 1<<32 | 1, 5}},
		},
		{
			name:        "token only in local",
			local:       []tok{{"10.0.0.0", "a", 1, 0, 10}, {"10.0.0.128", "b", 1, 1, 5}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.200", "b", 1<<32 | 1, 5}},
		},
		{
			name:        "remote newer version wins",
			local:       []tok{{"10.0.0.0", "a", 1, 0, 10}},
			remote:      []tok{{"10.0.0.0", "b", 1, 1, 3}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.0", "b", 1<<32 | 1, 3}},
		},
		{
			name:        "remote older version loses",
			local:       []tok{{"10.0.0.0", "b", 1, 1, 3}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.0", "b", 1<<32 | 1, 3}},
		},
		{
			name:        "version tie: greater owner wins (remote greater)",
			local:       []tok{{"10.0.0.0", "a", 2, 0, 10}},
			remote:      []tok{{"10.0.0.0", "b", 2, 0, 10}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.0", "b", 2 << 32, 10}},
		},
		{
			name:        "version tie: greater owner wins (local greater)",
			local:       []tok{{"10.0.0.0", "b", 2, 0, 10}},
			remote:      []tok{{"10.0.0.0", "a", 2, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.0", "b", 2 << 32, 10}},
		},
		{
			name:        "owner tie: lower free wins (remote lower)",
			local:       []tok{{"10.0.0.0", "a", 2, 0, 10}},
			remote:      []tok{{"10.0.0.0", "a", 2, 0, 4}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.0", "a", 2 << 32, 4}},
		},
		{
			name:        "owner tie: lower free wins (local lower)",
			local:       []tok{{"10.0.0.0", "a", 2, 0, 4}},
			remote:      []tok{{"10.0.0.0", "a", 2, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.0", "a", 2 << 32, 4}},
		},
		{
			// The count stays as its writer signed it (the view caps
			// it: TestViewCapsFree).
			name:        "inserted token leaves a free count as written",
			local:       []tok{{"10.0.0.0", "a", 2, 0, 200}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}, {"10.0.0.16", "", 0, 0, 0}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.0", "a", 2 << 32, 200}, {"10.0.0.16", "", 0, 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, r := rawRing(t, u, tt.local...), rawRing(t, u, tt.remote...)
			changed, err := l.Merge(r)
			if err != nil {
				t.Fatalf("Merge: %v", err)
			}
			if changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tt.wantChanged)
			}
			// The join, token by token (the view uses a token only
			// where its writer leases it: TestAttributedView).
			for _, p := range tt.probes {
				a := ip(t, p.addr)
				x, _ := l.u.offset(a)
				v := l.st.raw[findRaw(l.st.raw, x)]
				if v.owner != p.owner || v.version != p.version || v.free != U128(p.free) {
					t.Errorf("at %s: %q v%d.%d free %v, want %q v%d.%d free %d\n%v", p.addr,
						v.owner, v.version>>32, v.version&counterMask, v.free,
						p.owner, p.version>>32, p.version&counterMask, p.free, l)
				}
			}
			checkValid(t, l)
			// The other direction gives the same ring.
			r2 := rawRing(t, u, tt.remote...)
			if _, err := r2.Merge(rawRing(t, u, tt.local...)); err != nil {
				t.Fatalf("reverse Merge: %v", err)
			}
			if !r2.Equal(l) {
				t.Fatalf("merge is not commutative:\n%v\n%v", l, r2)
			}
		})
	}
}

func TestMergeRefusesBadRemote(t *testing.T) {
	local := newRing(t, "10.0.0.0/16")
	mustSeed(t, local, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil)
	tests := []struct {
		name   string
		remote *Ring
		want   error
	}{
		{"other universe", newRing(t, "10.1.0.0/16"), ErrOtherUniverse},
		{"other family", newRing(t, "fd00::/112"), ErrOtherUniverse},
		{"nil", nil, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := local.Encode()
			changed, err := local.Merge(tt.remote)
			if !errors.Is(err, tt.want) || changed {
				t.Fatalf("Merge = %v, %v; want %v", changed, err, tt.want)
			}
			if string(before) != string(local.Encode()) {
				t.Fatalf("refused merge changed the ring")
			}
		})
	}
}

// findRaw returns the index of the raw token whose range holds offset x.
func findRaw(raw []rawToken, x Uint128) int {
	i := 0
	for i+1 < len(raw) && !x.Less(raw[i+1].start) {
		i++
	}
	return i
}
