package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/atomicfile"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/master/state"
)

const snapshotUsage = `usage:
  carve snapshot save FILE    --masters URL[,URL...] [--timeout 1m] OPERATOR_TLS
  carve snapshot restore FILE --masters URL[,URL...] [--timeout 1m] OPERATOR_TLS

save writes the lease table as the leader holds it (after a read barrier: every
write acknowledged before is in it). restore replaces the running cluster's table
with FILE, as one command of the log: every master applies it, and agents follow
it (a signed restore epoch) without a restart. To restore onto masters whose data
directories are lost, start them on empty ones with --restore-from FILE instead
(docs/operations.md, "9a. Backing up and restoring the masters").
`

func runSnapshot(ctx context.Context, args []string, out io.Writer) error {
	return cli.Subcommand("carve snapshot", snapshotUsage, args, out, map[string]func([]string) error{
		"save":    func(args []string) error { return runSnapshotSave(ctx, args, out) },
		"restore": func(args []string) error { return runSnapshotRestore(ctx, args, out) },
	})
}

// snapshotFlags parses a snapshot subcommand's FILE and flags, in any
// order, and returns FILE, a client for the masters and the timeout.
func snapshotFlags(name string, args []string) (string, *apiclient.Client, time.Duration, error) {
	fs := cli.NewFlagSet(name)
	t := fs.Duration("timeout", time.Minute, "how long to wait for the masters")
	mf := opclient.AddMasterFlags(fs, "a certificate of role operator (carve certs issue --role operator --name NAME)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), snapshotUsage); fs.PrintDefaults() }
	files, err := cli.ParseOperands(fs, args)
	if err != nil {
		return "", nil, 0, err
	}
	switch {
	case len(files) == 0:
		return "", nil, 0, fmt.Errorf("%w: %s needs the snapshot FILE\n%s", cli.ErrUsage, name, snapshotUsage)
	case len(files) > 1:
		return "", nil, 0, fmt.Errorf("%w: %s takes one FILE, not %q", cli.ErrUsage, name, files)
	case *t <= 0:
		return "", nil, 0, fmt.Errorf("%w: --timeout %s: want a positive duration", cli.ErrUsage, *t)
	}
	client, _, err := mf.Client()
	if err != nil {
		return "", nil, 0, err
	}
	return files[0], client, *t, nil
}

func runSnapshotSave(ctx context.Context, args []string, out io.Writer) error {
	file, client, timeout, err := snapshotFlags("carve snapshot save", args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	data, err := client.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("read the snapshot: %w", err)
	}
	info, err := state.CheckSnapshot(data)
	if err != nil {
		return fmt.Errorf("the masters answered a snapshot this carve cannot restore: %w", err)
	}
	// FILE is whole or untouched.
	if err := atomicfile.Write(file, data, 0o600); err != nil {
		return fmt.Errorf("write the snapshot: %w", err)
	}
	fmt.Fprintf(out, "saved %s: cluster %s, state index %d, %d agents\n", file, cli.OrDash(info.ClusterID), info.StateIndex, info.Agents)
	return nil
}

func runSnapshotRestore(ctx context.Context, args []string, out io.Writer) error {
	file, client, timeout, err := snapshotFlags("carve snapshot restore", args)
	if err != nil {
		return err
	}
	data, err := readSnapshot(file)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := client.RestoreSnapshot(ctx, data)
	if err != nil {
		return fmt.Errorf("restore %s: %w", file, err)
	}
	fmt.Fprintf(out, "restored %s (state index %d) at index %d, restore epoch %d: agents follow it without a restart\n", file, r.From, r.Index, r.Epoch)
	return nil
}

// readSnapshot reads and checks a snapshot file (carve snapshot save's).
func readSnapshot(file string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: read the snapshot: %v", cli.ErrUsage, err)
	}
	if _, err := state.CheckSnapshot(data); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", cli.ErrUsage, file, err)
	}
	return data, nil
}
