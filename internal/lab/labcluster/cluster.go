// Package labcluster runs a whole carve cluster inside network namespaces:
// a netnslab lab, three `carve master` processes in host namespaces 1..3,
// and a `carve agent` in every host namespace, all real processes of a real
// carve binary. Containers are namespaces attached the way a CNI runtime
// attaches them: libcni, run inside the host namespace, with the conflist
// the host's agent wrote, the reference bridge plugin and carve-ipam (see
// AddCNIContainer). The end-to-end tests, `carve demo` (cmd/carve-lab) and the agent and CNI
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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/internal/lab/dockerlab"
	"github.com/carve-net/carve/internal/lab/netnslab"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
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
	// state.DefaultConfig(): overlay "carve", 10.128.0.0/9, /24 per agent).
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

// Host is one host namespace with its agent and, for hosts 1..Masters, a
// master.
type Host struct {
	// NS is the lab host. NS.IP is the address it was created with; IP()
	// is the current one (see Cluster.SetUnderlayIP).
	NS *netnslab.Host
	// Name is a short name for tables and logs ("h1").
	Name string
	// Index is the host's number, from 1.
	Index int
	// Master runs on this host, or is nil.
	Master *Master
	// Agent is the host's agent process (it may be stopped).
	Agent *Process
	// Dir holds the host's files; AgentDataDir is the agent's --data-dir.
	Dir          string
	AgentDataDir string

	c *Cluster
	// cni is the host's CNI runtime: libcni with the host's own result
	// cache, so that a GC on one host never DELs another host's attachments.
	cni    *libcni.CNIConfig
	cniLog *os.File // the plugins' stderr
	// guarded by c.mu
	ip      netip.Prefix
	agentID string
	// certName is the agent id of the agent's certificate, the id it runs
	// with (see ResetAgentData).
	certName string
}

// Master is one master process and its addresses.
type Master struct {
	*Process
	// ID is its Raft server id ("m1").
	ID string
	// Host is the host namespace it runs in.
	Host *Host
	// HTTPAddr and RaftAddr are its listeners, on its host's underlay IP.
	HTTPAddr, RaftAddr string
	// DataDir is its --data-dir (Raft log and snapshots); it survives
	// restarts.
	DataDir string

	scheme string // http, or https when the masters serve TLS
}

// URL is the master's HTTP base URL.
func (m *Master) URL() string { return m.scheme + "://" + m.HTTPAddr }

// Container is a container namespace on a host, attached to an overlay's
// m-<overlay> bridge through CNI (see AddCNIContainer). Addr, Gateway, Result
// and NS.HostLink are set by a successful ADD; do not read them while a
// CNIAdd of the same container runs.
type Container struct {
	// NS is the lab container: its namespace, its host, and once attached
	// the host end of its veth and its addresses.
	NS *netnslab.Container
	// Host is the host it is attached to.
	Host *Host
	// Overlay is the overlay (the CNI network) it is attached to.
	Overlay string
	// ContainerID and IfName identify the CNI attachment (CNI_CONTAINERID,
	// CNI_IFNAME), the key of the agent's IPAM.
	ContainerID, IfName string
	// Addr is its address in the host's mesos sub-subnet, from the ADD
	// result; invalid until an ADD succeeded.
	Addr netip.Prefix
	// Gateway is the bridge's address, the container's default route.
	Gateway netip.Addr
	// Result is the last successful ADD's result.
	Result *types100.Result
	// Name is a short name ("h1c1").
	Name string
}

// Label names the container with its address, for tables.
func (c *Container) Label() string { return c.Name + " " + c.Addr.Addr().String() }

// String is the label.
func (c *Container) String() string { return c.Label() }

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
	netCfg := state.DefaultConfig()
	if opts.Network != nil {
		netCfg = *opts.Network
	}
	netCfg = state.WithDefaults(netCfg)
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

	lab, err := netnslab.New(netnslab.Options{Hosts: opts.Hosts, Prefix: opts.Prefix})
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	c.Lab = lab
	if err := addControlAddr(lab); err != nil {
		return nil, err
	}
	c.http = newHTTPClient(lab.Underlay, tlsCfg)

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
		h.Agent = newProcess("agent-"+name, filepath.Join(c.Dir, "logs", "agent-"+name+".log"), nh.Namespace)
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
			Process: newProcess(id, filepath.Join(c.Dir, "logs", id+".log"), h.NS.Namespace),
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

// ConfigPath is the masters' --config file.
func (c *Cluster) ConfigPath() string { return c.configPath }

// HTTPClient returns the client whose connections start in the lab.
func (c *Cluster) HTTPClient() *http.Client { return c.http }

// IP is the host's current underlay address with its prefix.
func (h *Host) IP() netip.Prefix {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.ip
}

// AgentID is the id the host's agent reported last ("" before it answered).
// It is the name of the agent certificate the harness issued for the host
// (see ResetAgentData), unless the agent runs with another.
func (h *Host) AgentID() string {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.agentID
}

// AgentURL is the agent's HTTP base URL on the host's current IP: agents
// serve TLS with their certificate.
func (h *Host) AgentURL() string {
	return "https://" + hostPort(h.IP().Addr(), AgentHTTPPort)
}

// CertName is the agent id named by the certificate the host's agent
// starts with.
func (h *Host) CertName() string {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.certName
}

func hostPort(a netip.Addr, port int) string {
	return netip.AddrPortFrom(a, uint16(port)).String()
}

// MasterURLs are the masters' HTTP base URLs.
func (c *Cluster) MasterURLs() []string {
	var out []string
	for _, m := range c.Masters() {
		out = append(out, m.URL())
	}
	return out
}

// Client returns a master client (failover across all masters) whose
// connections start in the lab.
func (c *Cluster) Client() *api.Client {
	cl, err := api.NewClient(c.MasterURLs(), c.http)
	if err != nil {
		panic(fmt.Sprintf("labcluster: master URLs: %v", err)) // the cluster always has masters
	}
	return cl
}

// AgentClient returns a client of h's agent, on h's current IP.
func (c *Cluster) AgentClient(h *Host) *api.AgentClient {
	return api.NewAgentClient(h.AgentURL(), c.http)
}

// peersFlag is the --peers value shared by every master.
func (c *Cluster) peersFlag() string {
	var parts []string
	for _, m := range c.Masters() {
		parts = append(parts, m.ID+"="+m.RaftAddr)
	}
	return strings.Join(parts, ",")
}

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

// StartMasters starts every master and waits for a leader.
func (c *Cluster) StartMasters(ctx context.Context) error {
	for _, m := range c.Masters() {
		if err := c.StartMaster(m); err != nil {
			return err
		}
	}
	m, err := c.WaitLeader(ctx)
	if err != nil {
		return err
	}
	c.log.Info("masters up", "leader", m.ID)
	return nil
}

// StartMaster starts (or restarts, from its data dir) one master.
func (c *Cluster) StartMaster(m *Master) error {
	args := []string{"master", "--id", m.ID, "--data-dir", m.DataDir,
		"--http-addr", m.HTTPAddr, "--raft-addr", m.RaftAddr, "--peers", c.peersFlag(),
		"--config", c.configPath, "--log-level", c.opts.LogLevel}
	args = append(args, c.sec.masterArgs(m.ID)...)
	if err := m.start(c.opts.Binary, args); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	c.log.Info("master started", "id", m.ID, "host", m.Host.Name, "http", m.HTTPAddr, "pid", m.PID())
	return nil
}

// WaitLeader waits until a running master is leader and the network
// configuration is committed, and returns it.
func (c *Cluster) WaitLeader(ctx context.Context) (*Master, error) {
	var leader *Master
	err := retry.Until(ctx, 200*time.Millisecond, func() error {
		running := 0
		var errs []error
		for _, m := range c.Masters() {
			if !m.Running() {
				continue
			}
			running++
			cl, err := api.NewClient([]string{m.URL()}, c.http)
			if err != nil {
				return err
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			cs, err := cl.ClusterStatus(cctx)
			if err == nil && cs.Role == "leader" && cs.Leader != nil && cs.Leader.HTTPAddr != "" {
				var st *api.State
				st, err = cl.State(cctx, api.StateOptions{})
				if err == nil && st.Index > 0 {
					cancel()
					leader = m
					return nil
				}
			}
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", m.ID, err))
			}
		}
		if running == 0 {
			return retry.Permanent(errors.New("no master is running"))
		}
		return errors.Join(append([]error{errors.New("no leader yet")}, errs...)...)
	})
	if err != nil {
		return nil, fmt.Errorf("labcluster: wait for a leader: %w", err)
	}
	return leader, nil
}

// StopMaster stops a master with SIGTERM (SIGKILL after StopTimeout).
func (c *Cluster) StopMaster(ctx context.Context, m *Master) error {
	c.log.Info("stopping master", "id", m.ID, "pid", m.PID())
	return m.Stop(ctx, 0)
}

// KillMaster kills a master with SIGKILL.
func (c *Cluster) KillMaster(m *Master) error {
	c.log.Info("killing master", "id", m.ID, "pid", m.PID())
	return m.Kill()
}

// agentArgs is h's agent command line on its current IP with its
// certificate and the mesh password, then the cluster's AgentArgs, then
// extra (later flags win).
func (c *Cluster) agentArgs(h *Host, extra []string) []string {
	ip := h.IP().Addr()
	args := []string{"agent",
		"--data-dir", h.AgentDataDir,
		"--masters", strings.Join(c.MasterURLs(), ","),
		"--ip", ip.String(),
		"--http-addr", hostPort(ip, AgentHTTPPort),
		"--mesh-addr", hostPort(ip, AgentMeshPort),
		"--socket", h.SocketPath(),
		"--cni-conf-dir", h.CNIConfDir(),
		"--mesos-cni-conf-dir", h.MesosCNIConfDir(),
		"--cni-version", c.opts.CNIVersion,
		"--cni-bin-dir", strings.Join(c.opts.CNIBinDirs, ":"),
		// The lab's runtime cache, never the machine's /var/lib/cni.
		"--cni-cache-dir", h.CNICacheDir(),
		// Nothing of Docker's on the machine: the plugin's socket in the
		// lab, and the lab's own engine, which runs only after StartDocker.
		"--docker-plugin-socket", filepath.Join(h.DockerPluginDir(), DockerDriver+".sock"),
		"--docker-host", "unix://" + filepath.Join(h.DockerDir(), "docker.sock"),
		"--mesos-bridge=true",
		"--docker-bridge=" + strconv.FormatBool(c.opts.DockerBridge),
		"--log-level", c.opts.LogLevel,
	}
	args = append(args, c.sec.agentArgs(h.CertName())...)
	args = append(args, c.opts.AgentArgs...)
	return append(args, extra...)
}

// StartAgent starts h's agent on the host's current IP, with extra flags
// appended (they override the harness's). It does not wait: see WaitAgent
// and WaitConverged.
func (c *Cluster) StartAgent(h *Host, extra ...string) error {
	if err := os.MkdirAll(h.AgentDataDir, 0o755); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	if err := h.Agent.start(c.opts.Binary, c.agentArgs(h, extra)); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	c.log.Info("agent started", "host", h.Name, "ip", h.IP().Addr(), "pid", h.Agent.PID())
	return nil
}

// StopAgent stops h's agent with SIGTERM (SIGKILL after StopTimeout). The
// agent leaves its kernel state in place.
func (c *Cluster) StopAgent(ctx context.Context, h *Host) error {
	c.log.Info("stopping agent", "host", h.Name, "pid", h.Agent.PID())
	return h.Agent.Stop(ctx, 0)
}

// KillAgent kills h's agent with SIGKILL.
func (c *Cluster) KillAgent(h *Host) error {
	c.log.Info("killing agent", "host", h.Name, "pid", h.Agent.PID())
	return h.Agent.Kill()
}

// ResetAgentData deletes h's agent data dir (the agent must be stopped), so
// that the next start is a new agent with the new id newID: the harness
// issues it an agent certificate of that name.
func (c *Cluster) ResetAgentData(h *Host, newID string) error {
	if h.Agent.Running() {
		return fmt.Errorf("labcluster: agent on %s is running", h.Name)
	}
	if newID == h.CertName() {
		return fmt.Errorf("labcluster: agent on %s already is %s: a new agent needs a new id", h.Name, newID)
	}
	if err := c.sec.issue(pki.RoleAgent, newID, h.IP().Addr()); err != nil {
		return err
	}
	c.mu.Lock()
	h.agentID, h.certName = "", newID
	c.mu.Unlock()
	if err := os.RemoveAll(h.AgentDataDir); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	return nil
}

// agentReady reads h's agent and returns its record when every enabled
// overlay is STATUS_OK; it remembers the agent's id.
func (c *Cluster) agentReady(ctx context.Context, h *Host) (*api.AgentInfo, error) {
	if !h.Agent.Running() {
		return nil, retry.Permanent(fmt.Errorf("agent on %s is not running (%v); log:\n%s", h.Name, h.Agent.ExitErr(), h.Agent.Tail(20)))
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.AgentClient(h).Overlay(cctx)
	if err != nil {
		return nil, fmt.Errorf("agent on %s: %w", h.Name, err)
	}
	if info.AgentID != "" {
		c.mu.Lock()
		h.agentID = info.AgentID
		c.mu.Unlock()
	}
	if len(info.Overlays) == 0 {
		return info, fmt.Errorf("agent on %s (%s): no overlays yet", h.Name, info.AgentID)
	}
	var probs []string
	for _, ov := range info.Overlays {
		switch ov.State.Status {
		case api.StatusOK:
		default:
			probs = append(probs, fmt.Sprintf("%s %s %s", ov.Info.Name, ov.State.Status, ov.State.Error))
		}
	}
	if len(probs) > 0 {
		return info, fmt.Errorf("agent on %s (%s): %s", h.Name, info.AgentID, strings.Join(probs, "; "))
	}
	return info, nil
}

// WaitAgent waits until h's agent answers with every enabled overlay
// STATUS_OK, and returns its record.
func (c *Cluster) WaitAgent(ctx context.Context, h *Host) (*api.AgentInfo, error) {
	var info *api.AgentInfo
	err := retry.Until(ctx, 100*time.Millisecond, func() error {
		var err error
		info, err = c.agentReady(ctx, h)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("labcluster: wait for agent on %s: %w", h.Name, err)
	}
	return info, nil
}

// Converged returns nil when every running agent reports every enabled
// overlay STATUS_OK and `programmed: true` for every other running agent,
// and otherwise an error listing what is missing.
func (c *Cluster) Converged(ctx context.Context) error {
	var running []*Host
	for _, h := range c.Hosts() {
		if h.Agent.Running() {
			running = append(running, h)
		}
	}
	var errs []error
	ids := map[*Host]string{}
	for _, h := range running {
		info, err := c.agentReady(ctx, h)
		if info != nil && info.AgentID != "" {
			ids[h] = info.AgentID
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range running {
		if ids[h] == "" {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		peers, err := c.AgentClient(h).Peers(cctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("peers of %s: %w", h.Name, err))
			continue
		}
		programmed := map[string]bool{}
		for _, p := range peers.Peers {
			programmed[p.AgentID] = p.Programmed
		}
		for _, o := range running {
			if o == h {
				continue
			}
			id := ids[o]
			if id == "" {
				errs = append(errs, fmt.Errorf("%s: id of %s unknown yet", h.Name, o.Name))
				continue
			}
			p, known := programmed[id]
			switch {
			case !known:
				errs = append(errs, fmt.Errorf("%s does not know %s (%s)", h.Name, o.Name, id))
			case !p:
				errs = append(errs, fmt.Errorf("%s has not programmed %s (%s)", h.Name, o.Name, id))
			}
		}
	}
	return errors.Join(errs...)
}

// WaitConverged waits until Converged returns nil.
func (c *Cluster) WaitConverged(ctx context.Context) error {
	if err := retry.Until(ctx, 200*time.Millisecond, func() error { return c.Converged(ctx) }); err != nil {
		return fmt.Errorf("labcluster: not converged: %w", err)
	}
	return nil
}

// State is the masters' state (a consistent read).
func (c *Cluster) State(ctx context.Context) (*api.State, error) {
	return c.Client().State(ctx, api.StateOptions{Consistent: true})
}

// SetUnderlayIP re-addresses h's underlay interface: the old address goes,
// ip comes (it must lie in 198.18.0.0/15). Stop the agent first and start it
// again afterwards: its flags follow the host's current IP, and its
// certificate is issued again for that IP. A host that runs
// a master is refused, since the master's Raft address is fixed in every
// master's --peers.
func (c *Cluster) SetUnderlayIP(h *Host, ip netip.Prefix) error {
	underlay := netip.MustParsePrefix("198.18.0.0/15")
	if !underlay.Contains(ip.Addr()) || ip.Bits() != netnslab.UnderlayPrefixLen {
		return fmt.Errorf("labcluster: %s is not a /%d address in %s", ip, netnslab.UnderlayPrefixLen, underlay)
	}
	if h.Master != nil {
		return fmt.Errorf("labcluster: %s runs master %s bound to %s; re-addressing it needs a Raft membership change", h.Name, h.Master.ID, h.IP().Addr())
	}
	old := h.IP()
	nh, err := netlinksafe.NewHandleAt(h.NS.NsHandle())
	if err != nil {
		return fmt.Errorf("labcluster: netlink in %s: %w", h.Name, err)
	}
	defer nh.Close()
	link, err := nh.LinkByName(h.NS.Link)
	if err != nil {
		return fmt.Errorf("labcluster: %s in %s: %w", h.NS.Link, h.Name, err)
	}
	// Old first: the new address shares the old one's subnet and would be
	// deleted with it as its secondary.
	oldAddr, _ := netlink.ParseAddr(old.String())
	if err := nh.AddrDel(link, oldAddr); err != nil {
		return fmt.Errorf("labcluster: remove %s from %s: %w", old, h.Name, err)
	}
	newAddr, _ := netlink.ParseAddr(ip.String())
	if err := nh.AddrAdd(link, newAddr); err != nil {
		return fmt.Errorf("labcluster: add %s to %s: %w", ip, h.Name, err)
	}
	if err := c.sec.issue(pki.RoleAgent, h.CertName(), ip.Addr()); err != nil {
		return err
	}
	c.mu.Lock()
	h.ip = ip
	c.mu.Unlock()
	c.log.Info("host re-addressed", "host", h.Name, "old", old, "new", ip)
	return nil
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
		fmt.Fprintf(w, "--- CNI plugins on %s (their stderr): last %d lines of %s\n%s\n", h.Name, n, h.cniLog.Name(), tailFile(h.cniLog.Name(), n))
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
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range c.processes() {
		wg.Go(func() {
			if err := p.Stop(context.Background(), 5*time.Second); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
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
