package containerdlab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/carve-net/carve/test/lab/enginelab"
)

// The images critest v1.34 (sigs.k8s.io/cri-tools, the version go.mod
// pins) runs in its Networking, PodSandbox and port forward specs, by the
// names it asks for. Before it creates a container, critest asks the CRI for the image's
// status and pulls only when the image is missing, so these, imported
// under those names, are never pulled: no registry is reachable from a lab.
const (
	// CritestBusyboxImage is framework.DefaultLinuxContainerImage: every
	// spec's default container (sh -c top; it execs cat, hostname).
	CritestBusyboxImage = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
	// CritestWebServerImage is validate's webServerLinuxImage: the port
	// mapping specs GET / on port 80 and want 200.
	CritestWebServerImage = "registry.k8s.io/e2e-test-images/nginx:1.14-2"
	// CritestHostNetWebServerImage is validate's hostNetWebServerLinuxImage
	// (critest adds :latest): the host network port forward spec GETs /
	// on port 12003 and wants 200.
	CritestHostNetWebServerImage = "gcr.io/k8s-staging-cri-tools/hostnet-nginx-" + runtime.GOARCH + ":latest"
)

// CritestCgroupParent is the cgroup parent critest gives its pods when the
// runtime does not say which cgroup driver it uses (common.GetCgroupParent:
// containerd 1.6 has no RuntimeConfig): the systemd slice kubepods.slice,
// which the cgroupfs driver of the lab's containerd takes as a path below
// each hierarchy's root.
const CritestCgroupParent = "kubepods.slice"

// ImportCritestImages builds CritestBusyboxImage, CritestWebServerImage
// and CritestHostNetWebServerImage from the static busybox (every applet
// linked, /etc and /tmp present) and imports them into the CRI's
// namespace. The web servers are busybox's httpd in the foreground on
// port 80 (12003 for the host network one), serving /www, whose
// index.html answers GET /.
func (c *Containerd) ImportCritestImages(ctx context.Context) error {
	applets, err := enginelab.BusyboxApplets(ctx, c.opts.Busybox)
	if err != nil {
		return fmt.Errorf("containerdlab: %w", err)
	}
	images := []struct {
		file, name string
		dirs       []string
		files      map[string]string
		config     map[string]any
	}{
		{"critest-busybox", CritestBusyboxImage, []string{"etc", "tmp"}, nil,
			map[string]any{"Cmd": []string{"sh"}, "WorkingDir": "/"}},
		{"critest-webserver", CritestWebServerImage, []string{"etc", "tmp", "www"},
			map[string]string{"www/index.html": "<html><body>carve lab web server</body></html>\n"},
			map[string]any{"Entrypoint": []string{"/bin/httpd", "-f", "-p", "80", "-h", "/www"}, "WorkingDir": "/"}},
		{"critest-hostnet-webserver", CritestHostNetWebServerImage, []string{"etc", "tmp", "www"},
			map[string]string{"www/index.html": "<html><body>carve lab host network web server</body></html>\n"},
			map[string]any{"Entrypoint": []string{"/bin/httpd", "-f", "-p", "12003", "-h", "/www"}, "WorkingDir": "/"}},
	}
	for _, img := range images {
		layer, err := enginelab.BusyboxLayer(c.opts.Busybox, applets, img.dirs, img.files)
		if err != nil {
			return fmt.Errorf("containerdlab: %s: %w", img.name, err)
		}
		archive, err := imageArchive(img.name, layer, img.config)
		if err != nil {
			return fmt.Errorf("containerdlab: %s: %w", img.name, err)
		}
		if err := c.importArchive(ctx, img.file, archive); err != nil {
			return err
		}
	}
	return nil
}

// RemoveCritestCgroupsAtCleanup removes CritestCgroupParent from every
// cgroup hierarchy when t's cleanup runs, if it is absent now: critest's
// pods made it, and runc removes only the pods' own cgroups below it. Call
// it before Start, so that it runs after the containerd's cleanup. When
// the machine has it already (a kubelet of its own), it is left alone.
func RemoveCritestCgroupsAtCleanup(t testing.TB) {
	t.Helper()
	matches, _ := filepath.Glob("/sys/fs/cgroup/*/" + CritestCgroupParent)
	if _, err := os.Stat("/sys/fs/cgroup/" + CritestCgroupParent); err == nil || len(matches) > 0 {
		t.Logf("containerdlab: %s exists on this machine; critest's pods go below it and it is left alone", CritestCgroupParent)
		return
	}
	t.Cleanup(func() {
		v1, _ := filepath.Glob("/sys/fs/cgroup/*/" + CritestCgroupParent)
		v2, _ := filepath.Glob("/sys/fs/cgroup/" + CritestCgroupParent)
		if matches := append(v1, v2...); len(matches) > 0 {
			t.Logf("containerdlab: removing %s, which critest's pods made", strings.Join(matches, " "))
		}
		if err := enginelab.RemoveCgroups(CritestCgroupParent); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("containerdlab: %v", err)
		}
	})
}
