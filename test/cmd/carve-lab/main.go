// Command carve-lab runs the carve demo: a whole cluster of real carve
// masters and agents in network namespaces, containers attached through CNI,
// and a ping matrix through the overlay (test/lab/demo). It is the lab's own
// binary, so that bin/carve links no test harness; `carve demo` execs it.
// It runs bin/carve, carve-ipam and the CNI plugins found next to itself.
//
// A hidden subcommand, `carve-lab rogue-gossip`, is the end-to-end tests'
// rogue mesh peer (see rogue.go).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/test/lab/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	name, err := "carve demo", error(nil)
	if len(os.Args) > 1 && os.Args[1] == rogueCommand {
		name, err = "carve-lab "+rogueCommand, runRogue(ctx, os.Args[2:])
	} else {
		err = run(ctx, os.Args[1:])
	}
	if code := cli.Report(os.Stderr, name, err); code != 0 {
		stop()
		os.Exit(code)
	}
}

func run(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("carve demo")
	hosts := fs.Int("hosts", 3, "host namespaces, each with an agent (masters run in the first three)")
	containers := fs.Int("containers", 2, "container namespaces per host")
	keep := fs.Bool("keep", false, "leave the cluster running until Ctrl-C")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *hosts < 1 || *hosts > 50 {
		return fmt.Errorf("%w: --hosts %d: want 1-50", cli.ErrUsage, *hosts)
	}
	if *containers < 0 || *containers > 50 {
		return fmt.Errorf("%w: --containers %d: want 0-50", cli.ErrUsage, *containers)
	}
	carve, err := carveBinary()
	if err != nil {
		return err
	}
	// `carve demo | head` must still clean up: a closed stdout makes writes
	// fail instead of killing the process before it removes the namespaces.
	signal.Ignore(syscall.SIGPIPE)
	return demo.Run(ctx, demo.Options{Binary: carve, Hosts: *hosts, Containers: *containers, Keep: *keep, Out: os.Stdout})
}

// carveBinary is the carve binary next to this one (make build puts both in
// bin/): the masters and agents of the demo run it.
func carveBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the carve-lab binary: %w", err)
	}
	carve := filepath.Join(filepath.Dir(self), "carve")
	if fi, err := os.Stat(carve); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("the demo runs %s, which is missing or not executable: run make build", carve)
	}
	return carve, nil
}
