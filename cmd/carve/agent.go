package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/carve-net/carve/agent"
	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/internal/unixsock"
	"github.com/carve-net/carve/pki"
)

func runAgent(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "rotate-wireguard-key" {
		return runRotateWireGuardKey(ctx, args[1:], os.Stdout)
	}
	ignoreSIGHUP()
	fs := cli.NewFlagSet("carve agent")
	dataDir := fs.String("data-dir", "", "directory for the agent's state (id, last known leases and peers)")
	masters := fs.String("masters", "", "master URLs, comma separated")
	id := fs.String("id", "", "agent id (default: the name in --cert-file; with --insecure and no certificate, created on first start and kept in --data-dir)")
	ip := fs.String("ip", "", "underlay IP (default: the source address of the route towards the first master)")
	httpAddr := fs.String("http-addr", "127.0.0.1:9797", "HOST:PORT of the agent's HTTP API (https with --cert-file: every route but /healthz needs a client certificate of the cluster CA)")
	debugAddr := fs.String("debug-addr", "", "LOOPBACK_IP:PORT serving Go's runtime profiles (/debug/pprof/; plain http, no authentication, so loopback only: 127.0.0.1 or ::1); empty: off")
	socket := fs.String("socket", "/run/carve/agent.sock", "unix socket of the IPAM service (carve-ipam and the Docker plugin use it)")
	meshAddr := fs.String("mesh-addr", "", "HOST:PORT for mesh gossip, advertised to other agents (default: UNDERLAY_IP:6783)")
	meshPeers := fs.Int("mesh-peers", agent.DefaultMeshPeers, "how many peers the agent keeps mesh connections to (chosen by hashing agent ids; gossip reaches the others through them)")
	cniConfDir := fs.String("cni-conf-dir", "/etc/cni/net.d", "where the agent writes <overlay>.conflist for CNI runtimes (empty: none)")
	cniVersion := fs.String("cni-version", "auto", "CNI spec version of the conflists: "+netconf.VersionHelp()+"; or auto: the highest that the plugins in --cni-bin-dir and the containerd/Podman on the host read, chosen at start")
	cniBinDir := fs.String("cni-bin-dir", strings.Join(netconf.DefaultBinDirs(), ":"), "where the CNI runtimes look for plugins, colon separated like CNI_PATH (containerd and Nomad: /opt/cni/bin; Podman on Debian: /usr/lib/cni): asked for --cni-version auto and checked for carve-ipam, bridge, portmap and loopback at start")
	cniConfPrefix := fs.String("cni-conf-prefix", "", "start of the conflists' file names (e.g. 10- writes 10-<overlay>.conflist), for runtimes that load only the first file of --cni-conf-dir (containerd's CRI with max_conf_num = 1, CRI-O)")
	mesosCNIConfDir := fs.String("mesos-cni-conf-dir", "", "where the agent also writes the single-plugin <overlay>.conf the Mesos CNI isolator reads (its --network_cni_config_dir; a directory of its own, not --cni-conf-dir; empty: none)")
	dockerNetworkName := fs.String("docker-network-name", dockeripam.DefaultNetworkName, "name of each overlay's Docker network, "+dockeripam.OverlayPlaceholder+" replaced by the overlay's name (DC/OS's is the overlay's name; the bridge stays d-<overlay>)")
	dockerSocket := fs.String("docker-plugin-socket", dockeripam.DefaultPluginSocket, "the Docker remote IPAM plugin's socket (with --docker-bridge; empty: no plugin); the driver is named after it")
	dockerHost := fs.String("docker-host", dockeripam.DefaultDockerHost, "the Docker engine on which the agent creates its overlay networks (on the d-<overlay> bridges)")
	cniCacheDir := fs.String("cni-cache-dir", agent.DefaultCNICacheDir, "the CNI runtime's cache, read to take back running containers' addresses after a lost data dir (empty: none)")
	mesosBridge := fs.Bool("mesos-bridge", true, "ask for the m-<overlay> bridge (CNI containers)")
	dockerBridge := fs.Bool("docker-bridge", true, "ask for the d-<overlay> bridge (Docker)")
	lowWater := fs.Int("grow-low-water", 0, "free addresses of a bridge below which it gets another block in the background (0: max(2, 1/8 of its first block); negative: only when it is full)")
	idleReturn := fs.Duration("block-idle-return", 10*time.Minute, "how long a grown block stays without a container before it goes back to its donor or the masters (negative: never)")
	reclaimAfter := fs.Duration("reclaim-after", agent.DefaultReclaimAfter, "release the addresses of a CNI container whose network namespace (CNI_NETNS, under --reclaim-netns-dirs) has been gone this long without a DEL (0: never)")
	reclaimDryRun := fs.Bool("reclaim-dry-run", false, "with --reclaim-after: log and count the addresses that would be released, release none")
	reclaimDirs := fs.String("reclaim-netns-dirs", strings.Join(ipam.DefaultReclaimNetNSDirs, ","), "the runtime directories, comma separated, whose network namespaces --reclaim-after watches (a namespace elsewhere is never reclaimed)")
	resync := fs.Duration("resync-interval", agent.DefaultResyncInterval, "period of the full kernel resync")
	fastPath := fs.Bool("fast-path", true, "in routed mode, forward IPv4 between routed peers' containers and this host's with carve's eBPF program, past the host's IP forwarding and FORWARD chain (Linux 6.6 or later; elsewhere the kernel forwards); false: always the kernel's forwarding")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	tlsFiles := opclient.TLSFlags(fs, "the agent's certificate (PEM; carve certs issue --role agent --name AGENT_ID --ip UNDERLAY_IP): presented to the masters and served on --http-addr; its name is the agent id")
	meshPasswordFile := fs.String("mesh-password-file", "", "file holding the mesh password (the same on every agent; one trailing newline is ignored): gossip is encrypted and authenticated with it; read again on SIGHUP")
	meshAcceptedFile := fs.String("mesh-accepted-password-file", "", "during a change of the mesh password, a file holding a second password accepted from peers (never sent); an empty or absent file: none (set the flag for good); read again on SIGHUP (docs/security.md, \"Rotation\")")
	signingPubFile := fs.String("signing-pub-file", "", "the masters' public record-signing key (signing.pub of carve certs ca, PEM): agent records and tombstones, from gossip or from the masters, are taken only when they verify with it, and a master state signed with another key is refused, unless the masters' signing key chain leads to it from this one (default: the key of the first master state read, pinned in --data-dir)")
	socketGroup := fs.String("socket-group", "0", "group (name or numeric id) of the IPAM socket and the Docker plugin socket, both mode 0660 owned by root")
	wg := wireGuardFlags(fs)
	insecure := fs.Bool("insecure", false, "allow running without TLS files, without --mesh-password-file and with plain http masters: for a throwaway lab only")
	checkConfig := fs.Bool("check-config", false, "check the flags, their CARVE_* variables and the files they name, print the configuration and exit (0: it would start)")
	d, err := parseDaemon("carve agent", fs, args, logLevel)
	if err != nil {
		return err
	}
	logger, level := d.logger, d.level
	cfg, err := func() (agent.Config, error) {
		if *socket == "" {
			return agent.Config{}, fmt.Errorf("%w: --socket is empty: carve-ipam and the Docker plugin reach the agent only through its IPAM socket (default /run/carve/agent.sock)", cli.ErrUsage)
		}
		if *dataDir == "" {
			return agent.Config{}, fmt.Errorf("%w: --data-dir is required", cli.ErrUsage)
		}
		urls, err := opclient.SplitMasters(*masters)
		if err != nil {
			return agent.Config{}, err
		}
		var underlay netip.Addr
		if *ip != "" {
			if underlay, err = netip.ParseAddr(*ip); err != nil || underlay.Zone() != "" {
				return agent.Config{}, fmt.Errorf("%w: --ip %q is not an IP address", cli.ErrUsage, *ip)
			}
		}
		if _, _, err := net.SplitHostPort(*httpAddr); err != nil {
			return agent.Config{}, fmt.Errorf("%w: --http-addr %q: want HOST:PORT", cli.ErrUsage, *httpAddr)
		}
		if *debugAddr != "" {
			if err := checkDebugAddr(*debugAddr); err != nil {
				return agent.Config{}, fmt.Errorf("%w: %v", cli.ErrUsage, err)
			}
		}
		if *meshAddr != "" {
			if _, err := netip.ParseAddrPort(*meshAddr); err != nil {
				return agent.Config{}, fmt.Errorf("%w: --mesh-addr %q: want IP:PORT", cli.ErrUsage, *meshAddr)
			}
		}
		if *mesosCNIConfDir != "" && filepath.Clean(*mesosCNIConfDir) == filepath.Clean(*cniConfDir) {
			return agent.Config{}, fmt.Errorf("%w: --mesos-cni-conf-dir %s is --cni-conf-dir: a runtime would find two configurations of each network there", cli.ErrUsage, *mesosCNIConfDir)
		}
		if *cniVersion != "auto" {
			if err := netconf.ValidVersion(*cniVersion); err != nil {
				return agent.Config{}, fmt.Errorf("%w: --cni-version: %v (or auto)", cli.ErrUsage, err)
			}
		}
		if strings.ContainsAny(*cniConfPrefix, "/\\") || strings.HasPrefix(*cniConfPrefix, ".") {
			return agent.Config{}, fmt.Errorf("%w: --cni-conf-prefix %q: want the start of a file name (no slash, no leading dot)", cli.ErrUsage, *cniConfPrefix)
		}
		if err := dockeripam.ValidateNetworkName(*dockerNetworkName); err != nil {
			return agent.Config{}, fmt.Errorf("%w: --docker-network-name: %v", cli.ErrUsage, err)
		}
		if *meshPeers < 1 || *meshPeers > 64 {
			return agent.Config{}, fmt.Errorf("%w: --mesh-peers %d: want 1-64 (2 or more keep the mesh connected when a peer goes)", cli.ErrUsage, *meshPeers)
		}
		if *reclaimAfter < 0 {
			return agent.Config{}, fmt.Errorf("%w: --reclaim-after %s: want 0 (off) or a positive duration", cli.ErrUsage, *reclaimAfter)
		}
		var netnsDirs []string
		for _, d := range strings.Split(*reclaimDirs, ",") {
			if d = strings.TrimSpace(d); d == "" {
				continue
			}
			if !filepath.IsAbs(d) {
				return agent.Config{}, fmt.Errorf("%w: --reclaim-netns-dirs: %q is not an absolute path", cli.ErrUsage, d)
			}
			netnsDirs = append(netnsDirs, d)
		}
		if *reclaimAfter > 0 && len(netnsDirs) == 0 {
			return agent.Config{}, fmt.Errorf("%w: --reclaim-netns-dirs is empty: set --reclaim-after=0 to turn the reclaim off", cli.ErrUsage)
		}
		if *resync < time.Second {
			return agent.Config{}, fmt.Errorf("%w: --resync-interval %s: at least 1s", cli.ErrUsage, *resync)
		}
		gid, err := unixsock.LookupGroup(*socketGroup)
		if err != nil {
			return agent.Config{}, fmt.Errorf("%w: --socket-group: %v", cli.ErrUsage, err)
		}
		if *meshAcceptedFile != "" && *meshPasswordFile == "" {
			return agent.Config{}, fmt.Errorf("%w: --mesh-accepted-password-file needs --mesh-password-file (the password sent)", cli.ErrUsage)
		}
		meshPassword, meshAccepted, err := readMeshPasswords(*meshPasswordFile, *meshAcceptedFile)
		if err != nil {
			return agent.Config{}, err
		}
		var signingKey ed25519.PublicKey
		if *signingPubFile != "" {
			if signingKey, err = pki.LoadVerifyKey(*signingPubFile); err != nil {
				return agent.Config{}, fmt.Errorf("--signing-pub-file %s: %w", *signingPubFile, err)
			}
		}
		wgConfig, err := wg.config()
		if err != nil {
			return agent.Config{}, err
		}
		hostname, _ := os.Hostname()
		return agent.Config{
			DataDir: *dataDir, Masters: urls, ID: *id, IP: underlay, Hostname: hostname,
			HTTPAddr: *httpAddr, DebugAddr: *debugAddr, Socket: *socket, CNIConfDir: *cniConfDir, MesosCNIConfDir: *mesosCNIConfDir, CNICacheDir: *cniCacheDir,
			CNIVersion: *cniVersion, CNIBinDirs: filepath.SplitList(*cniBinDir), CNIConfPrefix: *cniConfPrefix,
			DockerNetworkName:  *dockerNetworkName,
			DockerPluginSocket: *dockerSocket, DockerHost: *dockerHost, MeshAddr: *meshAddr, MeshPeers: *meshPeers, MesosBridge: *mesosBridge, DockerBridge: *dockerBridge,
			Reclaim:        ipam.ReclaimConfig{After: *reclaimAfter, DryRun: *reclaimDryRun, NetNSDirs: netnsDirs},
			ResyncInterval: *resync, NoFastPath: !*fastPath, Logger: logger, LogLevel: level, SocketGID: gid, GrowLowWater: *lowWater, BlockIdleReturn: *idleReturn,
			TLS: *tlsFiles, MeshPassword: meshPassword, MeshAcceptedPasswords: meshAccepted, Insecure: *insecure,
			SigningKey: signingKey, WireGuard: wgConfig,
		}, nil
	}()
	if err != nil {
		return d.explain(err)
	}
	if *checkConfig {
		return d.checked(agent.CheckConfig(cfg))
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	reloadOnSIGHUP(ctx, cfg.Logger, "the TLS files and the mesh passwords", func() error {
		if err := a.ReloadTLS(); err != nil {
			return err
		}
		if *meshPasswordFile == "" {
			return nil
		}
		password, accepted, err := readMeshPasswords(*meshPasswordFile, *meshAcceptedFile)
		if err != nil {
			return err
		}
		return a.SetMeshPasswords(password, accepted)
	})
	return a.Run(ctx)
}

// readMeshPasswords reads --mesh-password-file and
// --mesh-accepted-password-file (either may be empty: none).
func readMeshPasswords(passwordFile, acceptedFile string) ([]byte, [][]byte, error) {
	var password []byte
	var accepted [][]byte
	var err error
	if passwordFile != "" {
		if password, err = gossip.ReadPasswordFile(passwordFile); err != nil {
			return nil, nil, fmt.Errorf("--mesh-password-file: %w", err)
		}
	}
	if acceptedFile != "" {
		next, err := gossip.ReadAcceptedPasswordFile(acceptedFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--mesh-accepted-password-file: %w", err)
		}
		if next != nil {
			accepted = append(accepted, next)
		}
	}
	return password, accepted, nil
}
