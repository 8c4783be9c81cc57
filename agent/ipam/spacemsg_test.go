package ipam

import (
	"strings"
	"testing"

	"github.com/carve-net/carve/agent/ipam/growth"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/api"
)

// TestForgedSpaceAnswer: an answer from another peer than the one asked,
// one sent under another's name, or one of another cluster is refused; a
// grant whose ring does not give the block changes nothing.
func TestForgedSpaceAnswer(t *testing.T) {
	c := newCluster(t, 9, GrowthConfig{IdleReturn: -1})
	a := c.start("a", t.TempDir(), "")
	h := a.svc.RingGossip()
	ch, done := a.svc.asker.Expect("a-1", "b")
	defer done()
	grant := `{"v":1,"kind":"grant","cluster_id":"c1","from":"%s","id":"a-1","overlay":"carve","family":"4","prefix":"10.128.0.64/27","ring":"AAEC"}`
	for _, tt := range []struct{ name, src, msg string }{
		{"from a peer not asked", "c", strings.Replace(grant, "%s", "c", 1)},
		{"under another's name", "c", strings.Replace(grant, "%s", "b", 1)},
		{"of another cluster", "b", strings.Replace(strings.Replace(grant, "%s", "b", 1), `"c1"`, `"c2"`, 1)},
	} {
		if err := h.OnUnicast(tt.src, []byte(tt.msg)); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
	if len(ch) != 0 {
		t.Fatal("a forged answer reached the request")
	}
	// A grant whose ring does not give the block to a: refused, nothing owned.
	b := c.start("b", t.TempDir(), "")
	ans := ipamwire.SpaceMessage{V: 1, Kind: ipamwire.KindGrant, ClusterID: "c1", From: "b", ID: "a-1", Overlay: "carve", Family: "4", Prefix: "10.128.0.64/27", Ring: b.svc.Rings()["carve/4"]}
	if err := a.svc.acceptAnswer(growth.Key{Overlay: "carve", Bridge: "mesos", Fam: 0}, "b", ans); err == nil {
		t.Fatal("a grant the ring does not make was accepted")
	}
	if bs := a.svc.Status("carve").Blocks[api.BridgeMesos]; len(bs) != 1 {
		t.Fatalf("blocks after a forged grant: %+v", bs)
	}
	checkAllocations(t, a.svc)
}

// FuzzSpaceMessageHandler: space messages from the network never panic the
// decoder nor the handler, and never make the agent hold an address twice
// or outside its ranges.
func FuzzSpaceMessageHandler(f *testing.F) {
	f.Add([]byte(`{"v":1,"kind":"request","cluster_id":"fuzz-cluster","from":"other","id":"x-1","overlay":"carve","family":"4","bits":27}`))
	f.Add([]byte(`{"v":1,"kind":"grant","cluster_id":"fuzz-cluster","from":"other","id":"x-1","overlay":"carve","family":"4","prefix":"10.128.2.0/27","ring":"AAEC"}`))
	f.Add([]byte(`{"v":1,"kind":"refuse","cluster_id":"fuzz-cluster","from":"other","id":"x-1","overlay":"carve","family":"6","reason":"no_space"}`))
	// Signed: a request's sig, a grant's statement.
	f.Add([]byte(`{"v":1,"kind":"request","cluster_id":"fuzz-cluster","from":"other","id":"x-1","overlay":"carve","family":"4","bits":27,"sig":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="}`))
	f.Add([]byte(`{"v":1,"kind":"grant","cluster_id":"fuzz-cluster","from":"other","id":"x-1","overlay":"carve","family":"4","prefix":"10.128.2.0/27","ring":"AAEC","expires":1800000000,"grant_sig":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="}`))
	f.Add([]byte(`{}`))
	s := fuzzService(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ipamwire.DecodeSpaceMessage(data)
		if err != nil {
			return
		}
		if m.Kind == ipamwire.KindRequest {
			// The donor's decision, synchronously (OnUnicast runs it in
			// a goroutine).
			_, b := s.decideDonation(m)
			if b != nil {
				_ = s.commits.Flush(b)
			}
		}
		_ = s.RingGossip().OnUnicast(m.From, data)
		checkAllocations(t, s)
	})
}
