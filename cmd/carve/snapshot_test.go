package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-net/carve/pki"
)

func snapshotCmd(ctx context.Context, args []string, out *bytes.Buffer) error {
	return runSnapshot(ctx, args, out)
}

// TestSnapshotCommands: carve snapshot save writes a snapshot that carve
// snapshot restore puts back (FILE before or after the flags); an agent's
// certificate may do neither; what is not a snapshot is refused before
// the masters are asked.
func TestSnapshotCommands(t *testing.T) {
	m := secureMaster(t)
	registerAgents(t, m, map[string]string{"h1": "198.18.0.11"})
	op := clientFlags(m, "op", pki.RoleOperator)
	file := filepath.Join(t.TempDir(), "carve.json")
	out, code, err := run(t, snapshotCmd, append([]string{"save", file}, op...)...)
	if code != 0 || !strings.Contains(out, "state index") || !strings.Contains(out, "1 agents") {
		t.Fatalf("save: exit %d (%v): %s", code, err, out)
	}
	out, code, err = run(t, snapshotCmd, append(append([]string{"restore"}, op...), file)...)
	if code != 0 || !strings.Contains(out, "restore epoch") {
		t.Fatalf("restore: exit %d (%v): %s", code, err, out)
	}
	agent := clientFlags(m, "h1", pki.RoleAgent)
	if _, code, err := run(t, snapshotCmd, append([]string{"save", file + ".2"}, agent...)...); code != 1 || !strings.Contains(err.Error(), "HTTP 403") {
		t.Errorf("save with an agent's certificate: exit %d, %v; want 1 and a 403", code, err)
	}
	if _, err := os.Stat(file + ".2"); !os.IsNotExist(err) {
		t.Errorf("a refused save left a file: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"format":3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"restore", bad}, op...), "holds no network configuration"},
		{append([]string{"restore", file + ".missing"}, op...), "no such file"},
		{append([]string{"save"}, op...), "needs the snapshot FILE"},
		{append([]string{"save", file, file}, op...), "takes one FILE"},
		{[]string{"load", file}, `"load": unknown subcommand`},
	} {
		if _, code, err := run(t, snapshotCmd, tc.args...); code != 2 || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("snapshot %q: exit %d, %v; want 2 and %q", tc.args, code, err, tc.want)
		}
	}
}
