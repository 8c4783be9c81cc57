package containerdlab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
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

// critestCgroups matches the cgroups of critest's pods. critest gives its
// pods the cgroup parent /test.slice when the runtime does not say which
// cgroup driver it uses (common.GetCgroupParent: containerd 1.6 has no
// RuntimeConfig); containerd, seeing a .slice, names each pod's cgroup in
// systemd's form, test.slice:cri-containerd:<id>, which runc's cgroupfs
// driver makes at the top of each hierarchy (outside the lab's parent),
// and removes when the pod is removed.
const critestCgroups = "test.slice:cri-containerd:*"

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

// RemoveCritestCgroupsAtCleanup removes, when t's cleanup runs, the
// cgroups of critest's pods that runc left (a pod removal that failed):
// every hierarchy's test.slice:cri-containerd:* that is empty (rmdir
// refuses a cgroup that has processes). Call it before Start, so that it
// runs after the containerd's cleanup has removed the pods.
func RemoveCritestCgroupsAtCleanup(t testing.TB) {
	t.Helper()
	t.Cleanup(func() {
		v1, _ := filepath.Glob("/sys/fs/cgroup/*/" + critestCgroups)
		v2, _ := filepath.Glob("/sys/fs/cgroup/" + critestCgroups)
		var errs []error
		for _, m := range append(v1, v2...) {
			t.Logf("containerdlab: removing %s, a cgroup of a critest pod runc left", m)
			if err := syscall.Rmdir(m); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", m, err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			t.Errorf("containerdlab: %v", err)
		}
	})
}
