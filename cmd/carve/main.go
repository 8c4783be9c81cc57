// Command carve runs a carve master or agent, reads the masters' state,
// gives operators their commands (cluster status, agents delete, snapshot
// save and restore, ipam show and check, agent rotate-wireguard-key),
// installs the CNI plugin, issues certificates, and starts the demo
// (bin/carve-lab).
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/carve-net/carve/internal/certscmd"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/loglevel"
	"github.com/carve-net/carve/ipamcmd"
)

const usage = `carve: a VXLAN overlay control plane

usage:
  carve master --id ID --data-dir DIR --http-addr HOST:PORT --raft-addr HOST:PORT \
               --peers m1=HOST:PORT,... [--config network.json] [--join URL] [--restore-from FILE] \
               --ca-file CA --cert-file CERT --key-file KEY --signing-key-file signing.key | --insecure
  carve agent  --data-dir DIR --masters URL[,URL...] --ca-file CA --cert-file CERT --key-file KEY \
               --mesh-password-file FILE [--signing-pub-file signing.pub] [--id ID] [--ip UNDERLAY_IP] [--http-addr HOST:PORT] \
               [--socket PATH] [--socket-group GROUP] [--mesh-addr HOST:PORT] [--mesh-peers N] \
               [--cni-conf-dir DIR] [--cni-version auto] [--cni-bin-dir DIRS] [--cni-conf-prefix P] [--mesos-bridge=true] [--docker-bridge=true] [--insecure]
  carve state  --masters URL[,URL...] [--json] [--consistent] \
               --ca-file CA --cert-file CERT --key-file KEY | --insecure
  carve cluster status --masters URL[,URL...] [--json] CLIENT_TLS
  carve cluster join --id ID --raft-addr HOST:PORT [--http-addr HOST:PORT] --masters URL[,URL...] OPERATOR_TLS
  carve cluster remove ID --masters URL[,URL...] OPERATOR_TLS
  carve config show --masters URL[,URL...] OPERATOR_TLS
  carve config diff FILE --masters URL[,URL...] OPERATOR_TLS
  carve config apply FILE [--dry-run] --masters URL[,URL...] OPERATOR_TLS
  carve agents delete ID|IP... --masters URL[,URL...] [--json] [--request-id ID] OPERATOR_TLS
  carve agent rotate-wireguard-key ID|IP... --masters URL[,URL...] [--json] [--agent-port 9797] OPERATOR_TLS
  carve snapshot save FILE --masters URL[,URL...] [--timeout 1m] OPERATOR_TLS
  carve snapshot restore FILE --masters URL[,URL...] [--timeout 1m] OPERATOR_TLS
  carve ipam   show  --masters URL[,URL...] [--agent ID] [--overlay NAME] [--json] [--agent-port 9797] CLIENT_TLS
  carve ipam   check --masters URL[,URL...] [--json] [--settle 3s] [--agent-port 9797] CLIENT_TLS
  carve ipam   release --container-id ID [--ifname IF] | --ip ADDR [--network NAME] [--socket PATH] [--json]
  carve log-level --url URL [--level debug|info|warn|error] OPERATOR_TLS
  carve install-cni [--bin-dir /opt/cni/bin] [--from DIR] [--plugins-from DIR[:DIR...]]
  carve certs  ca --dir DIR [--days N]
  carve certs  issue --dir DIR --role master|agent|operator --name NAME [--ip IP ...] [--dns NAME ...] [--days N]
  carve certs  rotate-signing --dir DIR [--switch | --finish --masters URLS OPERATOR_TLS [--force]]
  carve certs  revoke (--dir DIR --name NAME | --serial HEX [--identity ROLE/NAME]) --masters URLS OPERATOR_TLS
  carve certs  check-ca --new-ca-file NEW/ca.pem --masters URLS OPERATOR_TLS
  carve certs  check-mesh --password-file FILE [--accepted-file FILE] --masters URLS OPERATOR_TLS
  carve demo   [--hosts 3] [--containers 2] [--keep]
  carve version [--json]

CLIENT_TLS is --ca-file CA --cert-file CERT --key-file KEY with a certificate of role operator
or agent, OPERATOR_TLS the same with one of role operator; --insecure instead for a lab without TLS.
Run 'carve COMMAND -h' for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "master":
		err = runMaster(ctx, args)
	case "agent":
		err = runAgent(ctx, args)
	case "state":
		err = runState(ctx, args, os.Stdout)
	case "cluster":
		err = runCluster(ctx, args, os.Stdout)
	case "config":
		err = runConfig(ctx, args, os.Stdout)
	case "agents":
		err = runAgents(ctx, args, os.Stdout)
	case "snapshot":
		err = runSnapshot(ctx, args, os.Stdout)
	case "ipam":
		err = ipamcmd.Run(ctx, args, os.Stdout)
	case "certs":
		err = certscmd.Run(ctx, args, os.Stdout)
	case "log-level":
		err = runLogLevel(ctx, args, os.Stdout)
	case "install-cni":
		err = runInstallCNI(args, os.Stdout)
	case "demo":
		err = runDemo(args)
	case "version":
		err = runVersion(args, os.Stdout)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "carve: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if code := cli.Report(os.Stderr, "carve "+os.Args[1], err); code != 0 {
		stop()
		os.Exit(code)
	}
}

// newLogger builds the process logger at the given level, and the level
// variable behind it (PUT /log-level changes it at run time).
func newLogger(w io.Writer, level string) (*slog.Logger, *slog.LevelVar, error) {
	l, err := loglevel.Parse(level)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --log-level: %v", cli.ErrUsage, err)
	}
	v := new(slog.LevelVar)
	v.Set(l)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: v})), v, nil
}
