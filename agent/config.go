package agent

// What an agent is told: its configuration and the defaults of its timing.

import (
	"crypto/ed25519"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vishvananda/netns"

	"github.com/carve-net/carve/agent/encryption"
	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/agent/meshpeers"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/pki"
)

// DefaultMeshPeers is how many peers an agent keeps mesh connections to
// (meshpeers.DefaultPeers says why).
const DefaultMeshPeers = meshpeers.DefaultPeers

// Defaults of the agent's timing.
const (
	DefaultResyncInterval = 30 * time.Second
	DefaultWatchWait      = 30 * time.Second
	// firstRetry and maxRetry bound registration retries: the first retry
	// comes within 5 s, later ones at most a minute apart.
	firstRetry = 2 * time.Second
	maxRetry   = time.Minute
	// maxWatchRetry caps the state watch's retries lower: gossip covers
	// the gap, but masters that come back should be followed soon.
	maxWatchRetry = 10 * time.Second
)

// Router is a gossip router the agent can start, stop and point at peers.
type Router interface {
	gossip.Router
	Start() error
	// Connect has the router connect to peers at these HOST:PORT
	// addresses, and keep trying them.
	Connect(addrs ...string) error
	// Forget has the router stop trying addresses given to Connect.
	Forget(addrs ...string) error
	Stop() error
}

// Config configures an agent.
type Config struct {
	DataDir string
	Masters []string
	// ID fixes the agent id; empty means the persisted one (created on first start).
	ID string
	// IP is the underlay IP; invalid means the source address of the route
	// towards the first master.
	IP       netip.Addr
	Hostname string
	// HTTPAddr is where the agent's HTTP API listens.
	HTTPAddr string
	// DebugAddr, when set, is where the agent serves Go's runtime
	// profiles (/debug/pprof/, plain http, no client certificates): for
	// an operator finding where its CPU goes, on loopback. Empty: none.
	DebugAddr string
	// Socket is the unix socket of the IPAM service.
	Socket string
	// SocketGID is the group of the IPAM socket and of the Docker plugin
	// socket (mode 0660, owner root); 0 is root's group.
	SocketGID int
	// CNIConfDir receives a <overlay>.conflist per overlay with a mesos
	// bridge; empty writes none.
	CNIConfDir string
	// MesosCNIConfDir receives, as well, a single-plugin <overlay>.conf per
	// such overlay for the Mesos CNI isolator (which skips conflists);
	// empty writes none.
	MesosCNIConfDir string
	// CNIVersion is the spec version of the conflists (netconf.ValidVersion);
	// empty or "auto": chosen once at start by asking the plugins in
	// CNIBinDirs and the runtimes on the host (netconf.ChooseVersion).
	CNIVersion string
	// CNIBinDirs are where the runtimes look for CNI plugins: probed for the
	// version and the warnings at start, never run by the agent otherwise.
	CNIBinDirs []string
	// CNIConfPrefix starts the conflists' file names (e.g. "10-"), for
	// runtimes that load only the first file of CNIConfDir.
	CNIConfPrefix string
	// DockerPluginSocket is where the Docker remote IPAM plugin listens (with
	// DockerBridge); empty disables the plugin.
	DockerPluginSocket string
	// DockerHost is the Docker engine the agent creates its networks on.
	DockerHost string
	// DockerNetworkName is the template of the Docker networks' names
	// (dockeripam.Options.NetworkName); empty is the overlay's name.
	DockerNetworkName string
	// CNICacheDir is the runtime's libcni cache (results/), read to take
	// back the addresses of running containers after a lost disk; empty: none.
	CNICacheDir string
	// BlockSource is the masters' side of growth (more lease for a bridge,
	// grant reports, returns, and usage reports when it is an
	// ipam.UsageReporter); nil: the masters' client.
	BlockSource ipam.BlockSource
	// UsageInterval is the least time between two usage reports to the
	// masters (0: 5s; negative: none).
	UsageInterval time.Duration
	// GrowLowWater is a bridge's free addresses below which it grows (0:
	// max(2, 1/8 of its first block); negative: only when full).
	GrowLowWater int
	// BlockIdleReturn is how long a grown block stays empty before it goes
	// back (0: 10 minutes; negative: never).
	BlockIdleReturn time.Duration
	// Reclaim releases the addresses of CNI containers whose network
	// namespace is gone (ipam.ReclaimConfig; the zero value: off).
	Reclaim ipam.ReclaimConfig
	// MeshAddr is where mesh listens (HOST:PORT); it is advertised to other
	// agents through the masters. Empty means IP:6783.
	MeshAddr string
	// MeshPeers bounds the peers the agent keeps mesh connections to (it
	// accepts connections from others too, up to mesh's limit); 0 means
	// DefaultMeshPeers.
	MeshPeers    int
	MesosBridge  bool
	DockerBridge bool
	// ResyncInterval is the period of the full kernel resync.
	ResyncInterval time.Duration
	// NoFastPath leaves routed peers' traffic to the kernel's forwarding
	// instead of the eBPF fast path (vxlan.Options.NoFastPath).
	NoFastPath bool
	// WatchWait is how long one blocking state query waits.
	WatchWait time.Duration
	// NetNS is the namespace to program (tests); zero means the agent's own.
	NetNS netns.NsHandle
	// NewRouter builds the gossip router for the agent id; nil means a real
	// mesh router on MeshAddr.
	NewRouter func(id string) (Router, error)
	Logger    *slog.Logger
	// LogLevel is the level behind Logger, which an operator may change at
	// run time (GET|PUT /log-level); nil: no such route.
	LogLevel *slog.LevelVar

	// TLS names the CA, the agent's certificate (role agent, named after the
	// agent id) and its key: the HTTP API serves TLS with them and requires
	// client certificates of the CA, and the masters are reached over https
	// and must show a master certificate of the CA. Without ID, the agent id
	// is the certificate's.
	TLS pki.Files
	// MeshPassword turns on mesh's authenticated encryption; ring gossip
	// rides the same router. nil means none (an empty non-nil password would
	// encrypt with an empty secret).
	MeshPassword []byte
	// MeshAcceptedPasswords are accepted from peers besides MeshPassword
	// during a change of the mesh password (SetMeshPasswords).
	MeshAcceptedPasswords [][]byte
	// Insecure allows running without TLS files, without MeshPassword and
	// with plain http masters: for a throwaway lab only. New refuses each of
	// them otherwise (ErrInsecure).
	Insecure bool
	// SigningKey is the masters' public record-signing key
	// (--signing-pub-file): records and tombstones verify with it, and a
	// master state carrying another key is refused. nil: the key of the
	// first master state read, pinned in the store (see verify.go).
	SigningKey ed25519.PublicKey
	// WireGuard configures the key and device of encryption between hosts
	// (package encryption); the network configuration turns encryption on.
	WireGuard encryption.Config
}
