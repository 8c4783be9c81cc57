// Package fastpath is the routed data path's shortcut through the kernel:
// an eBPF classifier at the ingress of the underlay device and of carve's
// bridges that forwards IPv4 packets between a routed peer's blocks and this
// host's bridges straight to the egress device the kernel's FIB names, past
// the host's IP forwarding, netfilter and (towards the underlay) the bridge.
//
// Only what carve routes is shortcut: the program's blocks map holds the
// routed peers' IPv4 blocks (each with the underlay device) and the local
// bridges' blocks (each with its bridge), and a packet is redirected only
// between a block of one kind and one of the other, coming in on the device
// its source's entry names and leaving by the one the FIB chose for its
// destination (see program). The program also runs at the bridges' ports
// (the host ends of the containers' veths), so that a container's packet
// skips its bridge, and learns there which port and MAC each container
// address has, so that a packet for it skips the bridge too, into the
// container's namespace. Everything else, and everything while the
// agent is not running (its links close with it), takes the kernel's own
// path, which carve programs the same way with or without the shortcut: the
// shortcut changes how fast packets go, never where.
//
// It needs TCX (Linux 6.6 or later) and bpf_fib_lookup; New reports
// ErrUnsupported elsewhere and the routed data path then runs without it.
// Sync runs inside the network namespace to program (vxlan calls it there).
package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// ErrUnsupported is New's error when the kernel cannot run the fast path
// (no TCX, no bpf_fib_lookup, or no permission to load programs).
var ErrUnsupported = errors.New("the kernel cannot run carve's eBPF fast path (it needs Linux 6.6 or later and CAP_BPF)")

// Kind says which side of the shortcut a block is on.
type Kind uint32

const (
	// KindPeer is a routed peer's block, reached through the underlay
	// device.
	KindPeer Kind = 1
	// KindLocal is a block of one of this host's bridges.
	KindLocal Kind = 2
)

// Target is where a block's packets go: the device (by ifindex, in the
// namespace Sync runs in) and the block's side.
type Target struct {
	Ifindex int
	Kind    Kind
}

// Port is a bridge port (the host end of a container's veth): its bridge
// and the bridge's MAC, the one the container routes through.
type Port struct {
	Bridge int
	MAC    [6]byte
}

// Want is what Sync makes the kernel hold.
type Want struct {
	// Blocks are the IPv4 prefixes to shortcut and where each leads.
	Blocks map[netip.Prefix]Target
	// Ports are the ports of the bridges of Blocks, by ifindex.
	Ports map[int]Port
}

// maxBlocks bounds the blocks map: every routed peer's IPv4 blocks (one per
// overlay, more after growth) and this host's. maxPorts and maxHosts bound
// this host's containers' ports and learned addresses (hosts is an LRU:
// the least recently seen is forgotten first, and then takes the bridge).
const (
	maxBlocks = 1 << 20
	maxPorts  = 1 << 16
	maxHosts  = 1 << 16
)

// Path is the loaded program, its maps and its attachments. It is not safe
// for concurrent use: its caller (vxlan's dataplane) serialises it.
type Path struct {
	prog   *ebpf.Program
	progID ebpf.ProgramID
	m      progMaps
	links  map[int]link.Link
	have   map[netip.Prefix]Target // what blocks holds, as Sync last wrote it
	ports  map[int]Port            // what ports holds
}

// New loads the program and creates its maps; nothing is attached until
// Sync.
func New() (*Path, error) {
	p := &Path{links: map[int]link.Link{}, have: map[netip.Prefix]Target{}, ports: map[int]Port{}}
	specs := []struct {
		m    **ebpf.Map
		spec ebpf.MapSpec
	}{
		{&p.m.blocks, ebpf.MapSpec{Name: "carve_blocks", Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 8,
			MaxEntries: maxBlocks, Flags: 1 /* BPF_F_NO_PREALLOC, required of LPM tries */}},
		{&p.m.ports, ebpf.MapSpec{Name: "carve_ports", Type: ebpf.Hash, KeySize: 4, ValueSize: 12, MaxEntries: maxPorts}},
		{&p.m.hosts, ebpf.MapSpec{Name: "carve_hosts", Type: ebpf.LRUHash, KeySize: 4, ValueSize: 12, MaxEntries: maxHosts}},
		{&p.m.counter, ebpf.MapSpec{Name: "carve_fwd", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 2}},
	}
	for _, s := range specs {
		var err error
		if *s.m, err = ebpf.NewMap(&s.spec); err != nil {
			p.Close()
			return nil, fmt.Errorf("%w: map %s: %w", ErrUnsupported, s.spec.Name, err)
		}
	}
	var err error
	if p.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "carve_fastpath", Type: ebpf.SchedCLS,
		Instructions: program(p.m), License: "GPL"}); err != nil {
		p.Close()
		return nil, fmt.Errorf("%w: load: %w", ErrUnsupported, err)
	}
	info, err := p.prog.Info()
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("fastpath: program info: %w", err)
	}
	var ok bool
	if p.progID, ok = info.ID(); !ok {
		p.Close()
		return nil, fmt.Errorf("%w: the kernel gives loaded programs no ID", ErrUnsupported)
	}
	return p, nil
}

// Close detaches the program from every device and releases it and its
// maps: packets take the kernel's own path again.
func (p *Path) Close() error {
	var errs []error
	for idx, l := range p.links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach from ifindex %d: %w", idx, err))
		}
		delete(p.links, idx)
	}
	if p.prog != nil {
		errs = append(errs, p.prog.Close())
	}
	for _, m := range []*ebpf.Map{p.m.blocks, p.m.ports, p.m.hosts, p.m.counter} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// Sync makes the blocks and ports maps hold exactly want (IPv4 prefixes
// only) and the program be attached at the ingress of exactly the devices
// want names. It must run on a thread inside the namespace of those
// devices. full reads the maps and the attachments back from the kernel
// instead of trusting what the last Sync wrote. It goes on past failures
// and returns them all.
func (p *Path) Sync(want Want, full bool) error {
	var errs []error
	if full {
		if err := p.readBack(); err != nil {
			errs = append(errs, err)
		}
	}
	for pfx, t := range want.Blocks {
		if !pfx.Addr().Is4() {
			errs = append(errs, fmt.Errorf("fastpath: %s is not an IPv4 prefix", pfx))
			continue
		}
		pfx = pfx.Masked()
		if old, ok := p.have[pfx]; ok && old == t {
			continue
		}
		if err := p.m.blocks.Put(key(pfx), value(t)); err != nil {
			errs = append(errs, fmt.Errorf("fastpath: put %s: %w", pfx, err))
			delete(p.have, pfx)
			continue
		}
		p.have[pfx] = t
	}
	for pfx := range p.have {
		if _, ok := want.Blocks[pfx]; ok {
			continue
		}
		if err := p.m.blocks.Delete(key(pfx)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("fastpath: delete %s: %w", pfx, err))
			continue
		}
		delete(p.have, pfx)
	}
	for idx, port := range want.Ports {
		if err := p.putPort(idx, port); err != nil {
			errs = append(errs, err)
		}
	}
	for idx := range p.ports {
		if _, ok := want.Ports[idx]; !ok {
			if err := p.RemovePort(idx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	devices := map[int]bool{}
	for _, t := range want.Blocks {
		devices[t.Ifindex] = true
	}
	for idx := range want.Ports {
		devices[idx] = true
	}
	for idx, l := range p.links {
		if !devices[idx] || (full && !p.attached(idx)) {
			l.Close() // the device may be gone, and its link with it
			delete(p.links, idx)
		}
	}
	for idx := range devices {
		if err := p.attach(idx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AddPort shortcuts a new port of a bridge at once (a container just
// attached), between two Syncs. It must run inside the port's namespace.
func (p *Path) AddPort(idx int, port Port) error {
	if err := p.putPort(idx, port); err != nil {
		return err
	}
	return p.attach(idx)
}

// RemovePort forgets a port (its container left); its link ends with the
// device, or here.
func (p *Path) RemovePort(idx int) error {
	if l, ok := p.links[idx]; ok {
		l.Close()
		delete(p.links, idx)
	}
	if err := p.m.ports.Delete(uint32(idx)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("fastpath: delete port %d: %w", idx, err)
	}
	delete(p.ports, idx)
	return nil
}

// HasPort tells whether idx is a port the fast path knows.
func (p *Path) HasPort(idx int) bool {
	_, ok := p.ports[idx]
	return ok
}

func (p *Path) putPort(idx int, port Port) error {
	if old, ok := p.ports[idx]; ok && old == port {
		return nil
	}
	var v [12]byte
	binary.NativeEndian.PutUint32(v[:4], uint32(port.Bridge))
	copy(v[4:10], port.MAC[:])
	if err := p.m.ports.Put(uint32(idx), v); err != nil {
		delete(p.ports, idx)
		return fmt.Errorf("fastpath: put port %d: %w", idx, err)
	}
	p.ports[idx] = port
	return nil
}

// attach attaches the program at idx's ingress unless it is already.
func (p *Path) attach(idx int) error {
	if _, ok := p.links[idx]; ok {
		return nil
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: idx, Program: p.prog, Attach: ebpf.AttachTCXIngress})
	if errors.Is(err, ebpf.ErrNotSupported) { // a kernel before 6.6
		return fmt.Errorf("%w: attach to ifindex %d: %w", ErrUnsupported, idx, err)
	}
	if err != nil {
		return fmt.Errorf("fastpath: attach to ifindex %d: %w", idx, err)
	}
	p.links[idx] = l
	return nil
}

// attached tells whether the kernel runs the program at idx's ingress.
func (p *Path) attached(idx int) bool {
	res, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return false
	}
	return slices.ContainsFunc(res.Programs, func(a link.AttachedProgram) bool { return a.ID == p.progID })
}

// readBack replaces what Path believes the blocks and ports maps hold
// with what they hold.
func (p *Path) readBack() error {
	got := map[netip.Prefix]Target{}
	var k, v [8]byte
	it := p.m.blocks.Iterate()
	for it.Next(&k, &v) {
		got[prefixOf(k)] = targetOf(v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("fastpath: read the blocks back: %w", err)
	}
	ports := map[int]Port{}
	var pk uint32
	var pv [12]byte
	pit := p.m.ports.Iterate()
	for pit.Next(&pk, &pv) {
		ports[int(pk)] = Port{Bridge: int(binary.NativeEndian.Uint32(pv[:4])), MAC: [6]byte(pv[4:10])}
	}
	if err := pit.Err(); err != nil {
		return fmt.Errorf("fastpath: read the ports back: %w", err)
	}
	p.have, p.ports = got, ports
	return nil
}

// Blocks is what the kernel's blocks map holds, read back.
func (p *Path) Blocks() (map[netip.Prefix]Target, error) {
	if err := p.readBack(); err != nil {
		return nil, err
	}
	return maps.Clone(p.have), nil
}

// Devices are the ifindexes the program is attached to, as Path knows them.
func (p *Path) Devices() []int {
	return slices.Sorted(maps.Keys(p.links))
}

// Attached tells whether the kernel runs the program at the ingress of the
// device idx of the calling thread's namespace (read back).
func (p *Path) Attached(idx int) bool { return p.attached(idx) }

// Redirected is the number of packets the program has forwarded since
// New, and how many of them it sent straight into a container's namespace.
func (p *Path) Redirected() (all, intoContainers uint64, err error) {
	for slot, n := range []*uint64{&all, &intoContainers} {
		var perCPU []uint64
		if err := p.m.counter.Lookup(uint32(slot), &perCPU); err != nil {
			return 0, 0, fmt.Errorf("fastpath: read the counter: %w", err)
		}
		for _, c := range perCPU {
			*n += c
		}
	}
	return all, intoContainers, nil
}

// key is the LPM trie's key of an IPv4 prefix: its length (host order),
// then the address (network order).
func key(pfx netip.Prefix) [8]byte {
	var k [8]byte
	binary.NativeEndian.PutUint32(k[:4], uint32(pfx.Bits()))
	a := pfx.Addr().As4()
	copy(k[4:], a[:])
	return k
}

func prefixOf(k [8]byte) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte(k[4:])), int(binary.NativeEndian.Uint32(k[:4])))
}

// value is a blocks entry: the device's ifindex, then the kind, both in
// host order (the program loads them as words).
func value(t Target) [8]byte {
	var v [8]byte
	binary.NativeEndian.PutUint32(v[:4], uint32(t.Ifindex))
	binary.NativeEndian.PutUint32(v[4:], uint32(t.Kind))
	return v
}

func targetOf(v [8]byte) Target {
	return Target{Ifindex: int(binary.NativeEndian.Uint32(v[:4])), Kind: Kind(binary.NativeEndian.Uint32(v[4:]))}
}
