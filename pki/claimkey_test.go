package pki

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClaimKey: the key is made once (mode 0600), read back the same, and
// refused when others may read it.
func TestClaimKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), ClaimKeyFile)
	k1, err := LoadOrCreateClaimKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
	k2, err := LoadOrCreateClaimKey(path)
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("read back another key (%v)", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateClaimKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable key: %v, want a refusal naming the fix", err)
	}
}
