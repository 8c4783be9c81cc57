package api

import "testing"

// TestMeshPasswordFingerprint: the fingerprint is the first 8 bytes, hex,
// of SHA-256 over the domain-separation prefix and the password (vectors
// computed apart from Go), "" for no password, and of the form
// ValidMeshPasswordFingerprint accepts.
func TestMeshPasswordFingerprint(t *testing.T) {
	tests := []struct {
		password []byte
		want     string
	}{
		{[]byte("secret"), "e5fa5964d6e30831"},
		{[]byte("next"), "d5392520e078df23"},
		{nil, ""},
		{[]byte{}, ""},
	}
	for _, tt := range tests {
		got := MeshPasswordFingerprint(tt.password)
		if got != tt.want {
			t.Errorf("MeshPasswordFingerprint(%q) = %q, want %q", tt.password, got, tt.want)
		}
		if got != "" && !ValidMeshPasswordFingerprint(got) {
			t.Errorf("ValidMeshPasswordFingerprint(%q) = false for a fingerprint", got)
		}
	}
}

// TestValidMeshPasswordFingerprint: only 16 lowercase hex digits.
func TestValidMeshPasswordFingerprint(t *testing.T) {
	for s, want := range map[string]bool{
		"0123456789abcdef":  true,
		"0123456789ABCDEF":  false,
		"0123456789abcde":   false,
		"0123456789abcdef0": false,
		"0123456789abcdeg":  false,
		"":                  false,
	} {
		if got := ValidMeshPasswordFingerprint(s); got != want {
			t.Errorf("ValidMeshPasswordFingerprint(%q) = %v, want %v", s, got, want)
		}
	}
}
