package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/internal/cli"
)

func TestRunRefusesBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--hosts", "0"}, "--hosts 0: want 1-50"},
		{[]string{"--hosts", "51"}, "--hosts 51: want 1-50"},
		{[]string{"--containers", "-1"}, "--containers -1: want 0-50"},
		{[]string{"--containers", "51"}, "--containers 51: want 0-50"},
	}
	for _, tc := range tests {
		err := run(context.Background(), tc.args)
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v; want a usage error with %q", tc.args, err, tc.want)
		}
	}
}

func TestRogueRefusesBadFlags(t *testing.T) {
	msg := filepath.Join(t.TempDir(), "message.json")
	if err := os.WriteFile(msg, []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ok := []string{"--mesh-addr", "127.0.0.1:0", "--peers", "127.0.0.1:6783", "--message", msg}
	tests := []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"--mesh-addr", "nohost", "--peers", "127.0.0.1:6783", "--message", msg}, `--mesh-addr "nohost"`, true},
		{[]string{"--mesh-addr", "127.0.0.1:0", "--peers", "127.0.0.1", "--message", msg}, `--peers: "127.0.0.1" is not IP:PORT`, true},
		{append(slices.Clone(ok), "--interval", "0s"), "--interval 0s", true},
		{append(slices.Clone(ok), "--count", "-1"), "--count -1", true},
		{[]string{"--mesh-addr", "127.0.0.1:0", "--peers", "127.0.0.1:6783", "--message", msg + ".absent"}, "--message", false},
		{append(slices.Clone(ok), "--mesh-password-file", msg+".absent"), "--mesh-password-file", false},
	}
	for _, tc := range tests {
		err := runRogue(context.Background(), tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, cli.ErrUsage) != tc.usage {
			t.Errorf("rogue-gossip %q = %v; want an error with %q (usage %v)", tc.args, err, tc.want, tc.usage)
		}
	}
}
