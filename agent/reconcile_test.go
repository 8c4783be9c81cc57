package agent

import (
	"testing"
	"time"
)

// The full resync runs every --resync-interval, or 200 times as long as
// the last one took where that is longer (many peers).
func TestResyncEvery(t *testing.T) {
	for _, tt := range []struct {
		every, took, want time.Duration
	}{
		{30 * time.Second, 0, 30 * time.Second},
		{30 * time.Second, 40 * time.Millisecond, 30 * time.Second},   // 5,000 peers
		{30 * time.Second, 150 * time.Millisecond, 30 * time.Second},  // the break-even
		{30 * time.Second, 500 * time.Millisecond, 100 * time.Second}, // 50,000 peers
		{5 * time.Minute, time.Second, 5 * time.Minute},
	} {
		if got := resyncEvery(tt.every, tt.took); got != tt.want {
			t.Errorf("resyncEvery(%s, %s) = %s, want %s", tt.every, tt.took, got, tt.want)
		}
	}
}
