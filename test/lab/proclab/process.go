// Package proclab supervises one child process run inside a lab namespace:
// it starts it (again, after an exit) with its output appended to a log
// file, signals it by its PID only, stops it with SIGTERM and then SIGKILL,
// and tails its log. labcluster runs every `carve master`, `carve agent` and
// rogue peer of a cluster as one.
package proclab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
)

// StopTimeout is how long Stop waits after SIGTERM before it sends SIGKILL.
const StopTimeout = 10 * time.Second

// Process is one `carve master` or `carve agent` child running inside a
// namespace. It can be started again after it exited (same name, same log
// file, appended to). Signals go to its PID only, through the os.Process
// that started it, so nothing else can be hit by mistake.
type Process struct {
	// Name identifies the process in logs and errors ("m1", "agent-h2").
	Name string
	// LogPath is the file that receives its stdout and stderr.
	LogPath string

	ns *netnslab.Namespace

	mu   sync.Mutex
	cmd  *exec.Cmd
	args []string
	done chan struct{} // closed when the current run has exited
	err  error         // the current run's exit status, once done
}

// New is a process named name, logging to logPath, that runs in ns once
// started.
func New(name, logPath string, ns *netnslab.Namespace) *Process {
	return &Process{Name: name, LogPath: logPath, ns: ns}
}

// Start runs binary with args inside the process's namespace. It refuses
// when a previous run still runs.
func (p *Process) Start(binary string, args []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runningLocked() {
		return fmt.Errorf("%s is already running (pid %d)", p.Name, p.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log of %s: %w", p.Name, err)
	}
	fmt.Fprintf(logf, "=== %s start: %s %s\n", time.Now().Format(time.RFC3339Nano), binary, strings.Join(args, " "))
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C in the terminal reaches only the
	// program that drives the cluster, which then stops its children in
	// order instead of having them all killed at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.ns.Start(cmd); err != nil {
		logf.Close()
		return fmt.Errorf("start %s in %s: %w", p.Name, p.ns.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.args, p.done, p.err = cmd, append([]string(nil), args...), done, nil
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logf, "=== %s exit: %v\n", time.Now().Format(time.RFC3339Nano), exitString(err))
		logf.Close()
		p.mu.Lock()
		if p.done == done {
			p.err = err
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

func exitString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func (p *Process) runningLocked() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Running reports whether the process was started and has not exited.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runningLocked()
}

// PID is the process id of the current (or last) run, 0 before the first.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Args are the arguments of the current (or last) run.
func (p *Process) Args() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.args...)
}

// Done is closed when the current run exits (nil before the first start).
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// ExitErr is the exit status of the last run once it has exited.
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signal sends sig to the process (by its PID) if it runs.
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.runningLocked() {
		return nil
	}
	err := p.cmd.Process.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// Stop sends SIGTERM and waits for the exit; after timeout (StopTimeout when
// zero), or when ctx ends, it sends SIGKILL. An exit caused by the signal is
// not an error; an error says the process had to be killed.
func (p *Process) Stop(ctx context.Context, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = StopTimeout
	}
	done := p.Done()
	if done == nil || !p.Running() {
		return nil
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM %s: %w", p.Name, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = p.Kill()
	return fmt.Errorf("%s (pid %d) did not stop within %s of SIGTERM: killed", p.Name, p.PID(), timeout)
}

// Kill sends SIGKILL (kill -9) and waits until the process is gone.
func (p *Process) Kill() error {
	done := p.Done()
	if done == nil {
		return nil
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("SIGKILL %s: %w", p.Name, err)
	}
	<-done
	return nil
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string {
	return TailFile(p.LogPath, n)
}

// TailFile returns the last n lines of a file (or why it cannot be read).
func TailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	const maxRead = 256 << 10
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	off := max(st.Size()-maxRead, 0)
	data, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := bytes.Split(data, []byte("\n"))
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // the first one is cut
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
