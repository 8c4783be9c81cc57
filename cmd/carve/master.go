package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/changelog"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
)

func runMaster(ctx context.Context, args []string) error {
	ignoreSIGHUP()
	fs := cli.NewFlagSet("carve master")
	id := fs.String("id", "", "this master's Raft server id (e.g. m1)")
	dataDir := fs.String("data-dir", "", "directory for the Raft log, stable store and snapshots")
	httpAddr := fs.String("http-addr", "127.0.0.1:8080", "HOST:PORT of the HTTP API; a concrete address, not a wildcard: the other masters forward writes to it")
	raftAddr := fs.String("raft-addr", "127.0.0.1:8300", "HOST:PORT of the Raft transport (listen and advertise)")
	peers := fs.String("peers", "", "initial voters: id=HOST:PORT,... (the same list on every master)")
	config := fs.String("config", "", "network configuration JSON file that a new cluster starts with (defaults of DESIGN.md when absent); once the cluster has a configuration the file is only compared with it (carve config apply changes it)")
	join := fs.String("join", "", "URL of a running master: join its cluster as a new voter")
	tlsFiles := opclient.TLSFlags(fs, "this master's certificate, role master, naming the hosts of --http-addr and --raft-addr (carve certs issue --role master --ip ...)")
	signingKey := fs.String("signing-key-file", "", "the masters' record-signing key (signing.key of carve certs ca): every agent record and tombstone is signed with it; required with TLS; read again on SIGHUP")
	signingChain := fs.String("signing-chain-file", "", "during a rotation of the record-signing key, the chain that endorses the new key with the old one (signing-chain.json of carve certs rotate-signing): agents follow it with no restart; read again on SIGHUP; an absent file: no chain (set the flag for good, the file exists during a rotation only)")
	insecure := fs.Bool("insecure", false, "run the API and Raft without TLS or authentication: for a throwaway lab only")
	maxConns := fs.Int("max-connections", httpapi.DefaultMaxConns, "most HTTP connections held at once (every agent holds one for its watch; lowered to the descriptor limit less 1024); clients without a certificate get an eighth, the oldest closed beyond it; beyond the cap a new connection is reset, its client tries another master")
	changeLog := fs.Int("change-log-size", changelog.DefaultIDs, "agent ids the change log keeps for the changes watch; a watcher further behind reads the whole state")
	tombstoneAge := fs.Duration("tombstone-max-age", master.DefaultTombstoneMaxAge, "how long a deleted agent's tombstone is kept (by the leader's clock); an agent away longer reads the whole state when it comes back")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	restoreFrom := fs.String("restore-from", "", "a snapshot (carve snapshot save) that the first leader of a new cluster commits before anything else: a whole-cluster restore onto empty data directories (ignored once the cluster has a log); see docs/operations.md")
	checkConfig := fs.Bool("check-config", false, "check the flags, their CARVE_* variables and the files they name, print the configuration and exit (0: it would start)")
	d, err := parseDaemon("carve master", fs, args, logLevel)
	if err != nil {
		return err
	}
	logger, level := d.logger, d.level
	opts, err := func() (master.Options, error) {
		if *id == "" {
			return master.Options{}, fmt.Errorf("%w: --id is required", cli.ErrUsage)
		}
		if *dataDir == "" {
			return master.Options{}, fmt.Errorf("%w: --data-dir is required", cli.ErrUsage)
		}
		for flagName, addr := range map[string]string{"--http-addr": *httpAddr, "--raft-addr": *raftAddr} {
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return master.Options{}, fmt.Errorf("%w: %s %q: want HOST:PORT", cli.ErrUsage, flagName, addr)
			}
		}
		servers, err := parsePeers(*peers)
		if err != nil {
			return master.Options{}, err
		}
		if len(servers) == 0 && *join == "" {
			return master.Options{}, fmt.Errorf("%w: give --peers (the initial voters) or --join URL", cli.ErrUsage)
		}
		if err := checkOwnAddresses(*id, *raftAddr, *httpAddr, servers); err != nil {
			return master.Options{}, err
		}
		if *tombstoneAge <= 0 {
			return master.Options{}, fmt.Errorf("%w: --tombstone-max-age %s: want a positive duration", cli.ErrUsage, *tombstoneAge)
		}
		if *maxConns < 1 {
			return master.Options{}, fmt.Errorf("%w: --max-connections %d: want at least 1", cli.ErrUsage, *maxConns)
		}
		if *changeLog < 1 {
			return master.Options{}, fmt.Errorf("%w: --change-log-size %d: want at least 1 (agent ids)", cli.ErrUsage, *changeLog)
		}
		if err := opclient.CheckSecurityFlags(*tlsFiles, *insecure, true); err != nil {
			return master.Options{}, err
		}
		if !*insecure && *signingKey == "" {
			return master.Options{}, fmt.Errorf("%w: --signing-key-file is required with TLS (the signing.key that carve certs ca wrote beside ca.pem)", cli.ErrUsage)
		}
		if *signingChain != "" && *signingKey == "" {
			return master.Options{}, fmt.Errorf("%w: --signing-chain-file needs --signing-key-file (the new key it endorses)", cli.ErrUsage)
		}
		key, chain, err := loadSigning(*signingKey, *signingChain)
		if err != nil {
			return master.Options{}, err
		}
		netCfg := netconfig.Default()
		if *config != "" {
			if netCfg, err = netconfig.Load(*config); err != nil {
				return master.Options{}, err
			}
		} else {
			logger.Info("no --config: using the default network configuration")
		}
		var snapshot []byte
		if *restoreFrom != "" {
			if snapshot, err = readSnapshot(*restoreFrom); err != nil {
				return master.Options{}, fmt.Errorf("--restore-from: %w", err)
			}
		}
		return master.Options{
			ID: *id, DataDir: *dataDir, HTTPAddr: *httpAddr, RaftAddr: *raftAddr,
			Peers: servers, Network: netCfg, Join: *join, Logger: logger, LogLevel: level,
			TLS: *tlsFiles, SigningKey: key, SigningChain: chain, Insecure: *insecure,
			HTTPServer: httpapi.ServerOptions{MaxConns: *maxConns}, TombstoneMaxAge: *tombstoneAge, ChangeLogIDs: *changeLog,
			RestoreFrom: snapshot,
		}, nil
	}()
	if err != nil {
		return d.explain(err)
	}
	if *checkConfig {
		return d.checked(master.CheckOptions(opts))
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return fmt.Errorf("create --data-dir: %w", err)
	}
	m, err := master.Start(ctx, opts)
	if err != nil {
		return err
	}
	reloadOnSIGHUP(ctx, logger, "the TLS files, the signing key and chain", func() error {
		if err := m.ReloadTLS(); err != nil {
			return err
		}
		key, chain, err := loadSigning(*signingKey, *signingChain)
		if err != nil {
			return err
		}
		return m.SetSigning(key, chain)
	})
	<-ctx.Done()
	logger.Info("signal received, stopping")
	return m.Close()
}

// loadSigning reads --signing-key-file and --signing-chain-file (either
// may be empty: none).
func loadSigning(keyFile, chainFile string) (ed25519.PrivateKey, *api.SigningChain, error) {
	var key ed25519.PrivateKey
	var chain *api.SigningChain
	var err error
	if keyFile != "" {
		if key, err = pki.LoadSigningKey(keyFile); err != nil {
			return nil, nil, fmt.Errorf("--signing-key-file: %w", err)
		}
	}
	// The flag stays set; the file is there only during a rotation.
	if _, statErr := os.Stat(chainFile); chainFile != "" && !errors.Is(statErr, os.ErrNotExist) {
		if chain, err = pki.LoadSigningChain(chainFile); err != nil {
			return nil, nil, fmt.Errorf("--signing-chain-file: %w", err)
		}
	}
	return key, chain, nil
}

// parsePeers parses "m1=HOST:PORT,m2=HOST:PORT".
func parsePeers(s string) ([]raftlog.Server, error) {
	var out []raftlog.Server
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, addr, ok := strings.Cut(item, "=")
		if !ok || id == "" {
			return nil, fmt.Errorf("%w: --peers entry %q: want id=HOST:PORT", cli.ErrUsage, item)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%w: --peers entry %q: want id=HOST:PORT", cli.ErrUsage, item)
		}
		if seen[id] {
			return nil, fmt.Errorf("%w: --peers names %q twice", cli.ErrUsage, id)
		}
		seen[id] = true
		out = append(out, raftlog.Server{ID: id, Address: addr, Voter: true})
	}
	return out, nil
}

// checkOwnAddresses refuses the addresses a master would advertise wrongly:
// a --peers entry for this master's own id that names another address than
// --raft-addr (the others would dial one address, it would listen on
// another), and a loopback --raft-addr or --http-addr while --peers names
// masters on other hosts (an empty CARVE_RAFT_ADDR means the default,
// 127.0.0.1:8300, which no other master can reach).
func checkOwnAddresses(id, raftAddr, httpAddr string, peers []raftlog.Server) error {
	remote := ""
	for _, p := range peers {
		if p.ID == id && p.Address != raftAddr {
			return fmt.Errorf("%w: --peers gives this master (%s) the address %s, but --raft-addr is %s: give the same HOST:PORT in both (the others dial the --peers address)",
				cli.ErrUsage, id, p.Address, raftAddr)
		}
		if host, _, err := net.SplitHostPort(p.Address); err == nil && p.ID != id && !isLoopbackHost(host) {
			remote = p.Address
		}
	}
	if remote == "" {
		return nil
	}
	for flagName, addr := range map[string]string{"--raft-addr (CARVE_RAFT_ADDR)": raftAddr, "--http-addr (CARVE_HTTP_ADDR)": httpAddr} {
		if host, _, err := net.SplitHostPort(addr); err == nil && isLoopbackHost(host) {
			return fmt.Errorf("%w: %s is %s, a loopback address, while --peers names masters on other hosts (%s): set it to this master's own address (an empty variable means the flag's default)",
				cli.ErrUsage, flagName, addr, remote)
		}
	}
	return nil
}

// isLoopbackHost tells whether host is a loopback IP or localhost.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
