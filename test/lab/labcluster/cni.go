package labcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// Containers are attached the way a CNI runtime attaches them: libcni loads
// the conflist the host's agent wrote and runs the reference bridge plugin,
// which runs carve-ipam, which asks the agent over its unix socket. libcni is
// always called from inside the host namespace: the plugins it forks inherit
// that namespace, so the veths, the bridge plugin's sysctls and portmap's
// rules land in the host, never in the namespace the harness runs in. The
// container's own namespace is entered by the bridge plugin through
// CNI_NETNS.

// DefaultIfName is the container interface CNI attachments get.
const DefaultIfName = "eth0"

// SocketPath is the agent's --socket, its IPAM service.
func (h *Host) SocketPath() string { return filepath.Join(h.Dir, "agent.sock") }

// CNIConfDir is the agent's --cni-conf-dir, where it writes
// <overlay>.conflist.
func (h *Host) CNIConfDir() string { return filepath.Join(h.Dir, "cni") }

// MesosCNIConfDir is the agent's --mesos-cni-conf-dir, where it writes the
// single-plugin <overlay>.conf of the Mesos CNI isolator.
func (h *Host) MesosCNIConfDir() string { return filepath.Join(h.Dir, "mesos-cni") }

// CNICacheDir is the host's libcni cache: the results of ADDs, which GC
// reads and the agent (--cni-cache-dir) reclaims addresses from.
func (h *Host) CNICacheDir() string { return filepath.Join(h.Dir, "cni-cache") }

// newCNIRuntime gives h its libcni runtime. The exec is explicit: with nil,
// libcni sets its default lazily on every call, a data race when calls run
// concurrently. The plugins' stderr goes to logs/cni-<host>.log.
func (c *Cluster) newCNIRuntime(h *Host) error {
	f, err := os.OpenFile(filepath.Join(c.Dir, "logs", "cni-"+h.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("labcluster: CNI log of %s: %w", h.Name, err)
	}
	h.cniLog = f
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: f}, PluginDecoder: version.PluginDecoder{}}
	h.cni = libcni.NewCNIConfigWithCacheDir(c.opts.CNIPath, h.CNICacheDir(), exec)
	return nil
}

// IPAMClient returns a client of h's agent's IPAM socket (a unix socket in
// the lab directory: no network traffic).
func (c *Cluster) IPAMClient(h *Host) *api.IPAMClient {
	return api.NewIPAMClient(h.SocketPath(), 10*time.Second)
}

// Conflist loads the network configuration list h's agent wrote for overlay,
// as a runtime finds it: by network name in the agent's --cni-conf-dir.
func (c *Cluster) Conflist(h *Host, overlay string) (*libcni.NetworkConfigList, error) {
	if len(c.opts.CNIPath) == 0 {
		return nil, errors.New("labcluster: no CNI plugins: set Options.CNIPath (BuildCNIPlugins)")
	}
	list, err := libcni.LoadNetworkConf(h.CNIConfDir(), overlay)
	if err != nil {
		return nil, fmt.Errorf("labcluster: the conflist of %s on %s (has the agent written %s?): %w",
			overlay, h.Name, netconf.ConflistPath(h.CNIConfDir(), "", overlay), err)
	}
	return list, nil
}

// CNIOptions name a container's CNI attachment.
type CNIOptions struct {
	// ContainerID is CNI_CONTAINERID (default: the container's name, which
	// is unique in the cluster).
	ContainerID string
	// IfName is CNI_IFNAME (default DefaultIfName).
	IfName string
}

// NewContainer creates an empty container namespace on h, meant for
// overlay, without attaching it: CNIAdd does. Most callers want
// AddCNIContainer; this one lets a caller create namespaces first and then
// run many ADDs at once.
func (c *Cluster) NewContainer(h *Host, overlay string, opts CNIOptions) (*Container, error) {
	c.mu.Lock()
	c.seq++
	name := "h" + strconv.Itoa(h.Index) + "c" + strconv.Itoa(c.seq)
	c.mu.Unlock()
	n, err := c.Lab.AddNamespace(name)
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	ct := &Container{
		NS:          &netnslab.Container{Namespace: n, Host: h.NS, Config: netnslab.ContainerConfig{Bridge: netconf.MesosBridge(overlay)}},
		Host:        h,
		Overlay:     overlay,
		ContainerID: opts.ContainerID,
		IfName:      opts.IfName,
		Name:        name,
	}
	if ct.ContainerID == "" {
		ct.ContainerID = name
	}
	if ct.IfName == "" {
		ct.IfName = DefaultIfName
	}
	return ct, nil
}

// AddCNIContainer creates a container namespace on h and attaches it to
// overlay through CNI ADD with the conflist h's agent wrote (NewContainer,
// then CNIAdd). The address comes from the ADD's result. When the ADD fails
// the container is returned with the error, attached to nothing, so that the
// caller can DEL it or retry the ADD, as a runtime would.
func (c *Cluster) AddCNIContainer(ctx context.Context, h *Host, overlay string, opts CNIOptions) (*Container, error) {
	ct, err := c.NewContainer(h, overlay, opts)
	if err != nil {
		return nil, err
	}
	return ct, c.CNIAdd(ctx, ct)
}

// runtimeConf is the container's attachment as libcni names it.
func (ct *Container) runtimeConf() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: ct.ContainerID, IfName: ct.IfName, NetNS: ct.NS.Path}
}

// Attachment is the container's CNI attachment, as GC's valid list names it.
func (ct *Container) Attachment() types.GCAttachment {
	return types.GCAttachment{ContainerID: ct.ContainerID, IfName: ct.IfName}
}

// CNIAdd runs CNI ADD for ct (its first, or a retry) from inside its host's
// namespace, and on success records the address, gateway and host veth of
// the result and lists ct among Containers. Errors carry the plugin's CNI
// error (see CNICode).
func (c *Cluster) CNIAdd(ctx context.Context, ct *Container) error {
	h := ct.Host
	list, err := c.Conflist(h, ct.Overlay)
	if err != nil {
		return err
	}
	var raw types.Result
	err = h.NS.Do(func() error {
		var err error
		raw, err = h.cni.AddNetworkList(ctx, list, ct.runtimeConf())
		return err
	})
	if err != nil {
		return fmt.Errorf("labcluster: CNI ADD %s/%s on %s: %w", ct.ContainerID, ct.IfName, h.Name, err)
	}
	res, err := types100.NewResultFromResult(raw)
	if err != nil {
		return fmt.Errorf("labcluster: CNI ADD %s/%s on %s: result: %w", ct.ContainerID, ct.IfName, h.Name, err)
	}
	addr, gw, hostLink, err := parseResult(res, ct.NS.Path, ct.NS.Config.Bridge)
	if err != nil {
		return fmt.Errorf("labcluster: CNI ADD %s/%s on %s: %w", ct.ContainerID, ct.IfName, h.Name, err)
	}
	c.mu.Lock()
	ct.Addr, ct.Gateway, ct.Result = addr, gw, res
	ct.NS.HostLink = hostLink
	ct.NS.Config.Address, ct.NS.Config.Gateway = addr, gw
	if !containsContainer(c.containers, ct) {
		c.containers = append(c.containers, ct)
	}
	c.mu.Unlock()
	c.log.Info("container attached through CNI", "name", ct.Name, "host", h.Name, "container_id", ct.ContainerID, "addr", addr)
	return nil
}

func containsContainer(cs []*Container, ct *Container) bool {
	for _, x := range cs {
		if x == ct {
			return true
		}
	}
	return false
}

// parseResult takes the IPv4 address and gateway of a result, and the host
// end of the veth (the interface outside any sandbox that is not the bridge).
func parseResult(res *types100.Result, sandbox, bridge string) (addr netip.Prefix, gw netip.Addr, hostLink string, err error) {
	for _, ipc := range res.IPs {
		a, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok || !a.Unmap().Is4() {
			continue
		}
		ones, _ := ipc.Address.Mask.Size()
		addr = netip.PrefixFrom(a.Unmap(), ones)
		if g, ok := netip.AddrFromSlice(ipc.Gateway); ok {
			gw = g.Unmap()
		}
		break
	}
	if !addr.IsValid() {
		return addr, gw, "", fmt.Errorf("result without an IPv4 address: %v", res.IPs)
	}
	for _, i := range res.Interfaces {
		if i.Sandbox == "" && i.Name != bridge {
			hostLink = i.Name
		}
	}
	return addr, gw, hostLink, nil
}

// CheckCNIContainer runs CNI CHECK for ct (libcni supplies the cached ADD
// result as prevResult).
func (c *Cluster) CheckCNIContainer(ctx context.Context, ct *Container) error {
	h := ct.Host
	list, err := c.Conflist(h, ct.Overlay)
	if err != nil {
		return err
	}
	err = h.NS.Do(func() error { return h.cni.CheckNetworkList(ctx, list, ct.runtimeConf()) })
	if err != nil {
		return fmt.Errorf("labcluster: CNI CHECK %s/%s on %s: %w", ct.ContainerID, ct.IfName, h.Name, err)
	}
	return nil
}

// DelCNIContainer runs CNI DEL for ct. On success ct leaves Containers; its
// namespace stays until Close, so DEL may be repeated (it must succeed).
func (c *Cluster) DelCNIContainer(ctx context.Context, ct *Container) error {
	h := ct.Host
	list, err := c.Conflist(h, ct.Overlay)
	if err != nil {
		return err
	}
	err = h.NS.Do(func() error { return h.cni.DelNetworkList(ctx, list, ct.runtimeConf()) })
	if err != nil {
		return fmt.Errorf("labcluster: CNI DEL %s/%s on %s: %w", ct.ContainerID, ct.IfName, h.Name, err)
	}
	c.mu.Lock()
	for i, x := range c.containers {
		if x == ct {
			c.containers = append(c.containers[:i:i], c.containers[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	c.log.Info("container detached through CNI", "name", ct.Name, "host", h.Name, "container_id", ct.ContainerID)
	return nil
}

// GCNetwork runs CNI GC (libcni's GCNetworkList) on h with the agent's
// conflist for overlay and the runtime's live attachments: libcni DELs every
// attachment in h's cache that is not valid, then sends GC, with
// cni.dev/valid-attachments, to every plugin of the list. The reference
// bridge plugin (v1.9.1) does not pass GC on to its IPAM plugin, so an
// allocation libcni never cached (an ADD whose answer was lost) survives
// this; GCIPAM reaches carve-ipam's GC. The containers of h on overlay that
// are not valid leave Containers.
func (c *Cluster) GCNetwork(ctx context.Context, h *Host, overlay string, valid []types.GCAttachment) error {
	list, err := c.Conflist(h, overlay)
	if err != nil {
		return err
	}
	if err := c.gc(ctx, h, list, valid); err != nil {
		return err
	}
	keep := map[types.GCAttachment]bool{}
	for _, v := range valid {
		keep[v] = true
	}
	c.mu.Lock()
	c.containers = slices.DeleteFunc(c.containers, func(ct *Container) bool {
		return ct.Host == h && ct.Overlay == overlay && !keep[ct.Attachment()]
	})
	c.mu.Unlock()
	return nil
}

// GCIPAM runs CNI GC through a list that names carve-ipam directly, with the
// ipam section of the agent's conflist (the same socket and network), so
// that carve-ipam's GC releases every allocation of the overlay's mesos
// bridge that is not valid. The list has its own name, which no cached
// attachment carries: libcni DELs nothing on the way.
func (c *Cluster) GCIPAM(ctx context.Context, h *Host, overlay string, valid []types.GCAttachment) error {
	list, err := c.Conflist(h, overlay)
	if err != nil {
		return err
	}
	var ipam json.RawMessage
	for _, p := range list.Plugins {
		var conf struct {
			IPAM json.RawMessage `json:"ipam"`
		}
		if err := json.Unmarshal(p.Bytes, &conf); err == nil && conf.IPAM != nil {
			ipam = conf.IPAM
			break
		}
	}
	if ipam == nil {
		return fmt.Errorf("labcluster: the conflist of %s on %s has no ipam section", overlay, h.Name)
	}
	doc, err := json.Marshal(map[string]any{
		"cniVersion": list.CNIVersion,
		"name":       overlay + "-ipam-gc",
		"plugins":    []any{map[string]any{"type": netconf.PluginType, "ipam": ipam}},
	})
	if err != nil {
		return err
	}
	direct, err := libcni.NetworkConfFromBytes(doc)
	if err != nil {
		return fmt.Errorf("labcluster: carve-ipam GC list: %w", err)
	}
	return c.gc(ctx, h, direct, valid)
}

func (c *Cluster) gc(ctx context.Context, h *Host, list *libcni.NetworkConfigList, valid []types.GCAttachment) error {
	args := &libcni.GCArgs{ValidAttachments: append([]types.GCAttachment{}, valid...)}
	err := h.NS.Do(func() error { return h.cni.GCNetworkList(ctx, list, args) })
	if err != nil {
		return fmt.Errorf("labcluster: CNI GC of %s on %s: %w", list.Name, h.Name, err)
	}
	return nil
}

// CNICode is the CNI error code carried by err (0 when none): 11 is "try
// again later".
func CNICode(err error) uint {
	var ce *types.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return 0
}

// AttachedOn lists the attached containers of h on overlay.
func (c *Cluster) AttachedOn(h *Host, overlay string) []*Container {
	var out []*Container
	for _, ct := range c.Containers() {
		if ct.Host == h && ct.Overlay == overlay {
			out = append(out, ct)
		}
	}
	return out
}

// CNIPath is the directories of the plugins the cluster's attachments run
// (Options.CNIPath).
func (c *Cluster) CNIPath() []string { return c.opts.CNIPath }
