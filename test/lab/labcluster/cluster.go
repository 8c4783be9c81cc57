// Package labcluster runs a whole carve cluster inside network namespaces:
// a netnslab lab, three `carve master` processes in host namespaces 1..3,
// and a `carve agent` in every host namespace, all real processes of a real
// carve binary. Containers are namespaces attached the way a CNI runtime
// attaches them: libcni, run inside the host namespace, with the conflist
// the host's agent wrote, the reference bridge plugin and carve-ipam (see
// AddCNIContainer). The end-to-end tests, `carve demo` (test/cmd/carve-lab) and the agent and CNI
// benchmarks share it.
//
// The harness itself lives in the root namespace, which has no route to the
// lab's underlay (198.18.0.0/15) and must never send anything towards it. Its
// HTTP connections to masters and agents are therefore opened from inside the
// lab's underlay namespace, where the underlay bridge carries ControlAddr.
//
// Everything is undone by Close: processes are stopped by their PID (SIGTERM,
// then SIGKILL), the namespaces removed, and the work directory deleted when
// the cluster created it. ForTest ties that to t.Cleanup and prints the tail
// of every process log when the test failed.
package labcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/dockerlab"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/proclab"
	"github.com/carve-net/carve/vxlan"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// Ports every process listens on, on its host's underlay IP (each host is a
// namespace of its own, so they never collide).
const (
	MasterHTTPPort = 8080
	MasterRaftPort = 8300
	AgentHTTPPort  = 9797
	AgentMeshPort  = 6783
)

// ControlAddr is the harness's own address, on the underlay bridge inside the
// lab's underlay namespace (hosts start at 198.18.0.11).
const ControlAddr = "198.18.0.2/15"

// DefaultPrefix starts the names of the namespaces of a cluster when
// Options.Prefix is empty.
const DefaultPrefix = "carvecluster"

// Options configure New.
type Options struct {
	// Binary is the carve binary that runs masters and agents (required).
	Binary string
	// LabBinary is the carve-lab binary, which StartRogue runs (needed
	// only by it).
	LabBinary string
	// Hosts is the number of host namespaces, each with an agent (default 3).
	Hosts int
	// Masters is the number of masters, in hosts 1..Masters (default 3, at
	// most Hosts).
	Masters int
	// Network is the masters' network configuration (default
	// netconfig.Default(): overlay "carve", 10.128.0.0/9, /24 per agent).
	Network *api.NetworkConfig
	// Dir holds data dirs, sockets, configs and logs. Empty: a new temporary
	// directory, removed by Close.
	Dir string
	// Prefix starts every namespace name (default DefaultPrefix), so that
	// netnslab.RemoveStale / RemoveStale can find the leftovers of a run that
	// was killed.
	Prefix string
	// LogLevel of masters and agents (default "info").
	LogLevel string
	// DockerBridge asks agents for the d-<overlay> bridge as well as
	// m-<overlay>.
	DockerBridge bool
	// AgentArgs are appended to every agent's command line.
	AgentArgs []string
	// MasterArgs are appended to every master's command line.
	MasterArgs []string
	// CNIVersion is the agents' --cni-version (default
	// netconf.LatestCNIVersion, which the lab's own runtime, libcni 1.3 with
	// the plugins of CNIPath, reads; "auto" has the agents detect it).
	CNIVersion string
	// CNIBinDirs is the agents' --cni-bin-dir, where the host's runtimes
	// find plugins (default CNIPath).
	CNIBinDirs []string
	// CNIPath lists the directories holding carve-ipam and the reference
	// CNI plugins (CNIPlugins), the CNI_PATH of every attachment; see
	// BuildCNIPlugins and FindCNIPlugins. Containers need it.
	CNIPath []string
	// Logger receives the harness's progress (default: discarded).
	Logger *slog.Logger
	// UnderlayMTU is the MTU of the underlay's veths and bridge (default
	// 1500; see netnslab.Options and netnslab.Lab.SetUnderlayMTU).
	UnderlayMTU int
}

// Cluster is a running lab cluster. Its methods are safe for concurrent use;
// Close may be called from a signal handler while others run.
type Cluster struct {
	// Lab holds the namespaces.
	Lab *netnslab.Lab
	// Dir is the work directory.
	Dir string

	opts       Options
	log        *slog.Logger
	network    api.NetworkConfig // with defaults filled in
	configPath string
	ownDir     bool
	http       *http.Client
	sec        *labSecurity

	mu         sync.Mutex
	closed     bool
	hosts      []*Host
	masters    []*Master
	containers []*Container        // attached ones
	seq        int                 // containers created, for names
	rogues     []*Process          // started by StartRogue
	engines    []*dockerlab.Engine // started by StartDocker
}

// New creates the lab (underlay and host namespaces), the work directory and
// the masters' configuration; nothing runs yet (see Start). On error,
// everything already created is removed.
func New(opts Options) (_ *Cluster, err error) {
	if opts.Binary == "" {
		return nil, errors.New("labcluster: Options.Binary (the carve binary) is required")
	}
	if opts.Hosts == 0 {
		opts.Hosts = 3
	}
	if opts.Masters == 0 {
		opts.Masters = min(3, opts.Hosts)
	}
	if opts.Masters < 1 || opts.Masters > opts.Hosts {
		return nil, fmt.Errorf("labcluster: %d masters on %d hosts: want 1..hosts", opts.Masters, opts.Hosts)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.CNIVersion == "" {
		opts.CNIVersion = netconf.LatestCNIVersion
	}
	if opts.CNIBinDirs == nil {
		opts.CNIBinDirs = opts.CNIPath
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "info"
	}
	netCfg := netconfig.Default()
	if opts.Network != nil {
		netCfg = *opts.Network
	}
	netCfg = netconfig.WithDefaults(netCfg)
	c := &Cluster{opts: opts, network: netCfg, log: opts.Logger}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if opts.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "carve-cluster-"); err != nil {
			return nil, fmt.Errorf("labcluster: %w", err)
		}
		c.ownDir = true
	} else {
		c.Dir = opts.Dir
	}
	for _, d := range []string{"logs", "masters", "hosts"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("labcluster: %w", err)
		}
	}
	c.configPath = filepath.Join(c.Dir, "network.json")
	data, err := json.MarshalIndent(netCfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("labcluster: encode network config: %w", err)
	}
	if err := os.WriteFile(c.configPath, append(data, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("labcluster: write network config: %w", err)
	}

	// Secure by default: a CA for this run, certificates for every
	// process and for the harness, a mesh password.
	if c.sec, err = newLabSecurity(filepath.Join(c.Dir, "pki")); err != nil {
		return nil, err
	}
	tlsCfg, err := c.sec.clientConfig()
	if err != nil {
		return nil, err
	}

	lab, err := netnslab.New(netnslab.Options{Hosts: opts.Hosts, Prefix: opts.Prefix, UnderlayMTU: opts.UnderlayMTU})
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	c.Lab = lab
	if err := addControlAddr(lab); err != nil {
		return nil, err
	}
	c.http = newHTTPClient(lab.Underlay, tlsCfg)
	// Every new connection with the operator's files as last loaded.
	c.http.Transport.(*http.Transport).DialTLSContext = c.sec.operator.DialTLS(tlsCfg, 10*time.Second, nsDialer(lab.Underlay))

	for _, nh := range lab.Hosts() {
		name := "h" + strconv.Itoa(nh.Index)
		dir := filepath.Join(c.Dir, "hosts", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("labcluster: %w", err)
		}
		h := &Host{NS: nh, Name: name, Index: nh.Index, Dir: dir, AgentDataDir: filepath.Join(dir, "agent"),
			c: c, ip: nh.IP, certName: "agent-" + name}
		if err := c.sec.issue(pki.RoleAgent, h.certName, nh.IP.Addr()); err != nil {
			return nil, err
		}
		h.Agent = proclab.New("agent-"+name, filepath.Join(c.Dir, "logs", "agent-"+name+".log"), nh.Namespace)
		c.hosts = append(c.hosts, h)
		if err := c.newCNIRuntime(h); err != nil {
			return nil, err
		}
	}
	for i := range opts.Masters {
		h := c.hosts[i]
		id := "m" + strconv.Itoa(i+1)
		ip := h.ip.Addr().String()
		m := &Master{ID: id, Host: h,
			HTTPAddr: ip + ":" + strconv.Itoa(MasterHTTPPort), RaftAddr: ip + ":" + strconv.Itoa(MasterRaftPort),
			DataDir: filepath.Join(c.Dir, "masters", id),
			Process: proclab.New(id, filepath.Join(c.Dir, "logs", id+".log"), h.NS.Namespace),
			scheme:  "https"}
		if err := c.sec.issue(pki.RoleMaster, id, h.ip.Addr()); err != nil {
			return nil, err
		}
		h.Master = m
		c.masters = append(c.masters, m)
	}
	c.log.Info("lab created", "hosts", opts.Hosts, "masters", opts.Masters, "prefix", lab.Prefix(), "dir", c.Dir)
	return c, nil
}

// addControlAddr puts ControlAddr on the underlay bridge, so that the
// harness can talk to the hosts from the underlay namespace.
func addControlAddr(lab *netnslab.Lab) error {
	nh, err := netlinksafe.NewHandleAt(lab.Underlay.NsHandle())
	if err != nil {
		return fmt.Errorf("labcluster: netlink in the underlay: %w", err)
	}
	defer nh.Close()
	br, err := nh.LinkByName(netnslab.UnderlayBridge)
	if err != nil {
		return fmt.Errorf("labcluster: underlay bridge: %w", err)
	}
	addr, err := netlink.ParseAddr(ControlAddr)
	if err != nil {
		return err
	}
	if err := nh.AddrAdd(br, addr); err != nil {
		return fmt.Errorf("labcluster: control address on the underlay bridge: %w", err)
	}
	return nil
}

// Hosts returns the hosts, in order.
func (c *Cluster) Hosts() []*Host {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Host(nil), c.hosts...)
}

// Host returns host i (from 1).
func (c *Cluster) Host(i int) *Host {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hosts[i-1]
}

// Masters returns the masters, in order.
func (c *Cluster) Masters() []*Master {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Master(nil), c.masters...)
}

// Network is the masters' network configuration, defaults filled in.
func (c *Cluster) Network() api.NetworkConfig { return c.network }

// OverlayMTU is the overlay MTU the agents program: overlay_mtu when the
// network configuration sets it, else what the lab's underlay leaves after
// VXLAN over IPv4 (the agents follow the smallest underlay MTU; see
// netnslab.Lab.SetUnderlayMTU for a host with another).
func (c *Cluster) OverlayMTU() int {
	if c.network.OverlayMTU > 0 {
		return c.network.OverlayMTU
	}
	if c.network.VTEPMTU > 0 {
		return c.network.VTEPMTU
	}
	return vxlan.VTEPMTUFor(c.Lab.UnderlayMTU(), netip.IPv4Unspecified(), 0)
}

// ConfigPath is the masters' --config file.
func (c *Cluster) ConfigPath() string { return c.configPath }

// HTTPClient returns the client whose connections start in the lab.
func (c *Cluster) HTTPClient() *http.Client { return c.http }

// Start starts the masters, waits for a leader, starts every agent and waits
// until the cluster has converged (WaitConverged).
func (c *Cluster) Start(ctx context.Context) error {
	if err := c.StartMasters(ctx); err != nil {
		return err
	}
	for _, h := range c.Hosts() {
		if err := c.StartAgent(h); err != nil {
			return err
		}
	}
	c.log.Info("agents started; waiting until every agent has programmed every other", "agents", len(c.Hosts()))
	return c.WaitConverged(ctx)
}

// Containers returns the containers that are attached (their ADD succeeded
// and no DEL did since), in the order they were attached.
func (c *Cluster) Containers() []*Container {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Container(nil), c.containers...)
}

// Kernel reads h's VTEP and carve's entries on it.
func (c *Cluster) Kernel(h *Host) (*KernelState, error) {
	return ReadKernel(h.NS.Namespace, c.network.VTEPName)
}

// PingAll runs the ping matrix over every container.
func (c *Cluster) PingAll(ctx context.Context) *PingMatrix {
	return Ping(ctx, c.Containers())
}

// processes lists every process of the cluster, masters first.
func (c *Cluster) processes() []*Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []*Process
	for _, m := range c.masters {
		ps = append(ps, m.Process)
	}
	for _, h := range c.hosts {
		ps = append(ps, h.Agent)
	}
	return append(ps, c.rogues...)
}

// DumpLogs writes the last n lines of every process log that exists, and of
// the CNI plugins' stderr on every host.
func (c *Cluster) DumpLogs(w io.Writer, n int) {
	for _, p := range c.processes() {
		if _, err := os.Stat(p.LogPath); err != nil {
			continue
		}
		fmt.Fprintf(w, "--- %s (pid %d, running %v): last %d lines of %s\n%s\n", p.Name, p.PID(), p.Running(), n, p.LogPath, p.Tail(n))
	}
	for _, h := range c.Hosts() {
		if h.cniLog == nil {
			continue
		}
		if fi, err := os.Stat(h.cniLog.Name()); err != nil || fi.Size() == 0 {
			continue
		}
		fmt.Fprintf(w, "--- CNI plugins on %s (their stderr): last %d lines of %s\n%s\n", h.Name, n, h.cniLog.Name(), proclab.TailFile(h.cniLog.Name(), n))
	}
}

// Close stops every process (SIGTERM, SIGKILL after a few seconds), removes
// the namespaces, and deletes the work directory if New created it. It is
// idempotent and safe to call concurrently with anything else.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	engines := c.engines
	c.mu.Unlock()
	var errs []error
	// The engines first: their containers and shims live in the hosts.
	for _, e := range engines {
		if err := e.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	// The agents (and rogues) before the masters: an agent whose master
	// stopped opens a connection to another, and a master in its HTTP
	// shutdown waits up to 5 s for a connection that has sent no request
	// yet, which outlasted the stop timeout below.
	var mu sync.Mutex
	stop := func(ps []*Process) {
		var wg sync.WaitGroup
		for _, p := range ps {
			wg.Go(func() {
				if err := p.Stop(context.Background(), 5*time.Second); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	var masters, rest []*Process
	for _, p := range c.processes() {
		if slices.ContainsFunc(c.Masters(), func(m *Master) bool { return m.Process == p }) {
			masters = append(masters, p)
		} else {
			rest = append(rest, p)
		}
	}
	stop(rest)
	stop(masters)
	if c.http != nil {
		c.http.CloseIdleConnections()
	}
	if c.Lab != nil {
		if err := c.Lab.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range c.Hosts() {
		if h.cniLog != nil {
			_ = h.cniLog.Close()
		}
	}
	if c.ownDir && c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("labcluster: close: %w", err)
	}
	return nil
}
