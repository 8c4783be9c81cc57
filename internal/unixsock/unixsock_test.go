package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/carve-net/carve/test/lab/testutil"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "a.sock")
	ln, err := Listen(path, os.Getgid())
	if err != nil {
		t.Fatalf("fresh socket: %v", err)
	}
	// A socket somebody serves is refused.
	if _, err := Listen(path, os.Getgid()); err == nil || !strings.Contains(err.Error(), "served by another process") {
		t.Errorf("live socket: %v", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket file after Close: %v, want it removed", err)
	}
	// Leave a stale one behind the way a crash does.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	ln2, err := Listen(path, os.Getgid())
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln2.Close()
	// A regular file in the way is never removed.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file, os.Getgid()); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file: %v", err)
	}
}

// TestListenPermissions: the socket is mode 0660 in the group asked for,
// whatever the umask (0 here, which would make a plain bind world-writable),
// it answers, and nothing of its creation is left beside it.
func TestListenPermissions(t *testing.T) {
	testutil.Require(t, os.Getuid() == 0, "giving a file a group one is not in needs root")
	const gid = 12345 // no /etc/group entry needed: a numeric id is enough
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.sock")
	ln, err := Listen(path, gid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with mode 0660", fi.Mode())
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 0 || st.Gid != gid {
		t.Errorf("socket owned by %d:%d, want 0:%d", st.Uid, st.Gid, gid)
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the socket at its final path: %v", err)
	}
	c.Close()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "agent.sock" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only agent.sock", names)
	}
}

func TestLookupGroup(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr string
	}{
		{"0", 0, ""},
		{"12345", 12345, ""},
		{"root", 0, ""},
		{"-1", 0, "negative"},
		{"", 0, "empty group"},
		{"no-such-carve-group", 0, "no-such-carve-group"},
	}
	for _, tt := range tests {
		got, err := LookupGroup(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("LookupGroup(%q) = %d, %v; want an error naming %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("LookupGroup(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestListenNegativeGroup(t *testing.T) {
	if _, err := Listen(filepath.Join(t.TempDir(), "a.sock"), -1); err == nil {
		t.Fatal("negative group id accepted")
	}
}
