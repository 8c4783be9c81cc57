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
// destination (see program). Everything else, and everything while the
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

// maxBlocks bounds the blocks map: every routed peer's IPv4 blocks (one per
// overlay, more after growth) and this host's.
const maxBlocks = 1 << 20

// Path is the loaded program, its maps and its attachments. It is not safe
// for concurrent use: its one caller (vxlan's reconcile) serialises it.
type Path struct {
	prog    *ebpf.Program
	progID  ebpf.ProgramID
	blocks  *ebpf.Map // LPM trie: IPv4 prefix -> Target
	counter *ebpf.Map // per-CPU array of one: packets redirected
	links   map[int]link.Link
	have    map[netip.Prefix]Target // what blocks holds, as Sync last wrote it
}

// New loads the program and creates its maps; nothing is attached until
// Sync.
func New() (*Path, error) {
	p := &Path{links: map[int]link.Link{}, have: map[netip.Prefix]Target{}}
	var err error
	if p.blocks, err = ebpf.NewMap(&ebpf.MapSpec{Name: "carve_blocks", Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 8,
		MaxEntries: maxBlocks, Flags: 1 /* BPF_F_NO_PREALLOC, required of LPM tries */}); err != nil {
		return nil, fmt.Errorf("%w: blocks map: %w", ErrUnsupported, err)
	}
	if p.counter, err = ebpf.NewMap(&ebpf.MapSpec{Name: "carve_fwd", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1}); err != nil {
		p.Close()
		return nil, fmt.Errorf("%w: counter map: %w", ErrUnsupported, err)
	}
	if p.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "carve_fastpath", Type: ebpf.SchedCLS,
		Instructions: program(p.blocks, p.counter), License: "GPL"}); err != nil {
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
	for _, m := range []*ebpf.Map{p.blocks, p.counter} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// Sync makes the blocks map hold exactly want (IPv4 prefixes only) and the
// program be attached at the ingress of exactly the devices want names. It
// must run on a thread inside the namespace of those devices. full reads
// the map and the attachments back from the kernel instead of trusting what
// the last Sync wrote. It goes on past failures and returns them all.
func (p *Path) Sync(want map[netip.Prefix]Target, full bool) error {
	var errs []error
	if full {
		if err := p.readBack(); err != nil {
			errs = append(errs, err)
		}
	}
	for pfx, t := range want {
		if !pfx.Addr().Is4() {
			errs = append(errs, fmt.Errorf("fastpath: %s is not an IPv4 prefix", pfx))
			continue
		}
		pfx = pfx.Masked()
		if old, ok := p.have[pfx]; ok && old == t {
			continue
		}
		if err := p.blocks.Put(key(pfx), value(t)); err != nil {
			errs = append(errs, fmt.Errorf("fastpath: put %s: %w", pfx, err))
			delete(p.have, pfx)
			continue
		}
		p.have[pfx] = t
	}
	for pfx := range p.have {
		if _, ok := want[pfx]; ok {
			continue
		}
		if err := p.blocks.Delete(key(pfx)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("fastpath: delete %s: %w", pfx, err))
			continue
		}
		delete(p.have, pfx)
	}
	devices := map[int]bool{}
	for _, t := range want {
		devices[t.Ifindex] = true
	}
	for idx, l := range p.links {
		if !devices[idx] || (full && !p.attached(idx)) {
			l.Close() // the device may be gone, and its link with it
			delete(p.links, idx)
		}
	}
	for idx := range devices {
		if _, ok := p.links[idx]; ok {
			continue
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: idx, Program: p.prog, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			errs = append(errs, fmt.Errorf("fastpath: attach to ifindex %d: %w", idx, err))
			continue
		}
		p.links[idx] = l
	}
	return errors.Join(errs...)
}

// attached tells whether the kernel runs the program at idx's ingress.
func (p *Path) attached(idx int) bool {
	res, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return false
	}
	return slices.ContainsFunc(res.Programs, func(a link.AttachedProgram) bool { return a.ID == p.progID })
}

// readBack replaces what Path believes the blocks map holds with what it
// holds.
func (p *Path) readBack() error {
	got := map[netip.Prefix]Target{}
	var k, v [8]byte
	it := p.blocks.Iterate()
	for it.Next(&k, &v) {
		got[prefixOf(k)] = targetOf(v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("fastpath: read the blocks back: %w", err)
	}
	p.have = got
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

// Redirected is the number of packets the program has forwarded since New.
func (p *Path) Redirected() (uint64, error) {
	var perCPU []uint64
	if err := p.counter.Lookup(uint32(0), &perCPU); err != nil {
		return 0, fmt.Errorf("fastpath: read the counter: %w", err)
	}
	var n uint64
	for _, c := range perCPU {
		n += c
	}
	return n, nil
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
