package main

// The fan-out rows (-only fanout): W synthetic watchers of the changes,
// spread over the three masters, each on its own connection as an agent
// holds it: first long polls (GET /overlay-master/changes, an agent of a
// release before the stream), one registration, then a burst of 100;
// then the same W as streams (GET /overlay-master/changes/stream,
// fanoutstream.go), the same two; then the leader killed and one
// registration after it (streams, where the masters serve them). Each is
// timed from its last commit (or the kill) until every watcher holds its
// index. The same measurement runs on the carve of -baseline-rev beside
// it.

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// fanoutOptions are a fan-out run's settings.
type fanoutOptions struct {
	watchers   int
	masterArgs []string
	// perProcess: watchers one process holds (more run in watcher
	// processes, fanoutprocs.go)
	perProcess int
	// noLongPolls skips the long polls (their rows stay empty)
	noLongPolls bool
	// restartAfter: the killed leader is started again this long after
	// the kill, as systemd's RestartSec does (0: never), for watcher counts
	// the two masters left cannot hold
	restartAfter time.Duration
}

// parkLimit is how long w watchers may take to connect: TLS handshakes
// on a machine the masters share.
func parkLimit(w int) time.Duration {
	return max(5*time.Minute, time.Duration(w)*10*time.Millisecond)
}

// fanoutFigures are one run's fan-out measurements.
type fanoutFigures struct {
	watchers        int
	longPolls       bool          // the long polls were measured
	one, oneMax     time.Duration // one registration: p99 and slowest watcher
	burst, burstMax time.Duration // a burst of 100, from its last commit
	failover        time.Duration // leader killed -> every watcher holds the next change
	failoverP99     time.Duration
	restarted       time.Duration // the killed master started again this long after the kill (0: not)
	rssMB, hwmMB    float64       // busiest master: RSS after, and its peak
	bytesPerWatcher float64       // bytes of one change's answer
	// The same W watchers as streams (streams: the masters serve them).
	streams                     bool
	streamOne, streamOneMax     time.Duration
	streamBurst, streamBurstMax time.Duration
	streamRSSMB                 float64 // busiest master's RSS after the streams' burst
	// From the first request of the change (one registration, or the
	// burst) rather than its last commit as the registering client saw
	// it: that client shares the machine with the watchers, and its answer
	// may come after theirs.
	oneSent, burstSent, streamOneSent, streamBurstSent time.Duration
	streamBytes                                        float64 // bytes of one change's frame
}

// startWatchers starts w long-poll watchers from index since, watcher i
// on master i%3 first (the next one when it fails, as an agent fails
// over); they stop with ctx.
func startWatchers(ctx context.Context, hc *http.Client, urls []string, w int, since uint64) *watcherSet {
	ws := newWatcherSet(w, since)
	for i := range w {
		go watch(ctx, hc, urls, i, since, ws)
	}
	return ws
}

// watch is one watcher's loop.
func watch(ctx context.Context, hc *http.Client, urls []string, w int, since uint64, ws watchSink) {
	m := w % len(urls)
	for ctx.Err() == nil {
		trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { ws.park(w, true) }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, urls[m]+"/overlay-master/changes?since="+strconv.FormatUint(since, 10)+"&wait=60s", nil)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := hc.Do(req)
		ws.park(w, false)
		if err != nil {
			if ctx.Err() == nil {
				ws.fail(fmt.Sprintf("request to master %d: %v", m, err))
			}
			m = (m + 1) % len(urls)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		at := time.Now()
		if err != nil || resp.StatusCode != http.StatusOK {
			if resp.StatusCode == http.StatusGone {
				var e api.Error
				if json.Unmarshal(data, &e) == nil && e.Oldest > since {
					since = e.Oldest // the bench reads no state: it follows from there
					continue
				}
			}
			ws.fail(fmt.Sprintf("master %d answered %d", m, resp.StatusCode))
			m = (m + 1) % len(urls)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		// The index leads the answer: the synthetic watcher (one of
		// thousands on this machine, each standing for a host) reads it
		// alone rather than decoding every record.
		head := data
		if resp.Header.Get("Content-Encoding") == "gzip" {
			head = gunzipHead(data)
		}
		index, ok := leadingIndex(head)
		if !ok {
			continue
		}
		if index > since {
			since = index
			ws.record(w, since, at, len(data))
		}
	}
}

// fanoutOn measures the fan-out on c (masters started) at n agents.
func fanoutOn(ctx context.Context, c *labcluster.Cluster, n int, o fanoutOptions) (f fanoutFigures, err error) {
	op := c.Client()
	progress("%d agents: registering", n)
	if err := registerAllRetrying(ctx, op, n); err != nil {
		return f, err
	}
	ch, err := op.Changes(ctx, 0, 0)
	if err != nil {
		return f, err
	}
	f.watchers = o.watchers
	top := ch.Index
	if !o.noLongPolls {
		progress("%d agents: starting %d long-poll watchers at index %d", n, o.watchers, ch.Index)
		ws, stop, err := startWatcherSet(ctx, c, kindPoll, o.watchers, ch.Index, o.perProcess)
		if err != nil {
			return f, err
		}
		f.longPolls = true
		f.one, f.oneMax, f.burst, f.burstMax, f.oneSent, f.burstSent, f.bytesPerWatcher, top, err = measureChanges(ctx, op, ws, n, "long poll")
		// The long polls end (their connections closed: one process holds
		// at most 20,000 descriptors) before the streams begin.
		stop()
		if err != nil {
			return f, err
		}
		for _, m := range c.Masters() {
			f.rssMB = max(f.rssMB, rssMB(m.PID()))
		}
	}

	if f.streams, err = streamSupported(ctx, c, top); err != nil {
		return f, err
	}
	kind := kindPoll
	if f.streams {
		kind = kindStream
	} else {
		progress("%d agents: the masters serve no changes stream (404): long polls alone", n)
	}
	progress("%d agents: starting %d %s watchers at index %d", n, o.watchers, kind, top)
	ws, stop, err := startWatcherSet(ctx, c, kind, o.watchers, top, o.perProcess)
	if err != nil {
		return f, err
	}
	defer stop()
	if f.streams {
		if f.streamOne, f.streamOneMax, f.streamBurst, f.streamBurstMax, f.streamOneSent, f.streamBurstSent, f.streamBytes, _, err = measureChanges(ctx, op, ws, n+101, "stream"); err != nil {
			return f, fmt.Errorf("streams: %w", err)
		}
		for _, m := range c.Masters() {
			f.streamRSSMB = max(f.streamRSSMB, rssMB(m.PID()))
		}
	}
	return fanoutFailover(ctx, c, op, ws, n+202, o, f)
}

// measureChanges times one registration (synthetic agent first), then a
// burst of 100 (the next ids), to every watcher of ws; it returns their
// p99 and slowest delays, the bytes of one change per watcher and the
// index the burst ran to.
func measureChanges(ctx context.Context, op *apiclient.Client, ws *watcherSet, first int, how string) (one, oneMax, burst, burstMax, oneSent, burstSent time.Duration, bytesPer float64, top uint64, err error) {
	// Every watcher parked (connected, its request written) before the
	// change: on a busy machine thousands of TLS handshakes take a while,
	// and they are not what is measured.
	if err = ws.waitParked(ctx, parkLimit(len(ws.last))); err != nil {
		return
	}
	ws.reset()
	start := time.Now()
	info, err := registerRetrying(ctx, op, synthetic(first, false, false))
	if err != nil {
		return
	}
	commit := time.Now()
	if one, oneMax, err = ws.waitAll(ctx, info.Version, commit, 2*time.Minute); err != nil {
		err = fmt.Errorf("one registration: %w", err)
		return
	}
	if a := ws.answers.Load(); a > 0 {
		bytesPer = float64(ws.bytes.Load()) / float64(a)
	}
	if oneSent, _, err = ws.waitAll(ctx, info.Version, start, time.Minute); err != nil {
		return
	}
	progress("%s: one change to %d watchers: p99 %s, slowest %s (commit took %s; p99 %s from the request)", how, len(ws.last), one, oneMax, commit.Sub(start), oneSent)

	// A burst of 100 registrations at once.
	if err = ws.waitParked(ctx, parkLimit(len(ws.last))); err != nil {
		return
	}
	ws.reset()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lastCommit time.Time
	errs := make([]error, 100)
	burstStart := time.Now()
	for k := range 100 {
		wg.Go(func() {
			info, err := registerRetrying(ctx, op, synthetic(first+1+k, false, false))
			errs[k] = err
			if err == nil {
				mu.Lock()
				if now := time.Now(); now.After(lastCommit) {
					lastCommit = now
				}
				top = max(top, info.Version)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err = errors.Join(errs...); err != nil {
		err = fmt.Errorf("burst: %w", err)
		return
	}
	if burst, burstMax, err = ws.waitAll(ctx, top, lastCommit, 2*time.Minute); err != nil {
		err = fmt.Errorf("burst: %w", err)
		return
	}
	if burstSent, _, err = ws.waitAll(ctx, top, burstStart, time.Minute); err != nil {
		return
	}
	progress("%s: burst of 100 to %d watchers: p99 %s, slowest %s after the last commit (p99 %s from the first request)", how, len(ws.last), burst, burstMax, burstSent)
	return
}

// fanoutFailover kills the leader, registers synthetic agent id once a
// leader is back, and times it to every watcher of ws; with
// o.restartAfter the killed master starts again that long after the kill.
func fanoutFailover(ctx context.Context, c *labcluster.Cluster, op *apiclient.Client, ws *watcherSet, id int, o fanoutOptions, f fanoutFigures) (fanoutFigures, error) {
	for _, m := range c.Masters() {
		f.hwmMB = max(f.hwmMB, procStatusMB(m.PID(), "VmHWM:"))
	}

	// Leader failover: kill it, then one registration once a leader is
	// back; every watcher must hold it.
	if err := ws.waitParked(ctx, parkLimit(len(ws.last))); err != nil {
		return f, err
	}
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		return f, err
	}
	ws.reset()
	kill := time.Now()
	if err := c.KillMaster(leader); err != nil {
		return f, err
	}
	restartErr := make(chan error, 1)
	if o.restartAfter > 0 {
		go func() {
			select {
			case <-ctx.Done():
				restartErr <- ctx.Err()
				return
			case <-time.After(o.restartAfter):
			}
			err := c.StartMaster(leader)
			if err == nil {
				progress("master %s started again %s after the kill", leader.ID, time.Since(kill))
			}
			restartErr <- err
		}()
	}
	var after *api.AgentInfo
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer rcancel()
	for {
		after, err = op.Register(rctx, synthetic(id, false, false))
		if err == nil || rctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return f, fmt.Errorf("register after the failover: %w", err)
	}
	progress("leader %s killed; registered again after %s", leader.ID, time.Since(kill))
	if f.failoverP99, f.failover, err = ws.waitAll(ctx, after.Version, kill, max(3*time.Minute, parkLimit(len(ws.last)))); err != nil {
		return f, fmt.Errorf("failover: %w", err)
	}
	if o.restartAfter > 0 {
		if err := <-restartErr; err != nil {
			return f, fmt.Errorf("restart the killed master: %w", err)
		}
		f.restarted = o.restartAfter
	}
	progress("failover: every watcher served again %s after the kill (p99 %s)", f.failover, f.failoverP99)
	for _, m := range c.Masters() {
		if m.Running() {
			f.hwmMB = max(f.hwmMB, procStatusMB(m.PID(), "VmHWM:"))
		}
	}
	return f, nil
}

// procStatusMB is a /proc/PID/status field in kB, as MiB (0 when unreadable).
func procStatusMB(pid int, field string) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

// fanoutRun measures the fan-out with binary at n agents.
func fanoutRun(ctx context.Context, binary string, n int, o fanoutOptions) (f fanoutFigures, err error) {
	measured := false
	progress("%d agents: starting the cluster (%s)", n, binary)
	err = labcluster.With(ctx, labcluster.Options{Binary: binary, Hosts: 3, Masters: 3, Prefix: prefix, LogLevel: "warn", MasterArgs: o.masterArgs, Network: networkFor(n)}, os.Stderr, func(c *labcluster.Cluster) error {
		if err := c.StartMasters(ctx); err != nil {
			return err
		}
		var ferr error
		f, ferr = fanoutOn(ctx, c, n, o)
		measured = ferr == nil
		return ferr
	})
	if err != nil && measured && ctx.Err() == nil {
		// Masters slow to stop after the measurement (their watches
		// outlast the shutdown timeout) do not void it.
		fmt.Fprintf(os.Stderr, "bench/scale: %d agents, after the measurement: %v\n", n, err)
		err = nil
	}
	return f, err
}

// fanoutTable runs the fan-out on the new carve and on the baseline, and
// returns the rows side by side.
func fanoutTable(ctx context.Context, binary, baseline, rev string, n int, o fanoutOptions) (benchtable.Table, error) {
	tbl := benchtable.Table{Title: fmt.Sprintf("scale: fan-out, %d synthetic agents, %d watchers of the changes over 3 secure masters (real processes, one machine)", n, o.watchers)}
	f, err := fanoutRun(ctx, binary, n, o)
	if err != nil {
		return tbl, err
	}
	var base fanoutFigures
	baseNote := ""
	if baseline == "" {
		baseNote = "n/a (no baseline)"
	} else if base, err = fanoutRun(ctx, baseline, n, o); err != nil {
		if ctx.Err() != nil {
			return tbl, ctx.Err()
		}
		fmt.Fprintf(os.Stderr, "bench/scale: fan-out baseline at %d: %v\n", n, err)
		baseNote = "n/a (the baseline run failed; see stderr)"
	}
	row := func(name string, v, b float64, unit, note string) {
		r := benchtable.Row{Name: name, Value: v, Unit: unit, Baseline: "carve " + rev + ", same N and watchers", BaseVal: b, Note: note}
		if baseNote != "" {
			r.Baseline, r.BaseNA = baseNote, true
		}
		if strings.HasPrefix(name, "long poll") && !f.longPolls {
			r.Value, r.BaseNA, r.Note = 0, true, "n/a: long polls not measured (-fanout-long-polls=false)"
		}
		tbl.Add(r)
	}
	row("long poll: one registration -> every watcher, p99", ms(f.one), ms(base.one), "ms", fmt.Sprintf("slowest %.0f ms (baseline %.0f); goal < 1 s", ms(f.oneMax), ms(base.oneMax)))
	row("long poll: burst of 100 -> every watcher, p99 after the last commit", ms(f.burst), ms(base.burst), "ms", fmt.Sprintf("slowest %.0f ms (baseline %.0f); goal < 1 s", ms(f.burstMax), ms(base.burstMax)))
	// The streams beside the long polls of this same run (and of the
	// baseline, where it serves streams).
	srow := func(name string, v, lp, b float64, unit, note string) {
		r := benchtable.Row{Name: name, Value: v, Unit: unit, Baseline: "long poll, this run", BaseVal: lp, Note: note}
		switch {
		case !f.streams:
			r.Value, r.BaseNA, r.Note = 0, true, "n/a: the masters serve no stream"
		case !f.longPolls && base.streams && baseNote == "":
			// No long polls: the baseline's streams stand beside these.
			r.Baseline, r.BaseVal = "carve "+rev+"'s stream, same N and watchers", b
		case !f.longPolls:
			r.Baseline, r.BaseNA = "n/a (long polls not measured, no baseline stream)", true
		case base.streams:
			r.Note += fmt.Sprintf("; carve %s's stream: %.0f %s", rev, b, unit)
		}
		tbl.Add(r)
	}
	slowest := func(v, lp, b time.Duration) string {
		if !f.longPolls {
			return fmt.Sprintf("slowest %.0f ms (baseline %.0f); goal < 1 s", ms(v), ms(b))
		}
		return fmt.Sprintf("slowest %.0f ms (long poll %.0f); goal < 1 s", ms(v), ms(lp))
	}
	srow("stream: one registration -> every watcher, p99", ms(f.streamOne), ms(f.one), ms(base.streamOne), "ms", slowest(f.streamOneMax, f.oneMax, base.streamOneMax))
	srow("stream: burst of 100 -> every watcher, p99 after the last commit", ms(f.streamBurst), ms(f.burst), ms(base.streamBurst), "ms", slowest(f.streamBurstMax, f.burstMax, base.streamBurstMax))
	srow("stream: one registration, from its request -> every watcher, p99", ms(f.streamOneSent), ms(f.oneSent), ms(base.streamOneSent), "ms", "the commit included")
	srow("stream: burst of 100, from its first request -> every watcher, p99", ms(f.streamBurstSent), ms(f.burstSent), ms(base.streamBurstSent), "ms", "the commits included")
	srow("stream: busiest master RSS after the burst", f.streamRSSMB, f.rssMB, base.streamRSSMB, "MB", "goal < 2 GB")
	srow("stream: bytes of one change's frame per watcher", f.streamBytes, f.bytesPerWatcher, base.streamBytes, "B", "")
	failNote := "p99 %.0f ms (baseline %.0f); includes the election and the watchers' failover"
	if f.streams {
		failNote += "; stream watchers (the baseline's: its own kind)"
	}
	if f.restarted > 0 {
		failNote += fmt.Sprintf("; the killed master started again %s after the kill", f.restarted)
	}
	row("leader killed -> every watcher holds the next change", ms(f.failover), ms(base.failover), "ms", fmt.Sprintf(failNote, ms(f.failoverP99), ms(base.failoverP99)))
	row("long poll: busiest master RSS after the burst", f.rssMB, base.rssMB, "MB", "goal < 2 GB")
	row("busiest master peak RSS (VmHWM)", f.hwmMB, base.hwmMB, "MB", "through the failover")
	row("long poll: bytes of one change's answer per watcher", f.bytesPerWatcher, base.bytesPerWatcher, "B", "")
	return tbl, nil
}

// fanoutOnly prints the fan-out tables, each beside the carve of
// -fanout-baseline-rev (or -baseline-carve) run in the same invocation.
func fanoutOnly(ctx context.Context, sizes []int, binary string, o idleOptions) error {
	br, err := labcluster.NewBenchRun(ctx, prefix, "scale", binary, "", false)
	if err != nil {
		return err
	}
	defer br.Close()
	baseline := o.binary
	switch baseline {
	case "none":
		baseline = ""
	case "":
		progress("building the fan-out baseline carve of %s", o.fanoutRev)
		if baseline, err = buildBaseline(ctx, o.fanoutRev, br.Dir); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fmt.Fprintf(os.Stderr, "bench/scale: the fan-out baseline: %v\n", err)
			baseline = ""
		}
	}
	for _, n := range sizes {
		fo := fanoutOptions{watchers: o.watchers, masterArgs: strings.Fields(o.masterArgs), perProcess: o.perProcess, noLongPolls: !o.longPolls, restartAfter: o.restartAfter}
		if fo.watchers <= 0 {
			fo.watchers = n
		}
		tbl, err := fanoutTable(ctx, br.Binary, baseline, o.fanoutRev, n, fo)
		if err != nil {
			return fmt.Errorf("%d agents: %w", n, err)
		}
		if err := tbl.Print(os.Stdout); err != nil {
			return err
		}
	}
	return nil
}

// leadingIndex reads the index a changes answer starts with
// ({"index":N,...}).
func leadingIndex(data []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"index":`))
	if !ok {
		return 0, false
	}
	end := bytes.IndexByte(rest, ',')
	if end < 0 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(rest[:end]), 10, 64)
	return v, err == nil
}

// registerRetrying registers req, again while the masters answer that the
// outcome is unknown or that there is no leader (elections happen on a
// busy machine); a registration is idempotent.
func registerRetrying(ctx context.Context, op *apiclient.Client, req api.RegisterRequest) (*api.AgentInfo, error) {
	var info *api.AgentInfo
	err := retry.Until(ctx, 100*time.Millisecond, func() error {
		var err error
		if info, err = op.Register(ctx, req); err != nil && !api.IsRetryable(err) {
			return retry.Permanent(err)
		}
		return err
	})
	return info, err
}

// registerAllRetrying registers n synthetic agents (no keys) with 64
// concurrent clients, each registration retried as registerRetrying does.
func registerAllRetrying(ctx context.Context, op *apiclient.Client, n int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if _, err := registerRetrying(ctx, op, synthetic(i, false, false)); err != nil {
					errs <- fmt.Errorf("register %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// gunzipHead decompresses the first bytes of a gzip'ed answer (enough for
// its leading index).
func gunzipHead(data []byte) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil
	}
	head := make([]byte, 64)
	n, _ := io.ReadFull(zr, head)
	return head[:n]
}
