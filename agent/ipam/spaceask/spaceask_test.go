package spaceask

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// noRing is a host that serves nothing.
type noRing struct{}

func (noRing) Ring(string, string, int) (*ring.Ring, int, bool) { return nil, 0, false }
func (noRing) Channel() (gossip.Channel, string)                { return nil, "" }
func (noRing) Sign(*ipamwire.SpaceMessage)                      {}
func (noRing) Accept(string, string, int, string, ipamwire.SpaceMessage) error {
	return errors.New("not asked")
}

func newAsker(t *testing.T) *Asker {
	t.Helper()
	counter := func() *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_total"}, []string{"a", "b"})
	}
	return New(Config{Self: "a", Host: noRing{}, Seed: 1, AnswerTimeout: time.Second, RefuseMemory: time.Minute,
		Grows: counter(), Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_refused_total"}, []string{"reason"})})
}

// TestAnswerRouting: an answer reaches the request it answers only from
// the peer asked; others are refused, and none arrives after done.
func TestAnswerRouting(t *testing.T) {
	a := newAsker(t)
	ch, done := a.Expect("a-1", "b")
	for _, tt := range []struct {
		name, src, id string
		ok            bool
	}{
		{"from another peer", "c", "a-1", false},
		{"to no request", "b", "a-2", false},
		{"from the peer asked", "b", "a-1", true},
		{"a duplicate", "b", "a-1", true},
	} {
		err := a.Answer(tt.src, ipamwire.SpaceMessage{ID: tt.id, From: tt.src})
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ipamwire.ErrBadSpaceMessage)) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	if got := <-ch; got.From != "b" || len(ch) != 0 {
		t.Errorf("answers routed: %+v and %d more, want one from b", got, len(ch))
	}
	done()
	if err := a.Answer("b", ipamwire.SpaceMessage{ID: "a-1", From: "b"}); err == nil {
		t.Error("an answer after done was taken")
	}
}

// TestAskWithoutRing: IPv6 is never asked for (the overlay is full for
// the ring), and a family without a ring or channel has no donor.
func TestAskWithoutRing(t *testing.T) {
	a := newAsker(t)
	if err := a.Ask(context.Background(), "carve", "mesos", 1, nil); !errors.Is(err, ErrOverlayFull) {
		t.Errorf("IPv6: %v, want ErrOverlayFull", err)
	}
	if err := a.Ask(context.Background(), "carve", "mesos", 0, nil); !errors.Is(err, ErrNoDonor) {
		t.Errorf("no ring: %v, want ErrNoDonor", err)
	}
	if _, asking := a.AskingBridge("carve", 0); asking {
		t.Error("a bridge still asking after the growth ended")
	}
}
