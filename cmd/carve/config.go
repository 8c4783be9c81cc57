package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/master/netconfig"
)

const configUsage = `usage:
  carve config show  --masters URL[,URL...] OPERATOR_TLS
  carve config diff  FILE --masters URL[,URL...] OPERATOR_TLS
  carve config apply FILE [--dry-run] --masters URL[,URL...] OPERATOR_TLS

The masters' committed network configuration is the cluster's one
authority for it: a master's --config file only starts a new cluster.
show prints the committed configuration; diff compares FILE with it (and
what the masters would keep of theirs: leased overlays' subnets, the VTEP
subnet in use); apply commits FILE through Raft (an operator certificate).
`

func runConfig(ctx context.Context, args []string, out io.Writer) error {
	return cli.Subcommand("carve config", configUsage, args, out, map[string]func([]string) error{
		"show":  func(args []string) error { return runConfigCommand(ctx, "show", args, out) },
		"diff":  func(args []string) error { return runConfigCommand(ctx, "diff", args, out) },
		"apply": func(args []string) error { return runConfigCommand(ctx, "apply", args, out) },
	})
}

func runConfigCommand(ctx context.Context, verb string, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve config " + verb)
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the masters")
	var dryRun *bool
	if verb == "apply" {
		dryRun = fs.Bool("dry-run", false, "say what would change, commit nothing")
	}
	mf := opclient.AddMasterFlags(fs, "a certificate of role operator (carve certs issue --role operator --name NAME)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), configUsage); fs.PrintDefaults() }
	operands, err := cli.ParseOperands(fs, args)
	if err != nil {
		return err
	}
	var file api.NetworkConfig
	switch {
	case verb == "show" && len(operands) != 0:
		return fmt.Errorf("%w: carve config show takes no file (got %q)\n%s", cli.ErrUsage, operands, configUsage)
	case verb != "show" && len(operands) != 1:
		return fmt.Errorf("%w: name one configuration file (network.json)\n%s", cli.ErrUsage, configUsage)
	case verb != "show":
		if file, err = netconfig.Load(operands[0]); err != nil {
			return fmt.Errorf("%w: %v", cli.ErrUsage, err)
		}
	}
	client, _, err := mf.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if verb == "show" {
		ans, err := client.Config(ctx)
		if err != nil {
			return fmt.Errorf("read the committed configuration: %w", err)
		}
		return cli.WriteJSON(out, ans.Config)
	}
	ans, err := client.ApplyConfig(ctx, file, verb == "diff" || *dryRun)
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, operands[0], err)
	}
	switch {
	case !ans.Changed:
		fmt.Fprintf(out, "%s changes nothing: the committed configuration already says it\n", operands[0])
	case ans.DryRun:
		fmt.Fprintf(out, "%s would change the committed configuration:\n", operands[0])
		printConfigDiff(out, ans.Config, netconfig.WithDefaults(file))
	default:
		fmt.Fprintf(out, "%s committed: the masters' network configuration is now\n", operands[0])
		if err := cli.WriteJSON(out, ans.Config); err != nil {
			return err
		}
	}
	for _, w := range ans.Warnings {
		fmt.Fprintf(out, "warning: %s\n", w)
	}
	return nil
}

// printConfigDiff prints the lines of the two configurations' indented
// JSON that differ: "-" committed, "+" the file.
func printConfigDiff(out io.Writer, committed, file api.NetworkConfig) {
	lines := func(c api.NetworkConfig) []string {
		b, _ := json.MarshalIndent(c, "", "  ") // plain data: cannot fail
		return strings.Split(string(b), "\n")
	}
	a, b := lines(committed), lines(file)
	inB, inA := map[string]int{}, map[string]int{}
	for _, l := range b {
		inB[l]++
	}
	for _, l := range a {
		inA[l]++
	}
	for _, l := range a {
		if inB[l] == 0 {
			fmt.Fprintf(out, "- %s\n", l)
		}
	}
	for _, l := range b {
		if inA[l] == 0 {
			fmt.Fprintf(out, "+ %s\n", l)
		}
	}
}
