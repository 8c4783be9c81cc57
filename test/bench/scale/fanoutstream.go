package main

// The stream watchers of the fan-out rows: each holds one changes stream
// (GET /overlay-master/changes/stream) as an agent of this release does,
// beside the long-poll watchers (fanout.go) of agents before it.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// errNoStream: the masters answer 404 to the stream (a carve before it).
var errNoStream = errors.New("the masters serve no changes stream")

// watchClient is the HTTP client of W watchers: one connection each,
// HTTP/1.1, the gzip'ed answers read as they come.
func watchClient(c *labcluster.Cluster, w int) *http.Client {
	return watchClientFrom(c.HTTPClient().Transport.(*http.Transport), w)
}

// watchClientFrom is watchClient on a copy of the transport t (its TLS
// configuration and dialer).
func watchClientFrom(t *http.Transport, w int) *http.Client {
	base := t.Clone()
	// As the agent's client (http.DefaultTransport's): a master at its
	// connection cap leaves new connections in its listen backlog, and a
	// handshake that never ends would hold its watcher there for good.
	base.TLSHandshakeTimeout = 10 * time.Second
	base.MaxIdleConnsPerHost = w
	base.MaxConnsPerHost = 0
	base.ForceAttemptHTTP2 = false
	// Each watcher stands for a host: the gzip'ed answers are read as they
	// come, and only their first bytes are decompressed for the index
	// (gunzipping every answer here would bill the masters' machine for
	// work spread over the agents' hosts).
	base.DisableCompression = true
	base.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	return &http.Client{Transport: base}
}

// streamSupported tells whether the masters serve the stream (a carve of
// -fanout-baseline-rev may not).
func streamSupported(ctx context.Context, c *labcluster.Cluster, since uint64) (bool, error) {
	hc := watchClient(c, 1)
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.MasterURLs()[0]+api.StreamPath+"?since="+strconv.FormatUint(since, 10), nil)
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	}
	return false, fmt.Errorf("GET %s: %s", api.StreamPath, resp.Status)
}

// startStreamWatchers starts w stream watchers from index since, watcher
// i on master i%3 first (the next one when its stream fails, as an agent
// fails over); they stop with ctx. A watcher is parked while its stream
// is open (its first frame read).
func startStreamWatchers(ctx context.Context, hc *http.Client, urls []string, w int, since uint64) *watcherSet {
	ws := newWatcherSet(w, since)
	for i := range w {
		go streamWatch(ctx, hc, urls, i, since, ws)
	}
	return ws
}

// streamWatch is one stream watcher's loop. It opens its stream again as
// an agent does (agent/watch.go over apiclient): at once, at the next
// master, after a stream that lived a second; after every master failed
// in a row, after a backoff step of the agent's (2 s doubling to 10 s,
// jittered), so that thousands failing over at once spread out as agents'
// reconnections do.
func streamWatch(ctx context.Context, hc *http.Client, urls []string, w int, since uint64, ws watchSink) {
	m := w % len(urls)
	b := retry.Backoff{First: 2 * time.Second, Max: 10 * time.Second}
	failed := 0
	for ctx.Err() == nil {
		var opened time.Time // its first frame
		err := followOneStream(ctx, hc, urls[m], w, &since, ws, &opened)
		ws.park(w, false)
		if ctx.Err() != nil {
			return
		}
		ws.fail(fmt.Sprintf("stream of master %d: %v", m, err))
		m = (m + 1) % len(urls)
		if !opened.IsZero() && time.Since(opened) >= time.Second {
			failed = 0
			b.Reset()
			continue
		}
		if failed++; failed%len(urls) == 0 && !retry.Sleep(ctx, b.Next()) {
			return
		}
	}
}

// followOneStream reads one stream until it fails, recording each
// changes frame's index (read from its first bytes alone, as the long
// poll's watchers read theirs) and when the first frame came in opened.
func followOneStream(ctx context.Context, hc *http.Client, base string, w int, since *uint64, ws watchSink, opened *time.Time) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+api.StreamPath+"?since="+strconv.FormatUint(*since, 10)+"&heartbeat=15s", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return errNoStream
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", resp.Status)
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	var payload []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		kind, size, ok := strings.Cut(strings.TrimSpace(string(line)), " ")
		n, perr := strconv.Atoi(size)
		if !ok || perr != nil || n < 0 || n > api.MaxFrameBytes {
			return fmt.Errorf("frame header %q", line)
		}
		if cap(payload) < n {
			payload = make([]byte, n)
		}
		payload = payload[:n]
		if _, err := io.ReadFull(br, payload); err != nil {
			return err
		}
		at := time.Now()
		ws.park(w, true)
		if opened.IsZero() {
			*opened = at
		}
		head := payload
		switch kind {
		case api.FrameChangesGzip:
			head = gunzipHead(payload)
		case api.FrameChanges:
		case api.FrameEnd:
			return fmt.Errorf("end frame %.200s", payload)
		default:
			continue
		}
		if index, ok := leadingIndex(head); ok && index > *since {
			*since = index
			ws.record(w, index, at, n)
		}
	}
}
