// Package enginelab holds what the lab's container engines (dockerlab,
// containerdlab, podmanlab) share: finding their programs, the static
// busybox their containers run (as an image layer or a root directory), the
// private mount namespace an engine runs in, the reason a daemon gives in
// its log for failing, and the sweep of the processes, cgroups and
// directory an engine leaves behind when it stops.
package enginelab

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// LookPaths finds programs on PATH; the error of a missing one says to
// install pkg (a Debian package).
func LookPaths(pkg string, names ...string) (map[string]string, error) {
	bins := map[string]string{}
	for _, b := range names {
		p, err := exec.LookPath(b)
		if err != nil {
			return nil, fmt.Errorf("%s not found (install Debian's %s): %w", b, pkg, err)
		}
		bins[b] = p
	}
	return bins, nil
}

// DaemonError is the reason a daemon gives in its log for failing: its last
// fatal or error line, else its last line.
func DaemonError(log string) string {
	data, _ := os.ReadFile(log)
	var last string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "level=fatal") || strings.Contains(l, "level=error") || strings.HasPrefix(l, "failed to start daemon") {
			last = l
		}
	}
	if last == "" {
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		last = lines[len(lines)-1]
	}
	return last
}
