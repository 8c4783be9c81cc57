package api

import (
	"strings"
	"testing"
)

func TestAgentKeysValidate(t *testing.T) {
	good := sampleRecord().Keys
	if err := good.Validate(); err != nil {
		t.Fatalf("sample keys: %v", err)
	}
	tests := []struct {
		name string
		keys AgentKeys
		want string // substring of the error; "" for none
	}{
		{"none", AgentKeys{}, ""},
		{"claim only", AgentKeys{Claim: good.Claim}, ""},
		{"not base64", AgentKeys{Claim: "!!"}, "keys.claim"},
		{"short", AgentKeys{WireGuard: "c2hvcnQ="}, "keys.wireguard"},
		{"url alphabet", AgentKeys{Claim: strings.NewReplacer("+", "-", "/", "_").Replace(good.Claim) + "%"}, "keys.claim"},
	}
	for _, tt := range tests {
		err := tt.keys.Validate()
		if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v, want an error naming %q", tt.name, err, tt.want)
		}
	}
}

func TestValidateUnderlayMTU(t *testing.T) {
	for _, tt := range []struct {
		mtu int
		ok  bool
	}{{0, true}, {576, true}, {1500, true}, {9000, true}, {65535, true}, {575, false}, {-1, false}, {65536, false}} {
		if err := ValidateUnderlayMTU(tt.mtu); (err == nil) != tt.ok {
			t.Errorf("mtu %d: %v", tt.mtu, err)
		}
	}
}

// The naming rules keep the alphabet and lengths they had as regular
// expressions: written as loops since, so pin them.
func TestNamingRules(t *testing.T) {
	long := strings.Repeat("a", 253)
	for _, tt := range []struct {
		name string
		fn   func(string) error
		in   string
		ok   bool
	}{
		{"agent", ValidateAgentID, "h1", true},
		{"agent", ValidateAgentID, "a.b_c:d@e-f", true},
		{"agent", ValidateAgentID, long, true},
		{"agent", ValidateAgentID, long + "a", false},
		{"agent", ValidateAgentID, "", false},
		{"agent", ValidateAgentID, "-h1", false},
		{"agent", ValidateAgentID, "h/1", false},
		{"agent", ValidateAgentID, "h1\n", false},
		{"overlay", ValidateOverlayName, "carve-2", true},
		{"overlay", ValidateOverlayName, "abcdefghijklm", true},
		{"overlay", ValidateOverlayName, "abcdefghijklmn", false},
		{"overlay", ValidateOverlayName, "Carve", false},
		{"overlay", ValidateOverlayName, "", false},
		{"overlay", ValidateOverlayName, "bridge", false},
		{"container", ValidateContainerID, "0123abc/x+y=z", true},
		{"container", ValidateContainerID, strings.Repeat("c", 255), true},
		{"container", ValidateContainerID, strings.Repeat("c", 256), false},
		{"container", ValidateContainerID, "/abc", false},
		{"container", ValidateContainerID, "ab c", false},
		{"container", ValidateContainerID, "abcé", false},
	} {
		if err := tt.fn(tt.in); (err == nil) != tt.ok {
			t.Errorf("%s %q: %v, want ok=%v", tt.name, tt.in, err, tt.ok)
		}
	}
}
