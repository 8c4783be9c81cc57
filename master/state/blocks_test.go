package state

import (
	"net/netip"
	"strings"
	"testing"
)

// A block space's overlap errors name the holder as the operator knows it:
// an agent, or the quarantined space of a deleted one.
func TestBlockSpaceNamesHolder(t *testing.T) {
	mp := netip.MustParsePrefix
	s := newBlockSpace(mp("10.0.0.0/22"))
	if err := s.Add(mp("10.0.1.0/24"), agentHolds("b")); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(mp("10.0.2.0/24"), quarantineHolds("gone")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		add, want string
	}{
		{"10.0.1.128/25", `10.0.1.128/25 overlaps 10.0.1.0/24 of agent "b"`},
		{"10.0.2.0/23", `10.0.2.0/23 overlaps 10.0.2.0/24 of deleted agent "gone" (quarantined)`},
	}
	for _, tt := range tests {
		err := s.Add(mp(tt.add), agentHolds("c"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Add(%s) = %v, want %q", tt.add, err, tt.want)
		}
	}
}
