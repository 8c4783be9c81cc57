// Command agent benchmarks how fast a new agent reaches every other agent:
// the time from its registration (its record committed by the masters) until
// every other agent reports it `programmed: true` in /overlay-agent/peers
// (neighbour, FDB entry and route in its kernel), in clusters of 3 and 30
// agents run by labcluster (real `carve` processes, one network namespace per
// host, 3 masters among the hosts). Beside it, as the baseline, stands the
// masters' commit latency measured in the same cluster: the round trip of a
// registration sent straight to the leader. It needs root; everything
// happens inside namespaces it creates and removes (also on SIGINT/SIGTERM).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// prefix names the benchmark's namespaces.
const prefix = "carvebench"

func main() {
	sizes := flag.String("agents", "3,30", "cluster sizes (agents, the new one included), comma separated")
	reps := flag.Int("reps", 5, "new agents measured per cluster size (the median is reported)")
	binary := flag.String("carve", "", "carve binary (default: build ./cmd/carve of this module)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *sizes, *reps, *binary); err != nil {
		fmt.Fprintln(os.Stderr, "bench/agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, sizesFlag string, reps int, binary string) error {
	if !netnslab.IsRoot() {
		return errors.New("needs root to create network namespaces")
	}
	var sizes []int
	for _, s := range strings.Split(sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 || n > 200 {
			return fmt.Errorf("-agents %q: want sizes of 2-200", sizesFlag)
		}
		sizes = append(sizes, n)
	}
	br, err := labcluster.NewBenchRun(ctx, prefix, "agent", binary, "", false)
	if err != nil {
		return err
	}
	defer br.Close()
	binary = br.Binary
	tbl := benchtable.Table{Title: "agents: a new agent's registration until every other agent has programmed it (real processes, network namespaces)"}
	for _, n := range sizes {
		r, err := measure(ctx, binary, n, reps)
		if err != nil {
			return fmt.Errorf("%d agents: %w", n, err)
		}
		note := fmt.Sprintf("median of %d; /peers polled every %s", reps, r.poll)
		tbl.Add(benchtable.Row{Name: fmt.Sprintf("registered -> programmed by all %d others (%d agents)", n-1, n),
			Value: ms(r.programmed), Unit: "ms", Baseline: "Register round trip to the leader (commit)", BaseVal: ms(r.commit), Note: note})
		tbl.Add(benchtable.Row{Name: fmt.Sprintf("blocking state watch wakes up, leader (%d agents)", n),
			Value: ms(r.wakeLeader), Unit: "ms", Baseline: "Register round trip to the leader (commit)", BaseVal: ms(r.commit),
			Note: "since Register was sent"})
		tbl.Add(benchtable.Row{Name: fmt.Sprintf("blocking state watch wakes up, followers (%d agents)", n),
			Value: ms(r.wakeFollower), Unit: "ms", Baseline: "Register round trip to the leader (commit)", BaseVal: ms(r.commit),
			Note: "since Register was sent"})
		tbl.Add(benchtable.Row{Name: fmt.Sprintf("agent process start -> registered (%d agents)", n),
			Value: ms(r.startup), Unit: "ms", Baseline: "Register round trip to the leader (commit)", BaseVal: ms(r.commit),
			Note: "seen by a blocking watch on the leader"})
	}
	return tbl.Print(os.Stdout)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// result holds the medians of one cluster size.
type result struct {
	programmed, startup, commit time.Duration
	// wakeLeader, wakeFollower: a blocking state query's wake-up after a
	// registration was sent, on the leader and on followers.
	wakeLeader, wakeFollower time.Duration
	poll                     time.Duration
}

// measure runs a cluster of n hosts: agents on hosts 1..n-1, then reps new
// agents, one after the other, on host n.
func measure(ctx context.Context, binary string, n, reps int) (res result, err error) {
	fmt.Fprintf(os.Stderr, "== %d agents: starting the cluster\n", n)
	err = labcluster.With(ctx, labcluster.Options{Binary: binary, Hosts: n, Prefix: prefix, LogLevel: "warn"}, os.Stderr, func(c *labcluster.Cluster) error {
		var ferr error
		res, ferr = measureOn(ctx, c, n, reps)
		return ferr
	})
	return res, err
}

// measureOn is measure on the cluster c, created but not started.
func measureOn(ctx context.Context, c *labcluster.Cluster, n, reps int) (res result, err error) {
	if err := c.StartMasters(ctx); err != nil {
		return res, err
	}
	hosts := c.Hosts()
	observers, newHost := hosts[:n-1], hosts[n-1]
	for _, h := range observers {
		if err := c.StartAgent(h); err != nil {
			return res, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	err = c.WaitConverged(wctx)
	cancel()
	if err != nil {
		return res, err
	}
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		return res, err
	}
	lc, err := apiclient.NewClient([]string{leader.URL()}, c.HTTPClient())
	if err != nil {
		return res, err
	}
	// Polling costs the agents CPU: poll less often when there are many.
	res.poll = 10 * time.Millisecond
	if n > 10 {
		res.poll = 50 * time.Millisecond
	}

	// Baselines: registrations of agents that do not exist (an IP outside
	// the lab's hosts, no mesh address), straight to the leader, deleted
	// again: their round trip (the commit), and how long after it was sent a
	// blocking state query waiting on each master wakes up with it.
	var commits []time.Duration
	wakes := map[string][]time.Duration{}
	for i := range reps {
		id := fmt.Sprintf("baseline-%d-%d", n, i)
		st, err := lc.State(ctx, apiclient.StateOptions{})
		if err != nil {
			return res, err
		}
		woken := watchAll(ctx, c, st.Index)
		time.Sleep(100 * time.Millisecond) // let the queries block
		start := time.Now()
		_, err = lc.Register(ctx, api.RegisterRequest{AgentID: id, IP: netip.AddrFrom4([4]byte{198, 18, 2, byte(i + 1)}).String(),
			NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}})
		if err != nil {
			return res, fmt.Errorf("baseline register: %w", err)
		}
		done := time.Now()
		commits = append(commits, done.Sub(start))
		for m, at := range woken() {
			role := "follower"
			if m == leader {
				role = "leader"
			}
			wakes[role] = append(wakes[role], at.Sub(start))
		}
		if err := lc.DeleteAgent(ctx, id); err != nil {
			return res, fmt.Errorf("baseline delete: %w", err)
		}
		if err := waitGone(ctx, c, observers, id); err != nil {
			return res, err
		}
	}
	res.wakeLeader, res.wakeFollower = median(wakes["leader"]), median(wakes["follower"])

	var programmed, startup []time.Duration
	for i := range reps {
		id := fmt.Sprintf("new-%d-%d", n, i)
		p, s, err := newAgent(ctx, c, lc, observers, newHost, id, res.poll)
		if err != nil {
			return res, err
		}
		fmt.Fprintf(os.Stderr, "   %s: start -> registered %s, registered -> programmed by %d others %s\n",
			id, s.Round(time.Millisecond), len(observers), p.Round(time.Millisecond))
		programmed, startup = append(programmed, p), append(startup, s)
	}
	res.programmed, res.startup, res.commit = median(programmed), median(startup), median(commits)
	return res, nil
}

// newAgent starts an agent with a fresh data dir and the given id on host h,
// and measures (1) process start -> its record seen by a blocking watch on
// the leader, and (2) that -> every observer reports it programmed. Then it
// stops and deletes the agent again and waits until the observers dropped it.
func newAgent(ctx context.Context, c *labcluster.Cluster, lc *apiclient.Client, observers []*labcluster.Host, h *labcluster.Host,
	id string, poll time.Duration) (programmed, startup time.Duration, err error) {
	if err := c.ResetAgentData(h, id); err != nil {
		return 0, 0, err
	}
	st, err := lc.State(ctx, apiclient.StateOptions{})
	if err != nil {
		return 0, 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	registered := make(chan time.Time, 1)
	go func() {
		index := st.Index
		for wctx.Err() == nil {
			st, err := lc.State(wctx, apiclient.StateOptions{Index: index, Wait: 10 * time.Second})
			if err != nil {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if slices.ContainsFunc(st.Agents, func(a api.AgentInfo) bool { return a.AgentID == id }) {
				registered <- time.Now()
				return
			}
			index = st.Index
		}
	}()
	start := time.Now()
	if err := c.StartAgent(h); err != nil { // with the certificate of id
		return 0, 0, err
	}
	last, err := waitProgrammed(wctx, c, observers, id, poll)
	if err != nil {
		return 0, 0, err
	}
	var reg time.Time
	select {
	case reg = <-registered:
	case <-wctx.Done():
		return 0, 0, fmt.Errorf("the leader's watch never showed %s: %w", id, wctx.Err())
	}
	if err := c.StopAgent(ctx, h); err != nil {
		return 0, 0, err
	}
	if err := lc.DeleteAgent(ctx, id); err != nil {
		return 0, 0, err
	}
	if err := waitGone(ctx, c, observers, id); err != nil {
		return 0, 0, err
	}
	return last.Sub(reg), reg.Sub(start), nil
}

// watchAll starts a blocking state query past index on every master and
// returns a function that waits for them and tells when each woke up.
func watchAll(ctx context.Context, c *labcluster.Cluster, index uint64) func() map[*labcluster.Master]time.Time {
	var mu sync.Mutex
	out := map[*labcluster.Master]time.Time{}
	var wg sync.WaitGroup
	for _, m := range c.Masters() {
		cl, err := apiclient.NewClient([]string{m.URL()}, c.HTTPClient())
		if err != nil {
			continue
		}
		wg.Go(func() {
			if _, err := cl.State(ctx, apiclient.StateOptions{Index: index, Wait: 10 * time.Second}); err == nil {
				at := time.Now()
				mu.Lock()
				out[m] = at
				mu.Unlock()
			}
		})
	}
	return func() map[*labcluster.Master]time.Time {
		wg.Wait()
		return out
	}
}

// waitProgrammed polls every observer's /overlay-agent/peers until each
// reports id programmed, and returns when the last one did.
func waitProgrammed(ctx context.Context, c *labcluster.Cluster, observers []*labcluster.Host, id string, poll time.Duration) (time.Time, error) {
	times := make([]time.Time, len(observers))
	errs := make([]error, len(observers))
	var wg sync.WaitGroup
	for i, o := range observers {
		wg.Go(func() {
			cl := c.AgentClient(o)
			t := time.NewTicker(poll)
			defer t.Stop()
			for {
				p, err := cl.Peers(ctx)
				if err == nil && slices.ContainsFunc(p.Peers, func(p api.AgentPeer) bool { return p.AgentID == id && p.Programmed }) {
					times[i] = time.Now()
					return
				}
				select {
				case <-ctx.Done():
					errs[i] = fmt.Errorf("%s never programmed %s: %w", o.Name, id, ctx.Err())
					return
				case <-t.C:
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return time.Time{}, err
	}
	return slices.MaxFunc(times, func(a, b time.Time) int { return a.Compare(b) }), nil
}

// waitGone waits until no observer lists id among its peers any more.
func waitGone(ctx context.Context, c *labcluster.Cluster, observers []*labcluster.Host, id string) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return retry.Until(wctx, 50*time.Millisecond, func() error {
		for _, o := range observers {
			p, err := c.AgentClient(o).Peers(wctx)
			if err != nil {
				return err
			}
			if slices.ContainsFunc(p.Peers, func(p api.AgentPeer) bool { return p.AgentID == id }) {
				return fmt.Errorf("%s still lists %s", o.Name, id)
			}
		}
		return nil
	})
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
