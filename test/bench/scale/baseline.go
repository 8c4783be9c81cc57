package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/carve-net/carve/test/lab/labcluster"
)

// errNoHistory: the module's git history (or git) is not there, so the
// baseline binary cannot be built.
var errNoHistory = errors.New("no git history")

// buildBaseline builds ./cmd/carve of git revision rev into dir (from `git
// archive`, no worktree registered) and returns the path of a wrapper that
// runs it with labcluster's command lines: the wrapper drops the flags the
// old binary does not know (listed in droppedFlags).
func buildBaseline(ctx context.Context, rev, dir string) (string, error) {
	root, err := labcluster.ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	if _, err := exec.LookPath("git"); err != nil {
		return "", fmt.Errorf("%w: %w", errNoHistory, err)
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", "--quiet", rev+"^{commit}").Output(); err != nil || len(out) == 0 {
		return "", fmt.Errorf("%w: revision %s not found in %s", errNoHistory, rev, root)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", rev)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	var stderr bytes.Buffer
	untar.Stdin, err = archive.StdoutPipe()
	if err != nil {
		return "", err
	}
	archive.Stderr, untar.Stderr = &stderr, &stderr
	if err := untar.Start(); err != nil {
		return "", err
	}
	if err := errors.Join(archive.Run(), untar.Wait()); err != nil {
		return "", fmt.Errorf("git archive %s | tar -x: %w\n%s", rev, err, stderr.String())
	}
	bin := filepath.Join(dir, "carve-"+rev)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/carve")
	build.Dir = src
	// No .git in the archive; the module cache already holds what the old
	// go.sum names (no network).
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "GOPROXY=off")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/carve of %s: %w\n%s", rev, err, out)
	}
	// The sources are not needed any more.
	if err := os.RemoveAll(src); err != nil {
		return "", err
	}
	return writeWrapper(dir, bin)
}

// droppedFlags are flags labcluster passes to agents that the baseline
// binary predates (each takes a value).
var droppedFlags = []string{"--mesos-cni-conf-dir", "--signing-chain-file", "--mesh-accepted-password-file", "--wireguard-device"}

// writeWrapper writes dir/carve-baseline, a shell script that execs bin
// (same PID, so /proc measures bin) with droppedFlags removed.
func writeWrapper(dir, bin string) (string, error) {
	var cases []string
	for _, f := range droppedFlags {
		cases = append(cases, fmt.Sprintf("\t%s) skip=1; continue ;;\n\t%s=*) continue ;;\n", f, f))
	}
	script := fmt.Sprintf(`#!/bin/sh
# Runs the baseline carve with labcluster's flags, less those it predates.
skip=0
for a in "$@"; do
	shift
	if [ "$skip" = 1 ]; then skip=0; continue; fi
	case "$a" in
%s	esac
	set -- "$@" "$a"
done
exec %q "$@"
`, strings.Join(cases, ""), bin)
	path := filepath.Join(dir, "carve-baseline")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		return "", err
	}
	return path, nil
}

// baselineFigures are the baseline binary's figures.
type baselineFigures struct {
	idle     float64       // idle agent CPU seconds per minute
	register time.Duration // registration to programmed, median of 3
}

// baselineRun runs the baseline binary as the measured cluster does (3
// masters, the agent on host 1), registers the same n synthetic agents
// (without claim keys, which it predates) before the agent starts (so
// that it reads them in one state), waits until the agent programmed them
// all, and measures its idle CPU seconds per minute and registration to
// programmed as the current agent's.
func baselineRun(ctx context.Context, binary string, n int, o idleOptions) (f baselineFigures, err error) {
	err = labcluster.With(ctx, labcluster.Options{Binary: binary, Hosts: 3, Masters: 3, Prefix: prefix, LogLevel: "warn", Network: networkFor(n)}, os.Stderr, func(c *labcluster.Cluster) error {
		var ferr error
		f, ferr = baselineOn(ctx, c, n, o)
		return ferr
	})
	return f, err
}

// baselineOn is baselineRun on the cluster c, created but not started.
func baselineOn(ctx context.Context, c *labcluster.Cluster, n int, o idleOptions) (f baselineFigures, err error) {
	if err := c.StartMasters(ctx); err != nil {
		return f, err
	}
	progress("%d agents, baseline: registering", n)
	if err := registerAll(ctx, c.Client(), n, o.mesh, false); err != nil {
		return f, err
	}
	h := c.Host(1)
	if err := c.StartAgent(h); err != nil {
		return f, err
	}
	progress("%d agents, baseline: waiting for its agent to program them", n)
	if err := waitProgrammed(ctx, c, h, n); err != nil {
		return f, err
	}
	progress("%d agents, baseline: idle CPU (%s settle, %s window)", n, o.settle, o.window)
	if f.idle, err = idleCPU(ctx, h.Agent.PID(), o.settle, o.window); err != nil {
		return f, err
	}
	progress("%d agents, baseline: registration to programmed", n)
	f.register, _, err = registerToProgrammedMedian(ctx, c, c.Client(), h, n, o.mesh, false)
	return f, err
}
