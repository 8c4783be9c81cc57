package netconfig

import (
	"errors"
	"strings"
	"testing"
)

func TestEncryptionConfig(t *testing.T) {
	tests := []struct {
		name string
		json string
		want string // substring of the error; "" for none
	}{
		{"off by default", `{}`, ""},
		{"wireguard", `{"encryption":"wireguard"}`, ""},
		{"strict", `{"encryption":"wireguard-strict","wireguard_port":51821}`, ""},
		{"unknown mode", `{"encryption":"ipsec"}`, "encryption"},
		{"port of vxlan", `{"encryption":"wireguard","wireguard_port":4789}`, "wireguard_port"},
		{"port of vxlan moved", `{"vtep_port":51820,"encryption":"wireguard"}`, "wireguard_port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.json))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Parse(%s): %v", tt.json, err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Parse(%s) = %v, want an invalid-config error naming %s", tt.json, err, tt.want)
			}
		})
	}
}
