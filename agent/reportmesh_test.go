package agent

import (
	"testing"

	"github.com/carve-net/carve/api"
)

// TestReporterMeshPasswords: every result carries the fingerprints of the
// mesh passwords; a change of them sends the last result again at once
// (no reconcile needed, the attempts count unchanged), and a result that
// says the same is not sent again.
func TestReporterMeshPasswords(t *testing.T) {
	oldFP, nextFP := api.MeshPasswordFingerprint([]byte("old")), api.MeshPasswordFingerprint([]byte("next"))
	type step struct {
		name             string
		note             *api.ReportRequest // else setMesh
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
	r := newReporter()
	wantPassword, wantAccepted := "", ""
	for _, s := range steps {
		before := r.pending()
		if s.note != nil {
			r.note(*s.note)
		} else {
			r.setMesh(s.password, s.accept)
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

// TestMeshFingerprints: the agent reports the fingerprint of the password
// it sends and of the first it accepts besides, "" for none.
func TestMeshFingerprints(t *testing.T) {
	tests := []struct {
		name           string
		password       []byte
		accepted       [][]byte
		wantP, wantAcc string
	}{
		{"none", nil, nil, "", ""},
		{"sent only", []byte("a"), nil, api.MeshPasswordFingerprint([]byte("a")), ""},
		{"sent and accepted", []byte("a"), [][]byte{[]byte("b"), []byte("c")}, api.MeshPasswordFingerprint([]byte("a")), api.MeshPasswordFingerprint([]byte("b"))},
		{"an empty accepted one skipped", []byte("a"), [][]byte{nil, []byte("c")}, api.MeshPasswordFingerprint([]byte("a")), api.MeshPasswordFingerprint([]byte("c"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, acc := meshFingerprints(tt.password, tt.accepted)
			if p != tt.wantP || acc != tt.wantAcc {
				t.Errorf("got %q/%q, want %q/%q", p, acc, tt.wantP, tt.wantAcc)
			}
		})
	}
}
