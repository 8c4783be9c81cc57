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
