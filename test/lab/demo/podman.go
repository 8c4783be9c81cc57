package demo

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/podmanlab"
)

// podmanContainer runs a Podman 4 container (CNI backend, this machine's
// podman) on host 1 on the network named after the overlay, which Podman
// finds in the agent's conflist directory, and pings a CNI container of
// another host from it. Without Podman here it says so and the demo goes
// on. The container and Podman's processes are removed before it returns.
func podmanContainer(ctx context.Context, out io.Writer, c *labcluster.Cluster, dir string) error {
	if len(c.Hosts()) < 2 {
		return nil
	}
	h := c.Host(1)
	var target *labcluster.Container
	for _, ct := range c.Containers() {
		if ct.Host != h {
			target = ct
			break
		}
	}
	if target == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pm, err := podmanlab.Start(h.NS, podmanlab.Options{Dir: dir, CNIConfDir: h.CNIConfDir(), CNIPluginDirs: c.CNIPath()})
	if err != nil {
		fmt.Fprintf(out, "\n== Podman: cannot run here (%v); the demo goes on without it\n", err)
		return nil
	}
	defer func() {
		if err := pm.Close(); err != nil {
			fmt.Fprintf(out, "warning: removing the Podman container: %v\n", err)
		}
	}()
	fmt.Fprintf(out, "\n== a Podman 4 container (CNI backend) on %s: `podman run --network carve` finds the network by name\n", h.Name)
	fmt.Fprintf(out, "   in the agent's %s; libcni 1.1 reads it because the agent chose its spec version at start\n", h.CNIConfDir())
	id, err := pm.Run(ctx, "demo", "carve", "")
	if err != nil {
		return err
	}
	ip, err := pm.IP(ctx, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   container %.12s: %s\n", id, ip)
	b, code, err := pm.Exec(ctx, id, "ping", "-c", "1", "-W", "3", target.Addr.Addr().String())
	if err != nil || code != 0 {
		return fmt.Errorf("ping %s (%s on %s) from the Podman container: exit %d, %v: %s", target.Addr.Addr(), target.Name, target.Host.Name, code, err, b)
	}
	fmt.Fprintf(out, "   ping from it to %s (%s on %s): ok\n", target.Addr.Addr(), target.Name, target.Host.Name)
	return pm.Remove(ctx, id)
}
