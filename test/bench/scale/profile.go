package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// debugPort is where the real agent serves its runtime profiles with
// -profile-dir (--debug-addr on the host's loopback, which is all it
// accepts).
const debugPort = labcluster.AgentHTTPPort + 1

// profileArgs are the agent flags -profile-dir needs: its profiles served
// on the loopback of the host's namespace (fetchProfile dials from there).
func profileArgs(o idleOptions, h *labcluster.Host) []string {
	if o.profileDir == "" {
		return nil
	}
	return []string{"--debug-addr", fmt.Sprintf("127.0.0.1:%d", debugPort)}
}

// startProfile, with -profile-dir, captures a CPU profile of h's agent
// over the idle window (after the same settle as idleCPU, so that both
// cover the same time) into DIR/agent-idle-N.pprof; the returned function
// waits for it. Without -profile-dir it does nothing. The profile's own
// cost (SIGPROF at 100 Hz) is inside the idle CPU figure then.
func startProfile(ctx context.Context, c *labcluster.Cluster, h *labcluster.Host, n int, o idleOptions) (wait func() error) {
	if o.profileDir == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		if !retry.Sleep(ctx, o.settle) {
			done <- ctx.Err()
			return
		}
		path := filepath.Join(o.profileDir, fmt.Sprintf("agent-idle-%d.pprof", n))
		done <- fetchProfile(ctx, h.LoopbackClient(), o.window, path)
	}()
	return func() error { return <-done }
}

// fetchProfile reads a CPU profile of the given length from the agent that
// hc reaches on its host's loopback and writes it to path.
func fetchProfile(ctx context.Context, hc *http.Client, window time.Duration, path string) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", debugPort, int(window.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("CPU profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("CPU profile: GET %s: %s: %s", url, resp.Status, b)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("CPU profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	progress("CPU profile of the idle agent: %s (go tool pprof -top %s)", path, path)
	return nil
}
