package ratelog

import (
	"testing"
	"time"
)

// The first event is logged, the next ones within the interval are not,
// and the first after it says how many were left out.
func TestLimiter(t *testing.T) {
	l := New(50 * time.Millisecond)
	if ok, n := l.Allow(); !ok || n != 0 {
		t.Fatalf("first event: %v %d, want logged", ok, n)
	}
	for i := range 3 {
		if ok, _ := l.Allow(); ok {
			t.Fatalf("event %d within the interval was logged", i+2)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if ok, n := l.Allow(); ok {
			if n < 3 {
				t.Errorf("after the interval: %d left out, want at least 3", n)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no event logged after the interval")
}
