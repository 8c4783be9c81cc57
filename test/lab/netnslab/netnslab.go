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
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/test/lab/testutil"
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
