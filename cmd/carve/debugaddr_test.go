package main

import (
	"strings"
	"testing"
)

// --debug-addr is loopback-only: any other host, a name or a wildcard is
// refused naming the address and the fix.
func TestCheckDebugAddr(t *testing.T) {
	tests := []struct {
		addr    string
		mention string // "" for accepted
	}{
		{"127.0.0.1:6060", ""},
		{"[::1]:6060", ""},
		{"127.0.0.2:0", ""},
		{"198.18.0.11:6060", "not a loopback IP"},
		{":6060", "not a loopback IP"},
		{"0.0.0.0:6060", "not a loopback IP"},
		{"localhost:6060", "not a loopback IP"},
		{"6060", "want LOOPBACK_IP:PORT"},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			err := checkDebugAddr(tt.addr)
			if tt.mention == "" && err != nil || tt.mention != "" && (err == nil || !strings.Contains(err.Error(), tt.mention)) {
				t.Fatalf("checkDebugAddr(%q) = %v; want mention %q", tt.addr, err, tt.mention)
			}
		})
	}
}
