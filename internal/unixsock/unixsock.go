// Package unixsock listens on unix sockets the way a daemon that may have
// crashed must: a stale socket file left behind is replaced, one that another
// process still serves is refused. Sockets are never world-writable: they
// appear at their path already mode 0660 and in their group.
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"
)

// Mode is the permission of every socket Listen creates: the owner (root)
// and the socket's group may connect, nobody else.
const Mode os.FileMode = 0o660

// Listen listens on path, creating its directory. The socket is mode 0660,
// owned by the process's user (root for the agent) and by group gid, so that
// CNI plugins and Docker reach it as root or through that group and nobody
// else does. It is bound in a private directory beside path, given its mode
// and group there, and renamed into place: whatever the umask, it is never
// reachable at path with other permissions. Closing the listener removes the
// socket file (if it is still the one Listen created).
func Listen(path string, gid int) (net.Listener, error) {
	if gid < 0 {
		return nil, fmt.Errorf("socket %s: group id %d is negative", path, gid)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s is served by another process (another carve agent running?)", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	// A short private name: unix socket paths are limited to 107 bytes.
	private, err := os.MkdirTemp(dir, ".s")
	if err != nil {
		return nil, fmt.Errorf("socket %s: private directory: %w", path, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// The file moves to path: Close removes it there, not at tmp.
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ln.Close()
		return nil, err
	}
	if err := os.Chmod(tmp, Mode); err != nil {
		return fail(fmt.Errorf("socket %s: chmod: %w", path, err))
	}
	if err := os.Lchown(tmp, -1, gid); err != nil {
		return fail(fmt.Errorf("socket %s: give it group %d: %w", path, gid, err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("socket %s: move into place: %w", path, err))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("socket %s: %w", path, err))
	}
	return &listener{UnixListener: ln, path: path, file: fi}, nil
}

// listener removes its socket file on Close, unless another process has
// put its own socket there meanwhile.
type listener struct {
	*net.UnixListener
	path string
	file os.FileInfo
}

func (l *listener) Close() error {
	err := l.UnixListener.Close()
	if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.file) {
		if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

// LookupGroup resolves a --socket-group value: a numeric group id, or a
// group name from the system's group database.
func LookupGroup(s string) (int, error) {
	if s == "" {
		return 0, errors.New("empty group: want a group name or a numeric group id")
	}
	if gid, err := strconv.Atoi(s); err == nil {
		if gid < 0 {
			return 0, fmt.Errorf("group id %d is negative", gid)
		}
		return gid, nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", s, err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("group %q has a non-numeric id %q", s, g.Gid)
	}
	return gid, nil
}
