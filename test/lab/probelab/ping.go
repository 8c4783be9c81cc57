// Package probelab watches a lab's dataplane from outside the system under
// test: ping matrices between endpoints on different hosts, pings kept up
// while something changes (the longest window each pair lost), and tcpdump
// captures of the underlay bridge. It knows nothing of carve: the endpoints
// are whatever the caller pings between (labcluster's containers).
package probelab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
)

// PingAttempts is how many echoes a ping of the matrix may send before it
// counts as failed: the first packets of a fresh path can be lost while the
// container's and the gateway's ARP resolve.
const PingAttempts = 3

// Endpoint is one end of a ping: a namespace echoes leave from, an address
// they reach it at, on a host of the lab.
type Endpoint interface {
	// Label names the endpoint in tables and errors.
	Label() string
	// PingFrom is the namespace the endpoint's echoes are sent from.
	PingFrom() *netnslab.Namespace
	// PingAddr is the address echoes to the endpoint go to.
	PingAddr() netip.Addr
	// SameHost reports whether other is on the endpoint's host: such pairs
	// are not pinged (the overlay, which the pings test, is never crossed).
	SameHost(other Endpoint) bool
}

// PingResult is one cell of a ping matrix.
type PingResult struct {
	// Skipped is true on the diagonal and between containers of one host
	// (the matrix tests the overlay, which those never cross).
	Skipped bool
	// Err is nil when a reply came back.
	Err error
	// RTT is the round trip of the echo that was answered.
	RTT time.Duration
	// Attempts is the number of echoes sent.
	Attempts int
}

// PingMatrix is the result of every endpoint (container) pinging every
// endpoint on the other hosts. Results[i][j] is Containers[i] pinging
// Containers[j].
type PingMatrix[E Endpoint] struct {
	Containers []E
	Results    [][]PingResult
}

// Ping runs the matrix over cs: every container pings every container on
// another host, up to PingAttempts echoes each, a few pairs at a time.
func Ping[E Endpoint](ctx context.Context, cs []E) *PingMatrix[E] {
	m := &PingMatrix[E]{Containers: cs, Results: make([][]PingResult, len(cs))}
	for i := range cs {
		m.Results[i] = make([]PingResult, len(cs))
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, src := range cs {
		for j, dst := range cs {
			if src.SameHost(dst) {
				m.Results[i][j].Skipped = true
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				m.Results[i][j] = pingOnce(ctx, src.PingFrom(), dst.PingAddr())
			}()
		}
	}
	wg.Wait()
	return m
}

// pingOnce pings to from inside from, up to PingAttempts echoes.
func pingOnce(ctx context.Context, from *netnslab.Namespace, to netip.Addr) PingResult {
	var r PingResult
	r.Attempts, r.RTT, r.Err = from.PingEchoes(ctx, to, PingAttempts)
	return r
}

// OK reports whether every pair that was pinged answered.
func (m *PingMatrix[E]) OK() bool { return m.Err() == nil }

// Err lists the failed pairs, or is nil.
func (m *PingMatrix[E]) Err() error {
	var errs []error
	for i, row := range m.Results {
		for j, r := range row {
			if !r.Skipped && r.Err != nil {
				errs = append(errs, fmt.Errorf("%s -> %s: %w", m.Containers[i].Label(), m.Containers[j].Label(), r.Err))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d pings failed: %w", len(errs), m.Pairs(), errors.Join(errs...))
}

// Pairs is the number of pairs pinged.
func (m *PingMatrix[E]) Pairs() int {
	n := 0
	for _, row := range m.Results {
		for _, r := range row {
			if !r.Skipped {
				n++
			}
		}
	}
	return n
}

// Print writes the matrix as a table: one row per source, one column per
// destination, "ok RTT" or "FAIL" in each cell, "." where nothing was pinged.
func (m *PingMatrix[E]) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	head := []string{"from \\ to"}
	for _, c := range m.Containers {
		head = append(head, c.Label())
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for i, row := range m.Results {
		cells := []string{m.Containers[i].Label()}
		for _, r := range row {
			switch {
			case r.Skipped:
				cells = append(cells, ".")
			case r.Err != nil:
				cells = append(cells, "FAIL")
			default:
				cells = append(cells, "ok "+fmtRTT(r.RTT))
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	failed := 0
	for _, row := range m.Results {
		for _, r := range row {
			if !r.Skipped && r.Err != nil {
				failed++
			}
		}
	}
	_, err := fmt.Fprintf(w, "%d pairs pinged across hosts, %d failed\n", m.Pairs(), failed)
	return err
}

// String is the printed table.
func (m *PingMatrix[E]) String() string {
	var b strings.Builder
	_ = m.Print(&b)
	return b.String()
}

func fmtRTT(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000)
}
