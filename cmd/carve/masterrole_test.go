package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/carve-net/carve/pki"
)

// Every operator command refuses a server in --masters whose certificate
// is of the cluster CA but not of role master (an agent's, here), naming
// it; the real master is still accepted.
func TestOperatorCommandsRequireRoleMaster(t *testing.T) {
	m := secureMaster(t)
	impostor := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	m.CA.IssueAgent("h1")
	impostor.TLS = m.CA.ServerTLS("h1", pki.RoleAgent, false)
	impostor.StartTLS()
	t.Cleanup(impostor.Close)
	flags := clientFlags(m, "op", pki.RoleOperator)
	flags[1] = impostor.URL // --masters
	for _, args := range [][]string{
		{"cluster", "status", "--timeout", "5s"},
		{"state"},
		{"agents", "delete", "h9"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			cmds := map[string]func(context.Context, []string, io.Writer) error{"cluster": runCluster, "state": runState, "agents": runAgents}
			var out strings.Builder
			err := cmds[args[0]](context.Background(), append(args[1:], flags...), &out)
			// cluster status reports each master's failure as a problem.
			if err == nil || !strings.Contains(err.Error()+out.String(), "the server's certificate is agent/h1 (role agent)") {
				t.Fatalf("carve %s against a server with an agent certificate: %v, output %q; want a refusal naming agent/h1", strings.Join(args, " "), err, out.String())
			}
		})
	}
	if _, code, err := run(t, clusterCmd, append([]string{"status"}, clientFlags(m, "op", pki.RoleOperator)...)...); code != 0 {
		t.Fatalf("cluster status against the master: exit %d, %v", code, err)
	}
}
