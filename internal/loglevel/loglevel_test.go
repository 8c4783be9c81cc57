package loglevel

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
)

// TestHandler serves the endpoint as an agent does (its API lets any
// certificate of the CA through): only an operator reads or sets the
// level, and a bad level is a 400 naming the field.
func TestHandler(t *testing.T) {
	ca := pkitest.New(t)
	level := new(slog.LevelVar)
	srv := httptest.NewUnstartedServer(Handler(level, slog.New(slog.DiscardHandler)))
	srv.TLS = ca.ServerTLS("h1", pki.RoleAgent, false)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	client := func(name string, role pki.Role) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientTLS(name, role)}}
	}
	for _, tc := range []struct {
		name, method, as string
		role             pki.Role
		body             any
		want             string // the level answered, or the error
		level            slog.Level
	}{
		{"read", http.MethodGet, "alice", pki.RoleOperator, nil, "info", slog.LevelInfo},
		{"set", http.MethodPut, "alice", pki.RoleOperator, Body{Level: "debug"}, "debug", slog.LevelDebug},
		{"agent", http.MethodPut, "h2", pki.RoleAgent, Body{Level: "error"}, "needs an operator certificate (carve certs issue --role operator) (forbidden, HTTP 403)", slog.LevelDebug},
		{"no certificate", http.MethodGet, "", "", nil, "needs an operator certificate (carve certs issue --role operator) (forbidden, HTTP 403)", slog.LevelDebug},
		{"bad level", http.MethodPut, "alice", pki.RoleOperator, Body{Level: "trace"}, `level: log level "trace": want debug, info, warn or error (bad_request, HTTP 400)`, slog.LevelDebug},
		{"unknown field", http.MethodPut, "alice", pki.RoleOperator, map[string]string{"lvl": "info"}, "HTTP 400", slog.LevelDebug},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got Body
			err := api.Call(context.Background(), client(tc.as, tc.role), tc.method, srv.URL+Path, tc.body, &got, nil)
			switch {
			case err != nil && !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %v, want %q", err, tc.want)
			case err == nil && got.Level != tc.want:
				t.Errorf("level %q, want %q", got.Level, tc.want)
			}
			if level.Level() != tc.level {
				t.Errorf("the level is %s, want %s", level.Level(), tc.level)
			}
		})
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]string{"debug": "debug", "INFO": "info", "Warn": "warn", "error": "error"} {
		if l, err := Parse(in); err != nil || Name(l) != want {
			t.Errorf("Parse(%q) = %v, %v; want %s", in, l, err, want)
		}
	}
	for _, bad := range []string{"", "trace", "info+2", "-4"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
