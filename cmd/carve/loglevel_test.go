package main

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestLogLevelAtRunTime: issue 20, finding 7. An operator reads and sets a
// running master's log level with carve log-level; other roles and bad
// levels are refused.
func TestLogLevelAtRunTime(t *testing.T) {
	var logs testutil.Logs
	level := new(slog.LevelVar)
	m := mastertest.StartSecure(t, filepath.Join(t.TempDir(), "m1"), netconfig.Default(), logs.Logger(),
		func(o *master.Options) { o.LogLevel = level })
	as := func(name string, role pki.Role) []string {
		f := m.CA.Files(name, role)
		return []string{"--url", "https://" + m.HTTPAddr(), "--ca-file", f.CA, "--cert-file", f.Cert, "--key-file", f.Key}
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantOut  string
		wantCode int
		wantErr  string
		want     slog.Level
	}{
		{"read", as("alice", pki.RoleOperator), "info\n", 0, "", slog.LevelInfo},
		{"set debug", append(as("alice", pki.RoleOperator), "--level", "debug"), "debug\n", 0, "", slog.LevelDebug},
		{"read back", as("alice", pki.RoleOperator), "debug\n", 0, "", slog.LevelDebug},
		{"an agent may not", append(as("h1", pki.RoleAgent), "--level", "error"), "", 1, "may not PUT /log-level", slog.LevelDebug},
		{"bad level", append(as("alice", pki.RoleOperator), "--level", "loud"), "", 2, `--level: log level "loud": want debug, info, warn or error`, slog.LevelDebug},
		{"set warn", append(as("alice", pki.RoleOperator), "--level", "WARN"), "warn\n", 0, "", slog.LevelWarn},
		{"bad url", []string{"--url", "198.18.0.1:8080", "--insecure"}, "", 2, "want the API URL", slog.LevelWarn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code, err := run(t, logLevelCmd, tc.args...)
			if out != tc.wantOut || code != tc.wantCode || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("output %q, exit %d, error %v; want %q, %d, %q", out, code, err, tc.wantOut, tc.wantCode, tc.wantErr)
			}
			if got := level.Level(); got != tc.want {
				t.Errorf("the master's level is %s, want %s", got, tc.want)
			}
		})
	}
	if !logs.Has(slog.LevelWarn, "log level changed") {
		t.Error("the change is not logged at WARN")
	}
}

func logLevelCmd(ctx context.Context, args []string, out *bytes.Buffer) error {
	return runLogLevel(ctx, args, out)
}
