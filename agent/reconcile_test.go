package agent

import (
	"testing"
	"time"
)

// The full resync runs every --resync-interval, or 4 ms a peer where that
// is longer (tens of thousands of peers).
func TestResyncEvery(t *testing.T) {
	for _, tt := range []struct {
		every time.Duration
		peers int
		want  time.Duration
	}{
		{30 * time.Second, 0, 30 * time.Second},
		{30 * time.Second, 5000, 30 * time.Second},
		{30 * time.Second, 7500, 30 * time.Second}, // the break-even
		{30 * time.Second, 50000, 200 * time.Second},
		{200 * time.Millisecond, 3, 200 * time.Millisecond}, // the tests' fast resync
		{5 * time.Minute, 50000, 5 * time.Minute},
	} {
		if got := resyncEvery(tt.every, tt.peers); got != tt.want {
			t.Errorf("resyncEvery(%s, %d peers) = %s, want %s", tt.every, tt.peers, got, tt.want)
		}
	}
}
