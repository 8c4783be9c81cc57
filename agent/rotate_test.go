package agent

import (
	"testing"

	"github.com/carve-net/carve/api"
)

// TestMeshFingerprints: the agent reports the fingerprint of the password
// it sends and of the first it accepts besides, "" for none.
func TestMeshFingerprints(t *testing.T) {
	tests := []struct {
		name           string
		password       []byte
		accepted       [][]byte
		wantP, wantAcc string
	}{
		{"none", nil, nil, "", ""},
		{"sent only", []byte("a"), nil, api.MeshPasswordFingerprint([]byte("a")), ""},
		{"sent and accepted", []byte("a"), [][]byte{[]byte("b"), []byte("c")}, api.MeshPasswordFingerprint([]byte("a")), api.MeshPasswordFingerprint([]byte("b"))},
		{"an empty accepted one skipped", []byte("a"), [][]byte{nil, []byte("c")}, api.MeshPasswordFingerprint([]byte("a")), api.MeshPasswordFingerprint([]byte("c"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, acc := meshFingerprints(tt.password, tt.accepted)
			if p != tt.wantP || acc != tt.wantAcc {
				t.Errorf("got %q/%q, want %q/%q", p, acc, tt.wantP, tt.wantAcc)
			}
		})
	}
}
