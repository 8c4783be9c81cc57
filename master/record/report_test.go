package record

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestReportOfTrustFields: a report's key must parse, its refusal is
// bounded and its peer count not negative; a report without the fields
// encodes as before (the states of agents that send none digest the same).
func TestReportOfTrustFields(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		req     api.ReportRequest
		wantErr string
	}{
		{"all fields", api.ReportRequest{SigningKey: api.EncodeSigningKey(pub), Refusing: "why", ProgrammedPeers: new(0), PeersIndex: 9,
			MeshPassword: api.MeshPasswordFingerprint([]byte("a")), MeshAccepted: api.MeshPasswordFingerprint([]byte("b"))}, ""},
		{"bad key", api.ReportRequest{SigningKey: "not a key"}, "signing_key"},
		{"long refusal", api.ReportRequest{Refusing: strings.Repeat("x", maxReportError+1)}, "refusing"},
		{"negative count", api.ReportRequest{ProgrammedPeers: new(-1)}, "programmed_peers"},
		{"mesh password not a fingerprint", api.ReportRequest{MeshPassword: "secret"}, "mesh_password"},
		{"mesh password in upper case", api.ReportRequest{MeshPassword: "0123456789ABCDEF"}, "mesh_password"},
		{"accepted not a fingerprint", api.ReportRequest{MeshPassword: "0123456789abcdef", MeshAccepted: "0123456789abcdeg"}, "mesh_accepted"},
		{"accepted without a password", api.ReportRequest{MeshAccepted: "0123456789abcdef"}, "mesh_accepted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := ReportOf(tt.req)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if rep.SigningKey != tt.req.SigningKey || rep.Refusing != tt.req.Refusing || *rep.ProgrammedPeers != 0 || rep.PeersIndex != 9 ||
					rep.MeshPassword != tt.req.MeshPassword || rep.MeshAccepted != tt.req.MeshAccepted || !rep.Equal(rep) {
					t.Errorf("report %+v from %+v", rep, tt.req)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
	rep, err := ReportOf(api.ReportRequest{Version: 3, Overlays: []api.OverlayReport{{Name: "carve", Status: api.StatusOK}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"version":3,"overlays":{"carve":{"status":"STATUS_OK"}}}`; string(b) != want {
		t.Errorf("a report without the new fields encodes as %s, want %s", b, want)
	}
}
