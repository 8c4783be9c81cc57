package opclient

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/mastertest"
)

// TestAgentReaderVerifiesTheAgent: carve ipam talks to an agent only when
// its certificate is the one of the agent the masters' record names.
func TestAgentReaderVerifiesTheAgent(t *testing.T) {
	m := mastertest.StartSecure(t, filepath.Join(t.TempDir(), "m1"), netconfig.Default(), slog.New(slog.DiscardHandler))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"agent_id":"h1","allocations":[]}`))
	}))
	srv.TLS = m.CA.ServerTLS("h1", pki.RoleAgent, true)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	for _, tc := range []struct {
		name    string
		record  api.AgentInfo
		clients string
		want    string
	}{
		{"the right agent", api.AgentInfo{AgentID: "h1", IP: host}, "op", ""},
		{"another agent's certificate", api.AgentInfo{AgentID: "h2", IP: host}, "op", "want agent/h2"},
		{"no IP", api.AgentInfo{AgentID: "h1"}, "op", "no underlay IP"},
		{"no client certificate", api.AgentInfo{AgentID: "h1", IP: host}, "", "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &AgentReader{Port: port, TLS: m.CA.ClientTLS(tc.clients, pki.RoleOperator), Timeout: 10 * time.Second}
			failed := r.ReadAgents(context.Background(), []api.AgentInfo{tc.record}, func(ctx context.Context, c *api.AgentClient, _ api.AgentInfo) error {
				_, err := c.IPAMAllocations(ctx, "")
				return err
			})
			switch got := failed[tc.record.AgentID]; {
			case tc.want == "" && got != "":
				t.Errorf("read failed: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("read: %q, want an error with %q", got, tc.want)
			}
		})
	}
}
