package main

// Watchers in processes of their own: one process holds at most 20,000
// descriptors on the lab machines, so more watchers than -watchers-per-process
// run in watcher processes (this same binary, -watch-child), each started in
// the lab's underlay namespace with its share of the watchers. A watcher
// process writes what its watchers see as lines on its stdout, which the
// bench reads into one watcherSet; the times are the process's own clock
// readings (wall clock: one machine), taken as each frame or answer arrived.
//
//	r W INDEX UNIXNANO BYTES   watcher W held INDEX at that time
//	p W 0|1                    watcher W parked (1) or not (0)
//	f TEXT                     one failed request or stream
//
// The bench closes a process's stdin to stop it.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// Watcher kinds.
const (
	kindPoll   = "poll"   // the long poll, GET /overlay-master/changes
	kindStream = "stream" // the changes stream
)

// childSpec is what the bench hands a watcher process on its stdin's
// first line.
type childSpec struct {
	Kind  string    `json:"kind"`
	URLs  []string  `json:"urls"`
	TLS   pki.Files `json:"tls"`
	First int       `json:"first"` // the first watcher's number (its first master: First % 3)
	Count int       `json:"count"`
	Since uint64    `json:"since"`
}

// startWatcherSet starts w watchers of kind from index since: in this
// process when w is at most perProcess, otherwise in watcher processes of
// at most perProcess each. stop ends them and their connections.
func startWatcherSet(ctx context.Context, c *labcluster.Cluster, kind string, w int, since uint64, perProcess int) (ws *watcherSet, stop func(), err error) {
	if w <= perProcess {
		wctx, cancel := context.WithCancel(ctx)
		hc := watchClient(c, w)
		if kind == kindStream {
			ws = startStreamWatchers(wctx, hc, c.MasterURLs(), w, since)
		} else {
			ws = startWatchers(wctx, hc, c.MasterURLs(), w, since)
		}
		return ws, func() { cancel(); hc.CloseIdleConnections() }, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("watcher processes: %w", err)
	}
	ws = newWatcherSet(w, since)
	var procs []*watcherProc
	stop = func() {
		for _, p := range procs {
			p.stop()
		}
	}
	for first := 0; first < w; first += perProcess {
		spec := childSpec{Kind: kind, URLs: c.MasterURLs(), TLS: c.OperatorFiles(), First: first, Count: min(perProcess, w-first), Since: since}
		p, err := startWatcherProc(c, exe, spec, ws)
		if err != nil {
			stop()
			return nil, nil, err
		}
		procs = append(procs, p)
	}
	progress("%d %s watchers in %d processes", w, kind, len(procs))
	return ws, stop, nil
}

// watcherProc is one watcher process, seen from the bench.
type watcherProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	read  chan struct{} // closed when its stdout is read to the end
}

// startWatcherProc starts a watcher process in the lab's underlay with
// spec, and feeds what it writes into ws.
func startWatcherProc(c *labcluster.Cluster, exe string, spec childSpec, ws *watcherSet) (*watcherProc, error) {
	cmd := exec.Command(exe, "-watch-child")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Lab.Underlay.Start(cmd); err != nil {
		return nil, fmt.Errorf("watcher process: %w", err)
	}
	p := &watcherProc{cmd: cmd, stdin: stdin, read: make(chan struct{})}
	go func() {
		defer close(p.read)
		if err := readWatcherLines(stdout, ws); err != nil {
			ws.fail(fmt.Sprintf("watcher process %d: %v", cmd.Process.Pid, err))
		}
	}()
	line, _ := json.Marshal(spec)
	if _, err := stdin.Write(append(line, '\n')); err != nil {
		p.stop()
		return nil, fmt.Errorf("watcher process: %w", err)
	}
	return p, nil
}

// stop closes the process's stdin, which ends it, and waits for it (it is
// killed after 30 s).
func (p *watcherProc) stop() {
	p.stdin.Close()
	select {
	case <-p.read:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.read
	}
	_ = p.cmd.Wait()
}

// readWatcherLines applies a watcher process's lines to ws until EOF.
func readWatcherLines(r io.Reader, ws *watcherSet) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		kind, rest, _ := strings.Cut(line, " ")
		if kind == "f" {
			ws.fail(rest)
			continue
		}
		f := strings.Fields(rest)
		w := -1
		if len(f) > 0 {
			if v, err := strconv.Atoi(f[0]); err == nil && v >= 0 && v < len(ws.last) {
				w = v
			}
		}
		switch {
		case kind == "p" && w >= 0 && len(f) == 2:
			ws.park(w, f[1] == "1")
		case kind == "r" && w >= 0 && len(f) == 4:
			index, err1 := strconv.ParseUint(f[1], 10, 64)
			at, err2 := strconv.ParseInt(f[2], 10, 64)
			n, err3 := strconv.Atoi(f[3])
			if err := errors.Join(err1, err2, err3); err != nil {
				return fmt.Errorf("line %q: %w", line, err)
			}
			ws.record(w, index, time.Unix(0, at), n)
		default:
			return fmt.Errorf("line %q: want r, p or f", line)
		}
	}
	return sc.Err()
}

// lineSink is a watcher process's watchSink: lines on its stdout,
// flushed every few milliseconds (the times are taken on arrival, so the
// flush delays only when the bench learns of them).
type lineSink struct {
	mu     sync.Mutex
	out    *bufio.Writer
	first  int
	parked []bool // by watcher - first: a park line only when it changes
	err    error
}

func (s *lineSink) record(w int, index uint64, at time.Time, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, "r %d %d %d %d\n", w, index, at.UnixNano(), n)
}

func (s *lineSink) park(w int, parked bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parked[w-s.first] == parked {
		return
	}
	s.parked[w-s.first] = parked
	v := 0
	if parked {
		v = 1
	}
	fmt.Fprintf(s.out, "p %d %d\n", w, v)
}

func (s *lineSink) fail(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, "f %s\n", strings.ReplaceAll(kind, "\n", " "))
}

// flush writes what is buffered; a failed write (the bench is gone) is kept.
func (s *lineSink) flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = s.out.Flush()
	}
	return s.err
}

// runWatchChild is a watcher process (-watch-child): it reads its
// childSpec from stdin, runs its watchers until stdin ends, and reports
// on stdout.
func runWatchChild(ctx context.Context) error {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("watcher process: read the spec: %w", err)
	}
	var spec childSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("watcher process: spec: %w", err)
	}
	if spec.Count < 1 || len(spec.URLs) == 0 || (spec.Kind != kindPoll && spec.Kind != kindStream) {
		return fmt.Errorf("watcher process: spec %s: want a kind (poll or stream), URLs and a count", line)
	}
	cfg, err := spec.TLS.ClientConfig()
	if err != nil {
		return fmt.Errorf("watcher process: %w", err)
	}
	// This process runs in the lab's underlay namespace: it dials directly.
	hc := watchClientFrom(&http.Transport{TLSClientConfig: cfg, Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}, spec.Count)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sink := &lineSink{out: bufio.NewWriterSize(os.Stdout, 256<<10), first: spec.First, parked: make([]bool, spec.Count)}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
			if sink.flush() != nil {
				cancel() // the bench is gone
				return
			}
		}
	}()
	for i := range spec.Count {
		if spec.Kind == kindStream {
			go streamWatch(ctx, hc, spec.URLs, spec.First+i, spec.Since, sink)
		} else {
			go watch(ctx, hc, spec.URLs, spec.First+i, spec.Since, sink)
		}
	}
	// Until the bench closes stdin (or is gone).
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, in); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	cancel()
	hc.CloseIdleConnections()
	return sink.flush()
}
