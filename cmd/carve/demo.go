package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/carve-net/carve/internal/demo"
)

func runDemo(ctx context.Context, args []string) error {
	fs := newFlagSet("demo")
	hosts := fs.Int("hosts", 3, "host namespaces, each with an agent (masters run in the first three)")
	containers := fs.Int("containers", 2, "container namespaces per host")
	keep := fs.Bool("keep", false, "leave the cluster running until Ctrl-C")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *hosts < 1 || *hosts > 50 {
		return fmt.Errorf("%w: --hosts %d: want 1-50", errUsage, *hosts)
	}
	if *containers < 0 || *containers > 50 {
		return fmt.Errorf("%w: --containers %d: want 0-50", errUsage, *containers)
	}
	// `carve demo | head` must still clean up: a closed stdout makes writes
	// fail instead of killing the process before it removes the namespaces.
	signal.Ignore(syscall.SIGPIPE)
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the carve binary: %w", err)
	}
	return demo.Run(ctx, demo.Options{Binary: self, Hosts: *hosts, Containers: *containers, Keep: *keep, Out: os.Stdout})
}
