package main

import (
	"context"
	"fmt"
	"os"

	"github.com/carve-net/carve/internal/demo"
)

func runDemo(ctx context.Context, args []string) error {
	fs := newFlagSet("demo")
	hosts := fs.Int("hosts", 3, "number of hosts (agents) to register")
	containers := fs.Int("containers", 2, "containers per host (used once the dataplane demo lands)")
	keep := fs.Bool("keep", false, "leave the cluster running until Ctrl-C")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *hosts < 1 || *hosts > 200 {
		return fmt.Errorf("%w: --hosts %d: want 1-200", errUsage, *hosts)
	}
	if *containers < 0 || *containers > 50 {
		return fmt.Errorf("%w: --containers %d: want 0-50", errUsage, *containers)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the carve binary: %w", err)
	}
	return demo.Run(ctx, demo.Options{Binary: self, Hosts: *hosts, Keep: *keep, Out: os.Stdout})
}
