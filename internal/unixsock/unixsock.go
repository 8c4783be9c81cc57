// Package unixsock listens on unix sockets the way a daemon that may have
// crashed must: a stale socket file left behind is replaced, one that another
// process still serves is refused.
package unixsock

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Listen listens on path, creating its directory. The socket is made
// group-accessible (0660), as CNI plugins and Docker run as root or a group.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Dir(path), err)
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
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
