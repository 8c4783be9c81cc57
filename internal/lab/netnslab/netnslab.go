// Package netnslab builds throw-away network topologies out of Linux network
// namespaces, for tests, benchmarks and the demo.
//
// A Lab owns an "underlay" namespace holding a Linux bridge, "host" namespaces
// joined to that bridge by veth pairs (host i gets 198.18.0.(10+i)/15, from the
// benchmarking range 198.18.0.0/15 so that nothing ever leaves the machine), and
// "container" namespaces attached by veth pairs to a bridge inside a host.
//
// Every namespace is named and bind-mounted under /run/netns exactly like
// `ip netns add` does, so `ip netns exec NAME cmd` works on it. Names share a
// prefix that is unique per lab (process id and a counter) so that concurrent
// labs and tests never collide. Close removes every namespace the lab made; it
// is idempotent and safe to call from a signal-handling goroutine. Nothing is
// ever created in the namespace of the calling process.
package netnslab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/carve-net/carve/internal/lab/testutil"
	"github.com/carve-net/carve/internal/retry"
)

// NetNSDir is where named namespaces are bind-mounted, the directory that
// `ip netns` uses.
const NetNSDir = "/run/netns"

// DefaultPrefix starts the name of every namespace a lab creates when
// Options.Prefix is empty.
const DefaultPrefix = "carvelab"

// UnderlayBridge is the name of the bridge inside the underlay namespace.
const UnderlayBridge = "br0"

// HostLink is the name of a host's underlay interface (inside the host).
const HostLink = "eth0"

// ContainerLink is the name of a container's interface (inside the container).
const ContainerLink = "eth0"

// underlayBase is the first address of the underlay range; host i gets
// underlayBase+10+i. 198.18.0.0/15 is reserved for benchmarking (RFC 2544),
// so a leak could never reach a real network.
var underlayBase = netip.MustParseAddr("198.18.0.0")

// UnderlayPrefixLen is the prefix length of every host's underlay address.
const UnderlayPrefixLen = 15

var labCounter atomic.Uint64

// Options configure New.
type Options struct {
	// Hosts is the number of host namespaces created up front (more can be
	// added with AddHost).
	Hosts int
	// Prefix starts every namespace name (default DefaultPrefix). The lab
	// appends "-<pid>-<counter>-" to it, which makes it unique.
	Prefix string
	// UnderlayMTU is the MTU of the underlay veths and bridge (default 1500).
	UnderlayMTU int
}

// Lab is a set of network namespaces that it created and that it removes on
// Close. Its methods are safe for concurrent use.
type Lab struct {
	prefix string
	mtu    int

	mu         sync.Mutex
	closed     bool
	namespaces []*Namespace // in creation order; removed in reverse
	procs      []*os.Process
	hosts      []*Host
	vethSeq    int

	// Underlay is the namespace holding the underlay bridge.
	Underlay *Namespace
}

// Namespace is one named network namespace of a lab.
type Namespace struct {
	// Name is the name under /run/netns (usable with `ip netns exec`).
	Name string
	// Path is the bind mount, /run/netns/Name.
	Path string

	lab *Lab
	ns  ns.NetNS // an open handle, closed by Lab.Close

	mu       sync.Mutex
	handles  []*netlink.Handle
	released bool
}

// Host is a host namespace joined to the underlay bridge.
type Host struct {
	*Namespace
	// Index is the host's number, from 1.
	Index int
	// IP is the host's underlay address with its prefix (198.18.0.(10+Index)/15).
	IP netip.Prefix
	// Link is the name of the underlay interface inside the host.
	Link string
}

// Container is a namespace attached to a bridge inside a host.
type Container struct {
	*Namespace
	// Host is the host whose bridge the container is attached to.
	Host *Host
	// HostLink is the name of the veth end on the host's bridge.
	HostLink string
	// Config is what the container was created with.
	Config ContainerConfig
}

// ContainerConfig describes a container's interface.
type ContainerConfig struct {
	// Bridge is the existing bridge inside the host to attach to.
	Bridge string
	// Address is the container's IPv4 (or IPv6) address with prefix.
	Address netip.Prefix
	// Gateway, when valid, becomes the default route of Address's family.
	Gateway netip.Addr
	// Address6 and Gateway6 optionally add a second (IPv6) address and
	// default route.
	Address6 netip.Prefix
	Gateway6 netip.Addr
	// MTU of the veth pair (default: the bridge's MTU).
	MTU int
}

// IsRoot reports whether the process can create namespaces (it runs as root).
func IsRoot() bool { return os.Geteuid() == 0 }

// ForTest creates a lab for a test: it skips the test with a clear message when
// not running as root (fails it under CI: testutil.Require) and registers
// Close with t.Cleanup, so the namespaces are removed also when the test
// fails.
func ForTest(t testing.TB, opts Options) *Lab {
	t.Helper()
	testutil.Require(t, IsRoot(), "netnslab: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) to create network namespaces; run the tests as root")
	lab, err := New(opts)
	if lab != nil {
		t.Cleanup(func() {
			if err := lab.Close(); err != nil {
				t.Errorf("netnslab: close: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("netnslab: %v", err)
	}
	return lab
}

// New creates a lab with its underlay namespace and opts.Hosts hosts. On
// error, everything already created is removed again.
func New(opts Options) (*Lab, error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if strings.ContainsAny(prefix, "/ \t\n") {
		return nil, fmt.Errorf("netnslab: invalid prefix %q", prefix)
	}
	mtu := opts.UnderlayMTU
	if mtu == 0 {
		mtu = 1500
	}
	l := &Lab{
		prefix: fmt.Sprintf("%s-%d-%d-", prefix, os.Getpid(), labCounter.Add(1)),
		mtu:    mtu,
	}
	fail := func(err error) (*Lab, error) {
		return nil, errors.Join(err, l.Close())
	}
	u, err := l.AddNamespace("u")
	if err != nil {
		return fail(err)
	}
	l.Underlay = u
	err = u.withNetlink(func(h netlinksafe.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: UnderlayBridge, MTU: mtu}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("add underlay bridge: %w", err)
		}
		return h.LinkSetUp(br)
	})
	if err != nil {
		return fail(err)
	}
	for i := 0; i < opts.Hosts; i++ {
		if _, err := l.AddHost(); err != nil {
			return fail(err)
		}
	}
	return l, nil
}

// Prefix returns the unique prefix of the names of this lab's namespaces.
func (l *Lab) Prefix() string { return l.prefix }

// Hosts returns the hosts created so far, in order.
func (l *Lab) Hosts() []*Host {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Host(nil), l.hosts...)
}

// AddNamespace creates an empty named namespace (loopback up) called
// Prefix()+suffix. Most callers want AddHost or AddContainer; this is for
// tests and benchmarks that need a bare namespace.
func (l *Lab) AddNamespace(suffix string) (*Namespace, error) {
	if suffix == "" || strings.ContainsAny(suffix, "/ \t\n") {
		return nil, fmt.Errorf("netnslab: invalid namespace suffix %q", suffix)
	}
	name := l.prefix + suffix
	path := filepath.Join(NetNSDir, name)

	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return nil, errors.New("netnslab: lab is closed")
	}
	// createNamed fails when the name exists, so a namespace is only ever
	// registered (and later removed) when this lab made it.
	if err := createNamed(path); err != nil {
		return nil, fmt.Errorf("netnslab: create namespace %s: %w", name, err)
	}
	n := &Namespace{Name: name, Path: path, lab: l}
	l.mu.Lock()
	if l.closed {
		// Close ran meanwhile and will not see this one: undo it here.
		l.mu.Unlock()
		return nil, errors.Join(errors.New("netnslab: lab is closed"), RemoveMount(path))
	}
	l.namespaces = append(l.namespaces, n)
	l.mu.Unlock()

	h, err := ns.GetNS(path)
	if err != nil {
		return nil, fmt.Errorf("netnslab: open namespace %s: %w", name, err)
	}
	n.mu.Lock()
	if n.released {
		n.mu.Unlock()
		h.Close()
		return nil, fmt.Errorf("netnslab: namespace %s is closed", name)
	}
	n.ns = h
	n.mu.Unlock()
	err = n.withNetlink(func(nh netlinksafe.Handle) error {
		lo, err := nh.LinkByName("lo")
		if err != nil {
			return err
		}
		return nh.LinkSetUp(lo)
	})
	if err != nil {
		return nil, fmt.Errorf("netnslab: loopback up in %s: %w", name, err)
	}
	return n, nil
}

// AddHost creates the next host namespace, joined to the underlay bridge by a
// veth pair, with its underlay address on Link and the link up.
func (l *Lab) AddHost() (*Host, error) {
	l.mu.Lock()
	idx := len(l.hosts) + 1
	l.mu.Unlock()
	ipInt := ipv4ToUint(underlayBase) + 10 + uint32(idx)
	ip := uintToIPv4(ipInt)
	if !netip.PrefixFrom(underlayBase, UnderlayPrefixLen).Contains(ip) {
		return nil, fmt.Errorf("netnslab: too many hosts (%d)", idx)
	}
	n, err := l.AddNamespace("h" + strconv.Itoa(idx))
	if err != nil {
		return nil, err
	}
	h := &Host{Namespace: n, Index: idx, IP: netip.PrefixFrom(ip, UnderlayPrefixLen), Link: HostLink}
	peer := "h" + strconv.Itoa(idx)
	err = l.Underlay.withNetlink(func(uh netlinksafe.Handle) error {
		return n.withNetlink(func(hh netlinksafe.Handle) error {
			// Created inside the host, its peer moved straight into the
			// underlay: nothing ever appears in the caller's namespace.
			veth := &netlink.Veth{
				LinkAttrs:     netlink.LinkAttrs{Name: HostLink, MTU: l.mtu},
				PeerName:      peer,
				PeerNamespace: netlink.NsFd(int(l.Underlay.ns.Fd())),
			}
			if err := hh.LinkAdd(veth); err != nil {
				return fmt.Errorf("add veth: %w", err)
			}
			br, err := uh.LinkByName(UnderlayBridge)
			if err != nil {
				return err
			}
			p, err := uh.LinkByName(peer)
			if err != nil {
				return fmt.Errorf("find veth peer in underlay: %w", err)
			}
			if err := uh.LinkSetMaster(p, br); err != nil {
				return err
			}
			if err := uh.LinkSetUp(p); err != nil {
				return err
			}
			link, err := hh.LinkByName(HostLink)
			if err != nil {
				return err
			}
			if err := hh.AddrAdd(link, &netlink.Addr{IPNet: prefixToIPNet(h.IP)}); err != nil {
				return fmt.Errorf("add underlay address: %w", err)
			}
			return hh.LinkSetUp(link)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("netnslab: host %d: %w", idx, err)
	}
	l.mu.Lock()
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	return h, nil
}

// AddBridge creates a bridge inside the host with the given address (if
// valid) and MTU (if non-zero), up. The dataplane creates its own bridges;
// this is for lab tests that need one without it.
func (h *Host) AddBridge(name string, addr netip.Prefix, mtu int) error {
	return h.withNetlink(func(nh netlinksafe.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}}
		if err := nh.LinkAdd(br); err != nil {
			return fmt.Errorf("netnslab: add bridge %s: %w", name, err)
		}
		if addr.IsValid() {
			if err := nh.AddrAdd(br, &netlink.Addr{IPNet: prefixToIPNet(addr), Flags: nodad(addr)}); err != nil {
				return fmt.Errorf("netnslab: address on %s: %w", name, err)
			}
		}
		return nh.LinkSetUp(br)
	})
}

// AddContainer creates a container namespace (named after the host) attached
// to cfg.Bridge, which must exist inside the host, with cfg's addresses and
// default routes. The host-side veth end is up and enslaved to the bridge.
func (l *Lab) AddContainer(h *Host, cfg ContainerConfig) (*Container, error) {
	if !cfg.Address.IsValid() {
		return nil, errors.New("netnslab: container needs an address")
	}
	l.mu.Lock()
	l.vethSeq++
	seq := l.vethSeq
	l.mu.Unlock()
	n, err := l.AddNamespace(fmt.Sprintf("h%dc%d", h.Index, seq))
	if err != nil {
		return nil, err
	}
	c := &Container{Namespace: n, Host: h, HostLink: "vc" + strconv.Itoa(seq), Config: cfg}
	err = h.withNetlink(func(hh netlinksafe.Handle) error {
		return n.withNetlink(func(ch netlinksafe.Handle) error {
			br, err := hh.LinkByName(cfg.Bridge)
			if err != nil {
				return fmt.Errorf("bridge %s in host %s: %w", cfg.Bridge, h.Name, err)
			}
			mtu := cfg.MTU
			if mtu == 0 {
				mtu = br.Attrs().MTU
			}
			veth := &netlink.Veth{
				LinkAttrs:     netlink.LinkAttrs{Name: c.HostLink, MTU: mtu},
				PeerName:      ContainerLink,
				PeerNamespace: netlink.NsFd(int(n.ns.Fd())),
			}
			if err := hh.LinkAdd(veth); err != nil {
				return fmt.Errorf("add veth: %w", err)
			}
			hl, err := hh.LinkByName(c.HostLink)
			if err != nil {
				return err
			}
			if err := hh.LinkSetMaster(hl, br); err != nil {
				return err
			}
			if err := hh.LinkSetUp(hl); err != nil {
				return err
			}
			cl, err := ch.LinkByName(ContainerLink)
			if err != nil {
				return err
			}
			for _, a := range []netip.Prefix{cfg.Address, cfg.Address6} {
				if !a.IsValid() {
					continue
				}
				if err := ch.AddrAdd(cl, &netlink.Addr{IPNet: prefixToIPNet(a), Flags: nodad(a)}); err != nil {
					return fmt.Errorf("address %s: %w", a, err)
				}
			}
			if err := ch.LinkSetUp(cl); err != nil {
				return err
			}
			for _, gw := range []netip.Addr{cfg.Gateway, cfg.Gateway6} {
				if !gw.IsValid() {
					continue
				}
				r := &netlink.Route{LinkIndex: cl.Attrs().Index, Gw: net.IP(gw.AsSlice()), Family: family(gw)}
				if err := ch.RouteAdd(r); err != nil {
					return fmt.Errorf("default route via %s: %w", gw, err)
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("netnslab: container on host %d: %w", h.Index, err)
	}
	return c, nil
}

// Close kills the processes started with Namespace.Start that still run, then
// removes every namespace of the lab (newest first) and closes the handles it
// gave out. It is idempotent and may run concurrently with other calls, e.g.
// from a goroutine that handles SIGINT/SIGTERM; later calls return nil.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	namespaces := l.namespaces
	procs := l.procs
	l.namespaces, l.procs = nil, nil
	l.mu.Unlock()

	var errs []error
	// A process living in a namespace keeps it alive after its mount is
	// gone: stop ours first (only the ones we started, by their PID).
	for _, p := range procs {
		if err := p.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, fmt.Errorf("kill pid %d: %w", p.Pid, err))
		}
	}
	for i := len(namespaces) - 1; i >= 0; i-- {
		if err := namespaces[i].release(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// release closes the namespace's handles and removes its mount.
func (n *Namespace) release() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.released {
		return nil
	}
	n.released = true
	for _, h := range n.handles {
		h.Close()
	}
	n.handles = nil
	var errs []error
	if n.ns != nil {
		if err := n.ns.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := RemoveMount(n.Path); err != nil {
		errs = append(errs, fmt.Errorf("remove namespace %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}

// handle returns the open namespace handle, or an error once released.
func (n *Namespace) handle() (ns.NetNS, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.released || n.ns == nil {
		return nil, fmt.Errorf("netnslab: namespace %s is closed", n.Name)
	}
	return n.ns, nil
}

// Do runs fn on an OS thread that is inside the namespace, and puts the
// thread back afterwards (a thread that cannot be put back is discarded).
// fn must not start goroutines that expect to be inside the namespace.
func (n *Namespace) Do(fn func() error) error {
	h, err := n.handle()
	if err != nil {
		return err
	}
	return h.Do(func(ns.NetNS) error { return fn() })
}

// NsHandle returns the lab's own handle on the namespace, for APIs that take a
// netns.NsHandle (e.g. vxlan.Options.NetNS). It stays owned by the lab: do not
// close it; it is valid until Close (copy it with unix.Dup to keep it longer).
func (n *Namespace) NsHandle() netns.NsHandle {
	h, err := n.handle()
	if err != nil {
		return netns.None()
	}
	return netns.NsHandle(int(h.Fd()))
}

// Netlink returns a netlink handle bound to the namespace. The lab closes it
// on Close (closing it earlier is fine).
func (n *Namespace) Netlink() (*netlink.Handle, error) {
	if _, err := n.handle(); err != nil {
		return nil, err
	}
	nh, err := netlink.NewHandleAt(n.NsHandle())
	if err != nil {
		return nil, fmt.Errorf("netnslab: netlink handle in %s: %w", n.Name, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.released {
		nh.Close()
		return nil, fmt.Errorf("netnslab: namespace %s is closed", n.Name)
	}
	n.handles = append(n.handles, nh)
	return nh, nil
}

// withNetlink runs fn with a short-lived handle, so that setup code does not
// accumulate sockets (which would also pin the namespace). The handle
// retries the lookups a concurrent change interrupts (netlinksafe).
func (n *Namespace) withNetlink(fn func(netlinksafe.Handle) error) error {
	if _, err := n.handle(); err != nil {
		return err
	}
	nh, err := netlinksafe.NewHandleAt(n.NsHandle())
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", n.Name, err)
	}
	defer nh.Close()
	return fn(nh)
}

// Start starts cmd inside the namespace (the child inherits the namespace of
// the thread that forks it). The lab kills it on Close if it still runs; the
// caller still owns cmd and should Wait for it. Do not set
// cmd.SysProcAttr.Pdeathsig: it fires when the forking thread exits, and the
// thread used here may be discarded.
func (n *Namespace) Start(cmd *exec.Cmd) error {
	n.lab.mu.Lock()
	closed := n.lab.closed
	n.lab.mu.Unlock()
	if closed {
		return errors.New("netnslab: lab is closed")
	}
	if err := n.Do(cmd.Start); err != nil {
		return err
	}
	n.lab.mu.Lock()
	defer n.lab.mu.Unlock()
	if n.lab.closed {
		// Close ran meanwhile: do not leave the process behind.
		_ = cmd.Process.Kill()
		return errors.New("netnslab: lab is closed")
	}
	n.lab.procs = append(n.lab.procs, cmd.Process)
	return nil
}

// Run starts cmd inside the namespace and waits for it.
func (n *Namespace) Run(cmd *exec.Cmd) error {
	if err := n.Start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// ExecArgs returns argv that runs args inside the namespace through
// `ip netns exec` (needs iproute2), for shells and scripts.
func (n *Namespace) ExecArgs(args ...string) []string {
	return append([]string{"ip", "netns", "exec", n.Name}, args...)
}

// checkNetSysctl refuses names outside net.*: only those are per network
// namespace, so any other would change the whole machine.
func checkNetSysctl(name string) error {
	if !strings.HasPrefix(name, "net.") || strings.Contains(name, "..") || strings.Contains(name, "/") {
		return fmt.Errorf("netnslab: only net.* sysctls are per namespace, not %q", name)
	}
	return nil
}

// Sysctl reads a net.* sysctl as seen from inside the namespace (/proc/sys/net
// resolves against the network namespace of the reading thread).
func (n *Namespace) Sysctl(name string) (string, error) {
	if err := checkNetSysctl(name); err != nil {
		return "", err
	}
	var v string
	err := n.Do(func() error {
		var err error
		v, err = sysctl.Sysctl(name)
		return err
	})
	return strings.TrimSpace(v), err
}

// SetSysctl writes a net.* sysctl inside the namespace only.
func (n *Namespace) SetSysctl(name, value string) error {
	if err := checkNetSysctl(name); err != nil {
		return err
	}
	return n.Do(func() error {
		_, err := sysctl.Sysctl(name, value)
		return err
	})
}

// Inode returns the inode number that identifies the namespace (the one
// /proc/PID/ns/net links to), to check which namespace a process is in.
func (n *Namespace) Inode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(n.Path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// createNamed creates a network namespace and bind-mounts it at path, as
// `ip netns add` does. (plugins/pkg/ns opens namespaces and runs code in
// them, which Do uses, but creates none with a name of ours;
// pkg/testutils.NewNS names them at random, which Stale could not trace to
// their creator.) The unshare happens on a dedicated, locked OS thread
// that is never unlocked, so the Go runtime discards it afterwards and no
// other goroutine ever runs inside the new namespace by accident.
func createNamed(path string) error {
	if err := EnsureNetNSDir(); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread: see the function comment.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// EnsureNetNSDir makes NetNSDir a shared mount point, as `ip netns add`
// and CNI's testutils.NewNS do the first time: when it is not one yet, they
// bind it onto itself, recursively. A namespace bound in the directory
// before that stays under the new mount, copied into it: the copy can be
// unmounted, the original never (its file is busy, EBUSY, for good). So
// every namespace of the lab is created after the directory is a mount
// point (`make test` makes it one before any test runs, because the test
// packages run side by side and one of them uses `ip netns add`).
func EnsureNetNSDir() error {
	if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) {
		return err // nil: a mount point already, now shared
	}
	if err := unix.Mount(NetNSDir, NetNSDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", NetNSDir, err)
	}
	return unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, "")
}

// RemoveMount undoes `ip netns add` (and createNamed): it detaches the
// namespace's bind mount at path and removes the file; a missing one is not
// an error. (plugins/pkg/testutils.UnmountNS fails on a missing or busy
// mount, which a cleanup after a crash must get past.)
//
// The file is busy (EBUSY) while it is still a mount point: the namespace
// was bound there more than once (each unmount detaches one); it is
// unmounted and removed again for up to removeBusyFor. (One left under a
// later mount of the directory stays busy: see EnsureNetNSDir.)
func RemoveMount(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), removeBusyFor)
	defer cancel()
	return retry.Until(ctx, 50*time.Millisecond, func() error {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return retry.Permanent(fmt.Errorf("unmount: %w", err))
		}
		err := os.Remove(path)
		switch {
		case err == nil || errors.Is(err, os.ErrNotExist):
			return nil
		case errors.Is(err, unix.EBUSY):
			return err
		}
		return retry.Permanent(err)
	})
}

// removeBusyFor bounds how long RemoveMount tries a busy namespace file.
const removeBusyFor = 2 * time.Second

// CreatorPID parses a namespace name a lab with this prefix made
// ("<prefix>-<pid>-<counter>-<suffix>") and returns the pid of the process
// that made it; false when the name is not one.
func CreatorPID(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return 0, false
	}
	fields := strings.SplitN(rest, "-", 3)
	if len(fields) != 3 {
		return 0, false
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil || pid <= 0 {
		return 0, false
	}
	if _, err := strconv.Atoi(fields[1]); err != nil {
		return 0, false
	}
	return pid, true
}

// Stale lists the namespaces (names under NetNSDir) left behind by labs of
// processes that no longer run (PIDAlive: a zombie counts as gone), e.g. a
// test binary that was killed: names of the form prefix-<pid>-<n>-... .
// prefix "" means DefaultPrefix. Names of any other form are never listed.
func Stale(prefix string) ([]string, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	entries, err := os.ReadDir(NetNSDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, e := range entries {
		if pid, ok := CreatorPID(e.Name(), prefix); ok && !PIDAlive(pid) {
			stale = append(stale, e.Name())
		}
	}
	return stale, nil
}

// RemoveStale removes the namespaces Stale lists and returns their names. It
// never touches a namespace whose creator still runs.
func RemoveStale(prefix string) ([]string, error) {
	stale, err := Stale(prefix)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, name := range stale {
		if err := RemoveMount(filepath.Join(NetNSDir, name)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

// nodad skips IPv6 duplicate address detection, which would leave a fresh
// address "tentative" (unusable) for a second or more.
func nodad(p netip.Prefix) int {
	if p.Addr().Is6() {
		return unix.IFA_F_NODAD
	}
	return 0
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func ipv4ToUint(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func uintToIPv4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// PIDAlive reports whether pid runs: it exists and is not a zombie. A
// process killed with SIGKILL stays a zombie until its parent reaps it, and
// its leftovers are stale from the moment it died.
func PIDAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return true
	}
	return stat[i+2] != 'Z' && stat[i+2] != 'X'
}
