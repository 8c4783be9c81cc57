// Command master benchmarks the masters: registrations per second through a
// 3-master cluster on loopback beside the raw fsync rate of the same disk
// (the physical limit of an unbatched log), and the latency of reading the
// state at 10,000 agents beside encoding the same state naively. The
// cluster runs secure, as in production (TLS on the API and Raft, clients
// with an operator's certificate, every record signed), unless -insecure.
//
// The registration rows start their clock once a leader is elected and
// every client has connected to it; the 1,000-client rows' target is twice
// the disk's sequential fsync rate measured in the same run (group commit:
// docs/design.md). Each row's note gives the CPU a registration cost the
// process (masters and clients) and the cores it kept busy: the rate is
// their quotient when the CPU, not the disk, bounds it. The floor row sends
// the same clients' registrations to a server with no log or state (see
// floorRun): what any design of the masters pays per request on this
// machine, beside the same fsync rate. -only runs one row
// (e.g. -only "1000 clients, to the leader"), and -cpuprofile,
// -mutexprofile and -blockprofile profile its measured span: the three
// masters run in this process, so the profile is the cluster's (go tool
// pprof).
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
	"github.com/carve-net/carve/test/lab/benchtable"
)

// options are the bench's flags.
type options struct {
	stateAgents                            int
	secure                                 bool
	only                                   string
	cpuProfile, mutexProfile, blockProfile string
}

func main() {
	var opts options
	flag.IntVar(&opts.stateAgents, "state-agents", 10000, "agents in the state for the read benchmark")
	insecure := flag.Bool("insecure", false, "run the masters without TLS and signatures (--insecure)")
	flag.StringVar(&opts.only, "only", "", "run only the registration row whose name contains this (e.g. \"1000 clients, to the leader\") and skip the state read")
	flag.StringVar(&opts.cpuProfile, "cpuprofile", "", "write a CPU profile of the registration rows (every master runs in this process) to this file")
	flag.StringVar(&opts.mutexProfile, "mutexprofile", "", "write a mutex contention profile of the registration rows to this file")
	flag.StringVar(&opts.blockProfile, "blockprofile", "", "write a blocking profile of the registration rows to this file")
	flag.Parse()
	opts.secure = !*insecure
	if err := run(opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench/master:", err)
		os.Exit(1)
	}
}

func run(opts options) error {
	dir, err := os.MkdirTemp("", "carve-bench-master-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var sec *security
	if opts.secure {
		if sec, err = newSecurity(filepath.Join(dir, "pki")); err != nil {
			return err
		}
	}

	fsyncs, err := fsyncRate(dir, 2*time.Second)
	if err != nil {
		return err
	}
	mode := "TLS, signed records"
	if sec == nil {
		mode = "--insecure"
	}
	tbl := benchtable.Table{Title: "masters: registrations through a 3-master cluster on loopback (real fsync, " + mode + ")"}
	prof, err := newProfiler(opts)
	if err != nil {
		return err
	}
	var sample registrationRun // a 1,000-client row's, for the floor
	for _, c := range []struct {
		clients, total int
		spread         bool
	}{
		{1, 300, false}, {64, 4000, false}, {1000, 12000, false}, {1000, 12000, true},
	} {
		name := fmt.Sprintf("register, %d clients, to the leader", c.clients)
		if c.spread {
			name = fmt.Sprintf("register, %d clients, spread over 3 masters", c.clients)
		}
		if !strings.Contains(name, opts.only) {
			continue
		}
		res, err := registrationRate(dir, sec, c.clients, c.total, c.spread, prof)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		var notes []string
		if c.clients == 1000 {
			notes = append(notes, "target >= 2x fsync/s (group commit)")
			if res.answer != nil {
				sample = res
			}
		}
		notes = append(notes, cpuNote(res, c.total, "registration"))
		if res.retries > 0 {
			notes = append(notes, fmt.Sprintf("%d answers retried (a leader changed: the machine is loaded)", res.retries))
		}
		note := strings.Join(notes, "; ")
		tbl.Add(benchtable.Row{Name: name, Value: float64(c.total) / res.elapsed.Seconds(), Unit: "ops/s", Baseline: "fsync/s of the same disk",
			BaseVal: fsyncs, HigherIsBetter: true, Note: note})
	}
	if err := prof.write(); err != nil {
		return err
	}
	if sample.answer != nil {
		const clients, total = 1000, 12000
		res, err := floorRun(sec, clients, total, *sample.answer, sample.clusterID)
		if err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		// The budget a registration has for the 2x target, at the cores
		// this row kept busy.
		budget := res.cpu.Seconds() / res.elapsed.Seconds() / (2 * fsyncs) * 1e6
		tbl.Add(benchtable.Row{Name: "floor: 1000 clients to a server with no log or state (one signed record each)", Value: float64(total) / res.elapsed.Seconds(),
			Unit: "ops/s", Baseline: "fsync/s of the same disk", BaseVal: fsyncs, HigherIsBetter: true,
			Note: cpuNote(res, total, "request") + fmt.Sprintf("; what the masters pay before Raft and the state machine, with the clients on the same cores; 2x fsync/s leaves %.0f µs a registration", budget)})
	}
	if err := tbl.Print(os.Stdout); err != nil {
		return err
	}
	if opts.only != "" {
		return nil
	}

	st := benchtable.Table{Title: fmt.Sprintf("masters: GET /overlay-master/state at %d agents (%s)", opts.stateAgents, mode)}
	get, marshal, size, err := stateLatency(dir, sec, opts.stateAgents)
	if err != nil {
		return err
	}
	st.Add(benchtable.Row{Name: "GET state (HTTP, cached encoding)", Value: get, Unit: "ms", Baseline: "json.Marshal of the same api.State",
		BaseVal: marshal, Note: fmt.Sprintf("%d KiB answer", size/1024)})
	return st.Print(os.Stdout)
}

// cpuNote is the CPU a request cost the process (masters, or the floor's
// server, and clients) and the cores it kept busy: when the cores are
// full, the CPU bounds the rate, not the disk.
func cpuNote(res registrationRun, total int, what string) string {
	return fmt.Sprintf("%.0f µs CPU/%s, %.2f of %d cores busy",
		float64(res.cpu.Microseconds())/float64(total), what, res.cpu.Seconds()/res.elapsed.Seconds(), runtime.NumCPU())
}

// fsyncRate measures write+fdatasync of 4 KiB, the cost of one unbatched log append.
func fsyncRate(dir string, d time.Duration) (float64, error) {
	f, err := os.Create(filepath.Join(dir, "fsync-probe"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		if _, err := f.WriteAt(buf, int64(n%256)*4096); err != nil {
			return 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, err
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// security is the benchmark's cluster CA: the masters' certificates and
// signing key, and an operator's client configuration.
type security struct {
	dir        string
	signingKey ed25519.PrivateKey
	client     *tls.Config
}

func newSecurity(dir string) (*security, error) {
	if err := pki.CreateCA(dir, 24*time.Hour); err != nil {
		return nil, err
	}
	loopback := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	for i := range 3 {
		if err := pki.Issue(dir, pki.IssueRequest{Role: pki.RoleMaster, Name: fmt.Sprintf("m%d", i+1), IPs: loopback}); err != nil {
			return nil, err
		}
	}
	if err := pki.Issue(dir, pki.IssueRequest{Role: pki.RoleOperator, Name: "bench"}); err != nil {
		return nil, err
	}
	key, err := pki.LoadSigningKey(filepath.Join(dir, pki.SignKey))
	if err != nil {
		return nil, err
	}
	client, err := pki.Files{CA: filepath.Join(dir, pki.CAFile), Cert: pki.CertFile(dir, "bench"), Key: pki.KeyFile(dir, "bench")}.ClientConfig()
	if err != nil {
		return nil, err
	}
	return &security{dir: dir, signingKey: key, client: client}, nil
}

// secure sets a master's TLS and signing options (nil: --insecure).
func (s *security) secure(opts *master.Options) {
	if s == nil {
		opts.Insecure = true
		return
	}
	opts.TLS = pki.Files{CA: filepath.Join(s.dir, pki.CAFile), Cert: pki.CertFile(s.dir, opts.ID), Key: pki.KeyFile(s.dir, opts.ID)}
	opts.SigningKey = s.signingKey
}

// clientTLS is the operator's TLS configuration (nil: plain HTTP).
func (s *security) clientTLS() *tls.Config {
	if s == nil {
		return nil
	}
	return s.client
}

type cluster struct {
	masters []*master.Master
	urls    []string
}

func startCluster(dir string, sec *security) (*cluster, error) {
	var lns []net.Listener
	var peers []raftlog.Server
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		peers = append(peers, raftlog.Server{ID: fmt.Sprintf("m%d", i+1), Address: ln.Addr().String(), Voter: true})
	}
	c := &cluster{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range 3 {
		ln := lns[i]
		opts := master.Options{
			ID: peers[i].ID, DataDir: filepath.Join(dir, peers[i].ID), HTTPAddr: "127.0.0.1:0",
			RaftAddr: peers[i].Address, Peers: peers, Network: netconfig.Default(), Logger: quiet,
			TuneRaft: func(rc *raftlog.Config) { rc.Listener = ln },
		}
		sec.secure(&opts)
		m, err := master.Start(context.Background(), opts)
		if err != nil {
			c.close()
			return nil, err
		}
		c.masters = append(c.masters, m)
		c.urls = append(c.urls, m.URL())
	}
	return c, c.waitReady()
}

// waitReady waits until a master leads with the cluster id and the
// configuration committed and every master has caught up (serves the state).
func (c *cluster) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return retry.Until(ctx, 50*time.Millisecond, func() error {
		leaders := 0
		for _, m := range c.masters {
			if m.Node().IsLeader() {
				leaders++
			}
			if _, ok := m.Table().Network(); !ok || m.Table().ClusterID() == "" || !m.Node().IsCaughtUp() {
				return fmt.Errorf("%s is not ready", m.Node().ID())
			}
		}
		if leaders == 0 {
			return errors.New("no leader")
		}
		return nil
	})
}

func (c *cluster) leaderURL() string {
	for i, m := range c.masters {
		if m.Node().IsLeader() {
			return c.urls[i]
		}
	}
	return c.urls[0]
}

func (c *cluster) close() {
	for _, m := range c.masters {
		_ = m.Close()
	}
}

// retryFor bounds the retries of one registration.
const retryFor = 30 * time.Second

// registrationRun is what one registration row measured: its span, the
// CPU the process used in it, and the answers retried.
type registrationRun struct {
	elapsed, cpu time.Duration
	retries      int64
	// answer is one record the leader answered, and clusterID its
	// cluster: what the floor row answers with (floorRun).
	answer    *api.AgentInfo
	clusterID string
}

// registrationRate registers total new agents with the given concurrency.
// The clock starts once a leader is elected and every client has connected
// to it (a TLS handshake is paid once per agent, as an agent keeps its
// connection), and only if the leader is still the same then.
func registrationRate(dir string, sec *security, clients, total int, spread bool, prof *profiler) (_ registrationRun, err error) {
	cdir, err := os.MkdirTemp(dir, "reg-")
	if err != nil {
		return registrationRun{}, err
	}
	c, err := startCluster(cdir, sec)
	if err != nil {
		return registrationRun{}, err
	}
	defer c.close()
	// Each client has its own transport, as each agent does: one shared
	// by 1,000 goroutines makes them queue on its pool's lock.
	var transports []*http.Transport
	defer func() {
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
	}()
	newHTTPClient := func() *http.Client {
		tr := &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute, TLSClientConfig: sec.clientTLS()}
		transports = append(transports, tr)
		return &http.Client{Transport: tr, Timeout: time.Minute}
	}
	ctx := context.Background()
	var cls []*apiclient.Client
	for attempt := 1; ; attempt++ {
		leader := c.leaderURL()
		cls, err = connectClients(ctx, c, newHTTPClient, leader, clients, spread)
		if err == nil && c.waitReady() == nil && c.leaderURL() == leader {
			break
		}
		if attempt == 3 {
			return registrationRun{}, fmt.Errorf("no stable leader while the clients connected (3 tries): %v", err)
		}
		if err := c.waitReady(); err != nil {
			return registrationRun{}, err
		}
	}
	var retried atomic.Int64
	var answer atomic.Pointer[api.AgentInfo]
	if err := prof.start(); err != nil {
		return registrationRun{}, err
	}
	elapsed, used, err := drive(cls, total, func(cl *apiclient.Client, req api.RegisterRequest) error {
		// An agent retries what the masters could not do now (a leader
		// changed under a loaded machine): so does the bench, with the
		// same request id, and counts it.
		rctx, cancel := context.WithTimeout(ctx, retryFor)
		defer cancel()
		return retry.Until(rctx, 100*time.Millisecond, func() error {
			got, err := cl.Register(rctx, req)
			if err == nil {
				answer.CompareAndSwap(nil, got)
			}
			if err != nil && api.IsRetryable(err) {
				retried.Add(1)
				return err
			}
			return retry.Permanent(err)
		})
	})
	prof.stop()
	if err != nil {
		return registrationRun{}, err
	}
	return registrationRun{elapsed: elapsed, cpu: used, retries: retried.Load(), answer: answer.Load(), clusterID: c.masters[0].Table().ClusterID()}, nil
}

// drive sends total registrations (registration(0) on) through the
// clients, each client one at a time, with register, and returns the span
// and the CPU the process used in it; an error when any failed.
func drive(cls []*apiclient.Client, total int, register func(*apiclient.Client, api.RegisterRequest) error) (elapsed, used time.Duration, err error) {
	var next, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start, cpu := time.Now(), startCPUClock()
	for _, cl := range cls {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				if err := register(cl, registration(i)); err != nil && failed.Add(1) == 1 {
					firstErr.Store(err)
				}
			}
		})
	}
	wg.Wait()
	elapsed, used = time.Since(start), cpu.since()
	if n := failed.Load(); n > 0 {
		return 0, 0, fmt.Errorf("%d of %d registrations failed; the first: %v", n, total, firstErr.Load())
	}
	return elapsed, used, nil
}

// registration is the bench's i-th registration: a new agent, with both
// bridges.
func registration(i int64) api.RegisterRequest {
	return api.RegisterRequest{AgentID: fmt.Sprintf("agent-%06d", i), IP: fmt.Sprintf("198.18.%d.%d", i/250, i%250+1),
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}, RequestID: api.NewRequestID()}
}

// connectClients makes the benchmark's clients, to the leader (or spread
// over the masters), and opens every client's connection, and the
// followers' to the leader, with a consistent read (retried while a leader
// is elected).
func connectClients(ctx context.Context, c *cluster, newHTTPClient func() *http.Client, leader string, clients int, spread bool) ([]*apiclient.Client, error) {
	var cls []*apiclient.Client
	for w := range clients {
		urls := []string{leader}
		if spread {
			urls = []string{c.urls[w%3], c.urls[(w+1)%3], c.urls[(w+2)%3]}
		}
		cl, err := apiclient.NewClient(urls, newHTTPClient()) // it speaks TLS when the cluster does
		if err != nil {
			return nil, err
		}
		cls = append(cls, cl)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var warm sync.WaitGroup
	warmErrs := make(chan error, len(cls))
	for _, cl := range cls {
		warm.Go(func() {
			err := retry.Until(ctx, 100*time.Millisecond, func() error {
				_, err := cl.State(ctx, apiclient.StateOptions{Consistent: true})
				return err
			})
			if err != nil {
				warmErrs <- err
			}
		})
	}
	warm.Wait()
	close(warmErrs)
	if err := <-warmErrs; err != nil {
		return nil, fmt.Errorf("open the clients' connections: %w", err)
	}
	return cls, nil
}

// stateLatency fills a cluster with n agents and times state reads.
func stateLatency(dir string, sec *security, n int) (getMS, marshalMS float64, size int, err error) {
	cdir, err := os.MkdirTemp(dir, "state-")
	if err != nil {
		return 0, 0, 0, err
	}
	c, err := startCluster(cdir, sec)
	if err != nil {
		return 0, 0, 0, err
	}
	defer c.close()
	transport := &http.Transport{MaxIdleConnsPerHost: 256, TLSClientConfig: sec.clientTLS()}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport, Timeout: time.Minute}
	cl, err := apiclient.NewClient([]string{c.leaderURL()}, hc)
	if err != nil {
		return 0, 0, 0, err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				_, _ = cl.Register(context.Background(), api.RegisterRequest{AgentID: fmt.Sprintf("agent-%06d", i),
					IP: fmt.Sprintf("198.18.%d.%d", i/250, i%250+1), NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}})
			}
		}()
	}
	wg.Wait()
	url := c.urls[0] + "/overlay-master/state"
	// The first read encodes (and signs) every record; the row measures
	// the reads after it, from the cached encodings.
	warm, err := hc.Get(url)
	if err != nil {
		return 0, 0, 0, err
	}
	_, _ = io.Copy(io.Discard, warm.Body)
	warm.Body.Close()
	const reads = 30
	var body []byte
	start := time.Now()
	for range reads {
		resp, err := hc.Get(url)
		if err != nil {
			return 0, 0, 0, err
		}
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, 0, 0, err
		}
	}
	getMS = time.Since(start).Seconds() * 1000 / reads
	var st api.State
	if err := json.Unmarshal(body, &st); err != nil || len(st.Agents) != n {
		return 0, 0, 0, fmt.Errorf("state has %d agents, want %d (%v)", len(st.Agents), n, err)
	}
	full := c.masters[0].Table().State()
	start = time.Now()
	for range reads {
		if _, err := json.Marshal(full); err != nil {
			return 0, 0, 0, err
		}
	}
	marshalMS = time.Since(start).Seconds() * 1000 / reads
	return getMS, marshalMS, len(body), nil
}
