package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "a.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatalf("fresh socket: %v", err)
	}
	// CNI plugins and Docker reach it as root or through the group.
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket file mode %v; want a socket with mode 0660", fi.Mode())
	}
	// A socket somebody serves is refused.
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "served by another process") {
		t.Errorf("live socket: %v", err)
	}
	ln.Close()
	// Go removes the file on Close; leave a stale one behind the way a crash does.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	ln2, err := Listen(path)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln2.Close()
	// A regular file in the way is never removed.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file: %v", err)
	}
}
