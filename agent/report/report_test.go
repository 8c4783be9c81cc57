package report

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestReporterMeshPasswords: every result carries the fingerprints of the
// mesh passwords; a change of them sends the last result again at once
// (no reconcile needed, the attempts count unchanged), and a result that
// says the same is not sent again.
func TestReporterMeshPasswords(t *testing.T) {
	oldFP, nextFP := api.MeshPasswordFingerprint([]byte("old")), api.MeshPasswordFingerprint([]byte("next"))
	type step struct {
		name             string
		note             *api.ReportRequest // else SetMesh
		password, accept string
		sent             bool
	}
	steps := []step{
		{name: "passwords before any result", password: oldFP, sent: false},
		{name: "the first result carries them", note: &api.ReportRequest{Version: 1}, sent: true},
		{name: "the same passwords", password: oldFP, sent: false},
		{name: "round 1: next accepted", password: oldFP, accept: nextFP, sent: true},
		{name: "the same result again", note: &api.ReportRequest{Version: 1}, sent: false},
		{name: "round 2: next sent", password: nextFP, accept: oldFP, sent: true},
		{name: "round 3: old dropped", password: nextFP, sent: true},
	}
	r := New()
	wantPassword, wantAccepted := "", ""
	for _, s := range steps {
		before := r.pending()
		if s.note != nil {
			r.Note(*s.note)
		} else {
			r.SetMesh(s.password, s.accept)
			wantPassword, wantAccepted = s.password, s.accept
		}
		got := r.pending()
		if sent := got != nil && (before == nil || got.RequestID != before.RequestID); sent != s.sent {
			t.Fatalf("%s: a new report %v, want %v (pending %+v)", s.name, sent, s.sent, got)
		}
		if got == nil {
			continue
		}
		if got.MeshPassword != wantPassword || got.MeshAccepted != wantAccepted {
			t.Errorf("%s: reports mesh %q/%q, want %q/%q", s.name, got.MeshPassword, got.MeshAccepted, wantPassword, wantAccepted)
		}
		if got.ConfigurationAttempts != 1 || got.Version != 1 {
			t.Errorf("%s: reports version %d after %d attempts, want the one result of version 1", s.name, got.Version, got.ConfigurationAttempts)
		}
		r.acknowledged(got)
	}
}

// TestReporterPeerCounts: of the programmed peer count alone, a fall is
// sent to the masters, and a rise back towards the most held; a rise past
// it (every join) is not worth a write. A new key or a refusal always is.
func TestReporterPeerCounts(t *testing.T) {
	n := func(v int) *int { return &v }
	tests := []struct {
		name string
		next api.ReportRequest
		sent bool
	}{
		{"first", api.ReportRequest{ProgrammedPeers: n(3), PeersIndex: 5}, true},
		{"a rise (a join)", api.ReportRequest{ProgrammedPeers: n(4), PeersIndex: 6}, false},
		{"a fall", api.ReportRequest{ProgrammedPeers: n(2), PeersIndex: 7}, true},
		{"a rise back towards the peak", api.ReportRequest{ProgrammedPeers: n(3), PeersIndex: 8}, true},
		{"back at the peak", api.ReportRequest{ProgrammedPeers: n(4), PeersIndex: 9}, true},
		{"past the peak", api.ReportRequest{ProgrammedPeers: n(5), PeersIndex: 10}, false},
		{"a new key", api.ReportRequest{ProgrammedPeers: n(5), PeersIndex: 10, SigningKey: "k"}, true},
		{"refusing", api.ReportRequest{SigningKey: "k", Refusing: "why"}, true},
		{"refusing still", api.ReportRequest{SigningKey: "k", Refusing: "why"}, false},
	}
	r := New()
	for _, tt := range tests {
		before := r.pending()
		r.Note(tt.next)
		got := r.pending()
		if sent := got != nil && (before == nil || got.RequestID != before.RequestID); sent != tt.sent {
			t.Errorf("%s: a new report %v, want %v (pending %+v)", tt.name, sent, tt.sent, got)
		}
		if got != nil {
			r.acknowledged(got)
		}
	}
}

// TestRunSendsTheLatestResult: Run sends a noted result, retries a send
// that failed, and sends a result noted meanwhile in place of one not sent
// yet; once the masters have the latest, nothing is pending.
func TestRunSendsTheLatestResult(t *testing.T) {
	r := New()
	var mu sync.Mutex
	var sent []uint64
	fail := true
	send := func(_ context.Context, req api.ReportRequest) error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, req.Version)
		if fail {
			fail = false
			r.Note(api.ReportRequest{Version: 2}) // noted while the first is refused
			return errors.New("masters unreachable")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx, retry.Backoff{First: time.Millisecond, Max: time.Millisecond}, send)
	}()
	t.Cleanup(func() { cancel(); <-done })
	r.Note(api.ReportRequest{Version: 1})
	testutil.Eventually(t, 0, "the latest result acknowledged", testutil.True(func() bool { return r.pending() == nil }))
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sent, []uint64{1, 2}) {
		t.Errorf("sent versions %v, want [1 2]: the failed one replaced by the one noted meanwhile", sent)
	}
}
