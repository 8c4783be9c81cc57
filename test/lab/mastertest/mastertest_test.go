package mastertest

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
)

// A secure master serves its signed state to an agent's certificate.
func TestStartSecure(t *testing.T) {
	m := StartSecure(t, t.TempDir(), netconfig.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	m.CA.IssueAgent("a1", netip.MustParseAddr("198.18.0.1"))
	cl, err := apiclient.NewClientWith([]string{m.URL()}, apiclient.ClientOptions{TLS: m.CA.ClientTLS("a1", pki.RoleAgent)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := cl.Register(ctx, api.RegisterRequest{AgentID: "a1", IP: "198.18.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := cl.State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := api.ParseSigningKey(st.SigningKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := api.VerifyRecord(pub, info, st.ClusterID); err != nil {
		t.Error(err)
	}
}
