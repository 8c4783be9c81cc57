package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// TestAgentClientGet: the agent client reads through Call: an answer is
// decoded, an error answer becomes an *Error with the agent's status,
// message and code (or the body, code internal, when it is not carve's
// JSON), and an agent that is not there an *Error wrapping ErrUnreachable.
func TestAgentClientGet(t *testing.T) {
	for _, tc := range []struct {
		name        string
		status      int
		body        string
		wantPeers   *AgentPeers
		wantStatus  int
		wantCode    string
		wantMessage string
	}{
		{name: "answer", status: http.StatusOK, body: `{"self":"h1","master_index":7,"masters_reachable":true,"peers":[{"agent_id":"h2","version":3,"programmed":true}]}`,
			wantPeers: &AgentPeers{Self: "h1", MasterIndex: 7, MastersReachable: true, Peers: []AgentPeer{{AgentID: "h2", Version: 3, Programmed: true}}}},
		{name: "carve error", status: http.StatusServiceUnavailable, body: `{"error":"not ready","code":"unavailable"}`,
			wantStatus: http.StatusServiceUnavailable, wantCode: CodeUnavailable, wantMessage: "not ready"},
		{name: "plain text error", status: http.StatusInternalServerError, body: "boom\n",
			wantStatus: http.StatusInternalServerError, wantCode: CodeInternal, wantMessage: "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodGet || r.URL.Path != "/overlay-agent/peers" {
					http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusTeapot)
					return
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			t.Cleanup(srv.Close)
			// Without the scheme, as operators give addresses.
			c := NewAgentClient(strings.TrimPrefix(srv.URL, "http://"), srv.Client())
			peers, err := c.Peers(context.Background())
			if tc.wantPeers != nil {
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(peers, tc.wantPeers) {
					t.Fatalf("peers = %+v, want %+v", peers, tc.wantPeers)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v (%T), want an *Error", err, err)
			}
			if e.Status != tc.wantStatus || e.Code != tc.wantCode || !strings.Contains(e.Message, tc.wantMessage) {
				t.Errorf("err = %+v, want status %d, code %s, a message with %q", e, tc.wantStatus, tc.wantCode, tc.wantMessage)
			}
			if errors.Is(err, ErrUnreachable) {
				t.Errorf("an answered call is unreachable: %v", err)
			}
		})
	}

	t.Run("unreachable", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		_, err := NewAgentClient(srv.URL, nil).Overlay(context.Background())
		var e *Error
		if !errors.As(err, &e) || e.Status != 0 || !errors.Is(err, ErrUnreachable) {
			t.Fatalf("err = %v, want an *Error with no status wrapping ErrUnreachable", err)
		}
	})
}
