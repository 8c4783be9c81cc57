package apiclient

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestEveryMasterFailedShowsEveryError (issue 20, finding 8): when every
// master fails a call, the error shows each master's failure, and the 503
// of the master that answered is the error's (its code, its status),
// whatever the order of the masters; an error without an answer does not
// end in "(internal)".
func TestEveryMasterFailedShowsEveryError(t *testing.T) {
	noQuorum := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"no quorum","code":"no_leader"}`))
	}))
	t.Cleanup(noQuorum.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()

	for _, masters := range [][]string{{noQuorum.URL, refused}, {refused, noQuorum.URL}} {
		c, err := NewClient(masters, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.State(context.Background(), StateOptions{})
		var e *api.Error
		if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || e.Code != api.CodeNoLeader {
			t.Fatalf("masters %v: %v; want the 503 no_leader", masters, err)
		}
		msg := err.Error()
		for _, want := range []string{noQuorum.URL + ": no quorum (no_leader, HTTP 503)", "also GET " + refused, "connection refused"} {
			if !strings.Contains(msg, want) {
				t.Errorf("masters %v: %q lacks %q", masters, msg, want)
			}
		}
		if strings.Contains(msg, "(internal)") {
			t.Errorf("masters %v: %q ends a transport error in (internal)", masters, msg)
		}
	}

	// One master, unreachable: its error, without "(internal)".
	c, err := NewClient([]string{refused}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.State(context.Background(), StateOptions{})
	if err == nil || strings.Contains(err.Error(), "(internal)") || !api.IsRetryable(err) || !errors.Is(err, api.ErrUnreachable) {
		t.Errorf("one unreachable master: %v", err)
	}
}
