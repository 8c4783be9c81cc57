// Package demo runs a local carve cluster for `carve demo`: real master
// processes on loopback with a temporary data dir, stopped cleanly (by PID)
// on exit or on a signal.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/carve-net/carve/api"
)

// MasterProcess is one `carve master` child process.
type MasterProcess struct {
	ID       string
	HTTPAddr string
	RaftAddr string
	DataDir  string
	LogPath  string
	cmd      *exec.Cmd
	done     chan error
}

// URL is the master's HTTP base URL.
func (p *MasterProcess) URL() string { return "http://" + p.HTTPAddr }

// Running reports whether the process has not exited.
func (p *MasterProcess) Running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Masters is a set of master processes sharing one --peers list.
type Masters struct {
	Binary  string
	Dir     string
	Config  string
	Procs   []*MasterProcess
	logOut  io.Writer
	started bool
}

// freeLoopbackAddr returns a loopback HOST:PORT that was free a moment ago.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// NewMasters prepares n masters under dir, with a network config file.
func NewMasters(binary, dir string, n int, networkJSON []byte) (*Masters, error) {
	ms := &Masters{Binary: binary, Dir: dir, Config: filepath.Join(dir, "network.json")}
	if err := os.WriteFile(ms.Config, networkJSON, 0o644); err != nil {
		return nil, fmt.Errorf("write network config: %w", err)
	}
	for i := range n {
		httpAddr, err := freeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		raftAddr, err := freeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		id := fmt.Sprintf("m%d", i+1)
		ms.Procs = append(ms.Procs, &MasterProcess{ID: id, HTTPAddr: httpAddr, RaftAddr: raftAddr,
			DataDir: filepath.Join(dir, id), LogPath: filepath.Join(dir, id+".log")})
	}
	return ms, nil
}

// Peers is the --peers value shared by every master.
func (ms *Masters) Peers() string {
	var parts []string
	for _, p := range ms.Procs {
		parts = append(parts, p.ID+"="+p.RaftAddr)
	}
	return strings.Join(parts, ",")
}

// URLs are the masters' HTTP base URLs.
func (ms *Masters) URLs() []string {
	var out []string
	for _, p := range ms.Procs {
		out = append(out, p.URL())
	}
	return out
}

// Start starts master i (again, after a Stop: same data dir and addresses).
func (ms *Masters) Start(i int) error {
	p := ms.Procs[i]
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open master log: %w", err)
	}
	cmd := exec.Command(ms.Binary, "master", "--id", p.ID, "--data-dir", p.DataDir,
		"--http-addr", p.HTTPAddr, "--raft-addr", p.RaftAddr, "--peers", ms.Peers(), "--config", ms.Config)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a Ctrl-C in the terminal reaches the demo, which
	// then stops its masters in order, instead of killing them mid-write.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.ID, err)
	}
	p.cmd = cmd
	p.done = make(chan error, 1)
	go func() {
		p.done <- cmd.Wait()
		logf.Close()
	}()
	return nil
}

// StartAll starts every master.
func (ms *Masters) StartAll() error {
	for i := range ms.Procs {
		if err := ms.Start(i); err != nil {
			return err
		}
	}
	return nil
}

// Stop sends SIGTERM to master i (by its PID) and waits for it; SIGKILL after 10s.
func (ms *Masters) Stop(i int) error {
	p := ms.Procs[i]
	if !p.Running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.cmd = nil
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			return err
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.cmd = nil
		return fmt.Errorf("%s did not stop in 10s: killed", p.ID)
	}
}

// StopAll stops every running master.
func (ms *Masters) StopAll() error {
	var errs []error
	for i := range ms.Procs {
		errs = append(errs, ms.Stop(i))
	}
	return errors.Join(errs...)
}

// WaitLeader waits until a master reports a leader with its HTTP address and
// the network config committed, and returns the leader's index in Procs.
func (ms *Masters) WaitLeader(ctx context.Context) (int, error) {
	for {
		running := 0
		for i, p := range ms.Procs {
			if !p.Running() {
				continue
			}
			running++
			cl, err := api.NewClient([]string{p.URL()}, nil)
			if err != nil {
				return -1, err
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			cs, err := cl.ClusterStatus(cctx)
			cancel()
			if err != nil || cs.Role != "leader" || cs.Leader == nil || cs.Leader.HTTPAddr == "" {
				continue
			}
			cctx, cancel = context.WithTimeout(ctx, time.Second)
			st, err := cl.State(cctx, api.StateOptions{})
			cancel()
			if err == nil && st.Index > 0 {
				return i, nil
			}
		}
		if running == 0 {
			return -1, fmt.Errorf("every master exited; %s says: %s", ms.Procs[0].LogPath, lastLine(ms.Procs[0].LogPath))
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("no leader: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// lastLine returns the last non-empty line of a file.
func lastLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return lines[len(lines)-1]
}
