package agent

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/test/lab/fakegossip"
)

// TestDebugAddr: with Config.DebugAddr the agent serves Go's runtime
// profiles there, a CPU profile included, and only there: the API's
// listener has no /debug/pprof/. Without it, nothing is served.
func TestDebugAddr(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 1)
	get := func(url string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	}

	// One gossip network each: the two agents are the same host's.
	newNet := func() *fakegossip.Network {
		gnet := fakegossip.New(fakegossip.Config{Seed: 52})
		t.Cleanup(gnet.Close)
		return gnet
	}
	off := newTestAgent(t, hosts[0], m.URL(), filepath.Join(dir, "off"), newNet())
	t.Cleanup(off.closeResources)
	if got := off.DebugAddr(); got != "" {
		t.Errorf("without DebugAddr, DebugAddr() = %q", got)
	}
	off.closeResources()

	a := runAgent(t, newTestAgent(t, hosts[0], m.URL(), filepath.Join(dir, "on"), newNet(), func(c *Config) { c.DebugAddr = "127.0.0.1:0" }))
	debug := "http://" + a.DebugAddr()
	if code, body := get(debug + "/debug/pprof/"); code != http.StatusOK || !bytes.Contains(body, []byte("goroutine")) {
		t.Errorf("GET /debug/pprof/ on the debug address: %d %.200s", code, body)
	}
	// A profile is gzip'ed protobuf.
	if code, body := get(debug + "/debug/pprof/profile?seconds=1"); code != http.StatusOK || !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
		t.Errorf("GET /debug/pprof/profile: %d, %d bytes starting %x", code, len(body), body[:min(len(body), 4)])
	}
	if code, _ := get("http://" + a.HTTPAddr() + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/ on the API's address: %d, want 404", code)
	}
}
