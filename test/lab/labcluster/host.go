package labcluster

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// Host is one host namespace with its agent and, for hosts 1..Masters, a
// master.
type Host struct {
	// NS is the lab host. NS.IP is the address it was created with; IP()
	// is the current one (see Cluster.SetUnderlayIP).
	NS *netnslab.Host
	// Name is a short name for tables and logs ("h1").
	Name string
	// Index is the host's number, from 1.
	Index int
	// Master runs on this host, or is nil.
	Master *Master
	// Agent is the host's agent process (it may be stopped).
	Agent *Process
	// Dir holds the host's files; AgentDataDir is the agent's --data-dir.
	Dir          string
	AgentDataDir string

	c *Cluster
	// cni is the host's CNI runtime: libcni with the host's own result
	// cache, so that a GC on one host never DELs another host's attachments.
	cni    *libcni.CNIConfig
	cniLog *os.File // the plugins' stderr
	// guarded by c.mu
	ip      netip.Prefix
	agentID string
	// certName is the agent id of the agent's certificate, the id it runs
	// with (see ResetAgentData).
	certName string
}

// Container is a container namespace on a host, attached to an overlay's
// m-<overlay> bridge through CNI (see AddCNIContainer). Addr, Gateway, Result
// and NS.HostLink are set by a successful ADD; do not read them while a
// CNIAdd of the same container runs.
type Container struct {
	// NS is the lab container: its namespace, its host, and once attached
	// the host end of its veth and its addresses.
	NS *netnslab.Container
	// Host is the host it is attached to.
	Host *Host
	// Overlay is the overlay (the CNI network) it is attached to.
	Overlay string
	// ContainerID and IfName identify the CNI attachment (CNI_CONTAINERID,
	// CNI_IFNAME), the key of the agent's IPAM.
	ContainerID, IfName string
	// Addr is its address in the host's mesos sub-subnet, from the ADD
	// result; invalid until an ADD succeeded.
	Addr netip.Prefix
	// Gateway is the bridge's address, the container's default route.
	Gateway netip.Addr
	// Result is the last successful ADD's result.
	Result *types100.Result
	// Name is a short name ("h1c1").
	Name string
}

// Label names the container with its address, for tables.
func (c *Container) Label() string { return c.Name + " " + c.Addr.Addr().String() }

// String is the label.
func (c *Container) String() string { return c.Label() }

// IP is the host's current underlay address with its prefix.
func (h *Host) IP() netip.Prefix {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.ip
}

// AgentID is the id the host's agent reported last ("" before it answered).
// It is the name of the agent certificate the harness issued for the host
// (see ResetAgentData), unless the agent runs with another.
func (h *Host) AgentID() string {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.agentID
}

// AgentURL is the agent's HTTP base URL on the host's current IP: agents
// serve TLS with their certificate.
func (h *Host) AgentURL() string {
	return "https://" + hostPort(h.IP().Addr(), AgentHTTPPort)
}

// CertName is the agent id named by the certificate the host's agent
// starts with.
func (h *Host) CertName() string {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.certName
}

func hostPort(a netip.Addr, port int) string {
	return netip.AddrPortFrom(a, uint16(port)).String()
}

// SetUnderlayIP re-addresses h's underlay interface: the old address goes,
// ip comes (it must lie in 198.18.0.0/15). Stop the agent first and start it
// again afterwards: its flags follow the host's current IP, and its
// certificate is issued again for that IP. A host that runs
// a master is refused, since the master's Raft address is fixed in every
// master's --peers.
func (c *Cluster) SetUnderlayIP(h *Host, ip netip.Prefix) error {
	underlay := netip.MustParsePrefix("198.18.0.0/15")
	if !underlay.Contains(ip.Addr()) || ip.Bits() != netnslab.UnderlayPrefixLen {
		return fmt.Errorf("labcluster: %s is not a /%d address in %s", ip, netnslab.UnderlayPrefixLen, underlay)
	}
	if h.Master != nil {
		return fmt.Errorf("labcluster: %s runs master %s bound to %s; re-addressing it needs a Raft membership change", h.Name, h.Master.ID, h.IP().Addr())
	}
	old := h.IP()
	nh, err := netlinksafe.NewHandleAt(h.NS.NsHandle())
	if err != nil {
		return fmt.Errorf("labcluster: netlink in %s: %w", h.Name, err)
	}
	defer nh.Close()
	link, err := nh.LinkByName(h.NS.Link)
	if err != nil {
		return fmt.Errorf("labcluster: %s in %s: %w", h.NS.Link, h.Name, err)
	}
	// Old first: the new address shares the old one's subnet and would be
	// deleted with it as its secondary.
	oldAddr, _ := netlink.ParseAddr(old.String())
	if err := nh.AddrDel(link, oldAddr); err != nil {
		return fmt.Errorf("labcluster: remove %s from %s: %w", old, h.Name, err)
	}
	newAddr, _ := netlink.ParseAddr(ip.String())
	if err := nh.AddrAdd(link, newAddr); err != nil {
		return fmt.Errorf("labcluster: add %s to %s: %w", ip, h.Name, err)
	}
	if err := c.sec.issue(pki.RoleAgent, h.CertName(), ip.Addr()); err != nil {
		return err
	}
	c.mu.Lock()
	h.ip = ip
	c.mu.Unlock()
	c.log.Info("host re-addressed", "host", h.Name, "old", old, "new", ip)
	return nil
}
