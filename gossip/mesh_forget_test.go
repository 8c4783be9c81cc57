//go:build !race

// mesh dials the addresses it is given in goroutines the race detector
// reports, so this runs only without -race.

package gossip

import (
	"slices"
	"testing"
)

// TestMeshForget: an address given to Connect, then to Forget, is no longer
// among the addresses mesh keeps trying.
func TestMeshForget(t *testing.T) {
	r, err := NewMeshRouter(MeshConfig{ID: "a", Host: "127.0.0.1", Port: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop() })
	// Nothing listens on loopback port 1: the dials fail at once.
	if err := r.Connect("127.0.0.1:1", "127.0.0.2:1"); err != nil {
		t.Fatal(err)
	}
	targets := func() []string {
		got := r.router.ConnectionMaker.Targets(false)
		slices.Sort(got)
		return got
	}
	if got := targets(); !slices.Equal(got, []string{"127.0.0.1:1", "127.0.0.2:1"}) {
		t.Fatalf("targets after Connect = %v", got)
	}
	if err := r.Forget("127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	if got := targets(); !slices.Equal(got, []string{"127.0.0.2:1"}) {
		t.Fatalf("targets after Forget = %v", got)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Forget("127.0.0.2:1"); err == nil {
		t.Error("Forget after Stop accepted")
	}
}
