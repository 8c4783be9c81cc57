package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// What the masters' state costs its readers: the bytes a watcher receives
// for one change, and whole-state reads by many concurrent readers.

// get reads url raw (no transparent gzip) and returns the body's length.
func get(ctx context.Context, hc *http.Client, url, encoding string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept-Encoding", encoding)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return int(n), err
}

// bytesPerChange watches with both the changes watch and the blocking
// state watch on a follower, registers one agent, and returns what each
// watcher received (and the state gzip'ed).
func bytesPerChange(ctx context.Context, c *labcluster.Cluster, op *apiclient.Client, n int, mesh bool) (delta, full, fullGz int, err error) {
	st, err := op.State(ctx, apiclient.StateOptions{Consistent: true})
	if err != nil {
		return 0, 0, 0, err
	}
	base := c.Masters()[1].URL()
	hc := c.HTTPClient()
	var wg sync.WaitGroup
	var derr, ferr error
	wg.Go(func() {
		delta, derr = get(ctx, hc, fmt.Sprintf("%s/overlay-master/changes?since=%d&wait=30s", base, st.Index), "identity")
	})
	wg.Go(func() {
		full, ferr = get(ctx, hc, fmt.Sprintf("%s/overlay-master/state?index=%d&wait=30s", base, st.Index), "identity")
	})
	time.Sleep(200 * time.Millisecond) // both watches are waiting
	if _, err := op.Register(ctx, synthetic(n+100, mesh, true)); err != nil {
		return 0, 0, 0, err
	}
	wg.Wait()
	if err := errors.Join(derr, ferr); err != nil {
		return 0, 0, 0, err
	}
	fullGz, err = get(ctx, hc, base+"/overlay-master/state", "gzip")
	return delta, full, fullGz, err
}

// stateRows measures the state reads, one reader alone and readers
// concurrent ones over rounds rounds, and adds their rows to tbl.
func stateRows(ctx context.Context, c *labcluster.Cluster, tbl *benchtable.Table, readers, rounds int) error {
	one, _, err := stateReads(ctx, c, 1, 10, false)
	if err != nil {
		return err
	}
	var many []time.Duration
	for r := range rounds {
		d, _, err := stateReads(ctx, c, readers, 10, false)
		if err != nil {
			return err
		}
		progress("state reads round %d: %d readers p50 %.1f ms p99 %.1f ms", r+1, readers, ms(pct(d, 50)), ms(pct(d, 99)))
		many = append(many, d...)
	}
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("GET state p50, %d readers", readers), Value: ms(pct(many, 50)), Unit: "ms",
		Baseline: "one reader alone, p50", BaseVal: ms(pct(one, 50)), Note: "gzip'ed body read to its last byte, not decompressed"})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("GET state p99, %d readers", readers), Value: ms(pct(many, 99)), Unit: "ms",
		Baseline: "one reader alone, p50", BaseVal: ms(pct(one, 50)), Note: "goal < 50 ms at 10,000 agents"})
	polls, unchanged, err := stateReads(ctx, c, readers, 10, true)
	if err != nil {
		return err
	}
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("GET state p99, %d readers polling (If-None-Match)", readers), Value: ms(pct(polls, 99)), Unit: "ms",
		Baseline: fmt.Sprintf("GET state p99, %d readers", readers), BaseVal: ms(pct(many, 99)),
		Note: fmt.Sprintf("%d of %d answers 304 (the others: the state changed, e.g. a usage report)", unchanged, len(polls))})
	return nil
}

// stateReads has readers goroutines read the whole state each times from
// the masters in turn (gzip'ed, read to the last byte, not decompressed)
// and returns every latency; with poll, each reader sends back the ETag of
// the state it last read from that master (If-None-Match), and the count
// of 304 answers is returned too. Each reader is a client of its own, as the
// masters' consumers are separate processes: it opens its connection to
// every master with a first read (not counted: the TLS handshakes), and
// the counted reads start when every reader holds its connections, so that
// they measure reads, not other readers' handshakes.
func stateReads(ctx context.Context, c *labcluster.Cluster, readers, each int, poll bool) ([]time.Duration, int, error) {
	urls := c.MasterURLs()
	var mu sync.Mutex
	var out []time.Duration
	var unchanged atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	var warm sync.WaitGroup // every reader holds its connections
	warm.Add(readers)
	for r := range readers {
		transport := c.HTTPClient().Transport.(*http.Transport).Clone()
		transport.MaxIdleConnsPerHost = 1
		hc := &http.Client{Transport: transport, Timeout: time.Minute}
		wg.Go(func() {
			defer transport.CloseIdleConnections()
			etags := map[string]string{}
			read := func(url string) error {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/overlay-master/state", nil)
				if err != nil {
					return err
				}
				// Asked for explicitly, gzip is not decompressed by the
				// transport: the figure is the masters' latency, not the
				// readers' CPU (they share this machine's cores).
				req.Header.Set("Accept-Encoding", "gzip")
				if poll && etags[url] != "" {
					req.Header.Set("If-None-Match", etags[url])
				}
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					return err
				}
				switch {
				case resp.StatusCode == http.StatusNotModified && poll:
					unchanged.Add(1)
				case resp.StatusCode != http.StatusOK:
					return fmt.Errorf("GET %s: %s", req.URL, resp.Status)
				}
				etags[url] = resp.Header.Get("ETag")
				return nil
			}
			var werr error
			for _, url := range urls {
				if werr = read(url); werr != nil {
					break
				}
			}
			warm.Done()
			if werr != nil {
				errs <- werr
				return
			}
			warm.Wait()
			for k := range each {
				start := time.Now()
				if err := read(urls[(r+k)%len(urls)]); err != nil {
					errs <- err
					return
				}
				d := time.Since(start)
				mu.Lock()
				out = append(out, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, 0, err
	}
	return out, int(unchanged.Load()), nil
}
