package raftlog

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
)

// historyLayer is a TLS stream layer of a master of ca on loopback whose
// log is of history ("" unknown).
func historyLayer(t *testing.T, ca *pkitest.CA, id, history string) *streamLayer {
	t.Helper()
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "f"}, []string{"direction"})
	g := newHistoryGuard(testLogger(id), prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"direction"}))
	g.load(history)
	g.markReady()
	s := newStreamLayer(listenLocal(t), transportTLS(ca, id, pki.RoleMaster), testLogger(id), failed, g)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func historyRefused(g *historyGuard, direction string) float64 {
	var m dto.Metric
	if err := g.refused.WithLabelValues(direction).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// exchange dials from a to b and sends one byte over: the error of the
// dial, and whether b's side of the connection got the byte.
func exchange(t *testing.T, a, b *streamLayer) (dialErr error, served bool) {
	t.Helper()
	got := make(chan bool, 1)
	go func() {
		c, err := b.Accept()
		if err != nil {
			got <- false
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		var buf [1]byte
		_, err = io.ReadFull(c, buf[:])
		got <- err == nil
	}()
	c, err := a.Dial(raft.ServerAddress(b.Addr().String()), 5*time.Second)
	if err == nil {
		_, _ = c.Write([]byte{1})
		defer c.Close()
	}
	return err, <-got
}

// TestHistoryRefusesOtherHistory: the Raft transport refuses, both ways, a
// peer whose log is of another history (issue 27, item 2: a master on a
// data directory from before a whole-cluster restore), says why on the
// side that dials, counts it on both sides and shows it in
// HistoryConflict until a handshake with that peer agrees again; peers of
// the same history, and a peer that does not
// know its history yet (a new data directory, a version before
// histories), connect.
func TestHistoryRefusesOtherHistory(t *testing.T) {
	ca := pkitest.New(t)
	tests := []struct {
		name         string
		from, to     string
		refused      bool
		wantConflict string
	}{
		{"same history", "c1/200", "c1/200", false, ""},
		{"older dials newer", "c1", "c1/200", true, "history c1"},
		{"newer dials older", "c1/200", "c1/100", true, "history c1/200"},
		{"another cluster", "c2", "c1", true, "history c2"},
		{"dialer does not know its own", "", "c1/200", false, ""},
		{"listener does not know its own", "c1/200", "", false, ""},
		{"neither knows", "", "", false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := historyLayer(t, ca, "a", tc.from), historyLayer(t, ca, "b", tc.to)
			err, served := exchange(t, a, b)
			if !tc.refused {
				if err != nil || !served {
					t.Fatalf("dial: %v, served %t; want a connection", err, served)
				}
				if a.history.lastConflict() != "" || b.history.lastConflict() != "" {
					t.Errorf("conflicts %q, %q; want none", a.history.lastConflict(), b.history.lastConflict())
				}
				return
			}
			if !errors.Is(err, ErrOtherHistory) || served {
				t.Fatalf("dial: %v, served %t; want ErrOtherHistory and nothing served", err, served)
			}
			if historyRefused(a.history, directionOutgoing) != 1 || historyRefused(b.history, directionIncoming) != 1 {
				t.Errorf("refusals counted: outgoing %v, incoming %v; want 1 each",
					historyRefused(a.history, directionOutgoing), historyRefused(b.history, directionIncoming))
			}
			for _, g := range []*historyGuard{a.history, b.history} {
				if c := g.lastConflict(); !strings.Contains(c, tc.wantConflict) || !strings.Contains(c, "move its data directory away") {
					t.Errorf("conflict %q; want it to name %q and the fix", c, tc.wantConflict)
				}
			}
			if c := b.history.lastConflict(); !strings.Contains(c, "is of history "+tc.from) {
				t.Errorf("the listener's conflict %q does not name the dialer's history %s", c, tc.from)
			}
			// The stale side moved to an empty data directory and learned
			// the other's history: the handshake agrees, the conflict is
			// over on both sides.
			a.history.load(tc.to)
			if err, served := exchange(t, a, b); err != nil || !served {
				t.Fatalf("of one history again: dial %v, served %t", err, served)
			}
			if a.history.lastConflict() != "" || b.history.lastConflict() != "" {
				t.Errorf("of one history again: conflicts %q, %q; want none", a.history.lastConflict(), b.history.lastConflict())
			}
		})
	}
}

// TestHistoryConflictEndsWhenTheStaleMasterStartsEmpty: a listener that
// refused a peer of another history forgets the refusal when a node from
// that host dials it knowing no history: the stale master was started on
// an empty data directory, the fix the conflict names. Only a follower's
// incoming handshakes tell it so (it does not dial the other masters), and
// until then carve cluster status called the cluster unhealthy for the
// two minutes a refusal shows (e2e TestRestoredHistoryRefusesOldDataDir
// met that edge).
func TestHistoryConflictEndsWhenTheStaleMasterStartsEmpty(t *testing.T) {
	ca := pkitest.New(t)
	stale, b := historyLayer(t, ca, "a", "c1"), historyLayer(t, ca, "b", "c1/200")
	if err, _ := exchange(t, stale, b); !errors.Is(err, ErrOtherHistory) {
		t.Fatalf("dial from the stale master: %v, want ErrOtherHistory", err)
	}
	if b.history.lastConflict() == "" {
		t.Fatal("the refusal is not shown")
	}
	empty := historyLayer(t, ca, "a", "")
	if err, served := exchange(t, empty, b); err != nil || !served {
		t.Fatalf("dial from the master on an empty data directory: %v, served %t", err, served)
	}
	if c := b.history.lastConflict(); c != "" {
		t.Errorf("the conflict %q is still shown", c)
	}
}
