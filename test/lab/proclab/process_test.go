package proclab

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTailFile keeps the last lines of a log, and says why a missing one
// cannot be read.
func TestTailFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := TailFile(p, 2); got != "line 98\nline 99" {
		t.Fatalf("tail = %q", got)
	}
	if got := TailFile(filepath.Join(t.TempDir(), "none"), 2); !strings.Contains(got, "no such file") {
		t.Fatalf("tail of a missing file = %q", got)
	}
}
