package fastpath

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Offsets in struct __sk_buff (linux/bpf.h) and in an Ethernet frame
// carrying IPv4.
const (
	skbIfindex = 40 // the device the packet is on: at ingress, the one it came in on
	skbData    = 76
	skbDataEnd = 80

	ethDst    = 0
	ethSrc    = 6
	ethProto  = 12 // EtherType
	ipTOS     = 14 + 1
	ipTTL     = 14 + 8 // TTL and, after it, the protocol: one 16-bit word of the checksum
	ipProto   = 14 + 9
	ipCsum    = 14 + 10
	ipSrc     = 14 + 12
	ipDst     = 14 + 16
	ipHdrEnd  = 14 + 20
	etherIPv4 = 0x0008 // ETH_P_IP, as a little-endian load of the big-endian field reads it
)

// Stack layout of the program (offsets from the frame pointer).
const (
	stKey     = -8   // the LPM key: prefix length (32), then the address
	stFib     = -72  // struct bpf_fib_lookup, 64 bytes, up to -9
	stTTL     = -80  // the new TTL and protocol word
	stCounter = -84  // the counter's key (0)
	stDev     = -88  // the device the packet counts as coming in on (a port's bridge)
	stPort    = -92  // the port it came in on (0: none), then a hosts key
	stHost    = -96  // a hosts key: an IPv4 address
	stHostVal = -112 // a hosts value (port ifindex, MAC), 12 of 16 bytes
	stDstKind = -116 // the destination's kind

	fibSize    = 64
	fibFamily  = stFib + 0
	fibL4Proto = stFib + 1
	fibIfindex = stFib + 8 // in: the ingress device; out: the egress device
	fibTOS     = stFib + 12
	fibSrc     = stFib + 16
	fibDst     = stFib + 32
	fibSMAC    = stFib + 52
	fibDMAC    = stFib + 58
	afInet     = 2

	// valueIfindex and valueKind are the fields of a blocks entry (value).
	valueIfindex = 0
	valueKind    = 4
	// portBridge and portMAC are the fields of a ports entry (portValue).
	portBridge = 0
	portMAC    = 4
	// hostPort and hostMAC are the fields of a hosts entry.
	hostPort = 0
	hostMAC  = 4

	// counterAll and counterPeer are the counter's slots: every packet
	// redirected, and those of them sent straight into a container.
	counterAll  = 0
	counterPeer = 1

	tcActUnspec = -1 // TCX_NEXT: the next program, or the kernel's own path
	tcActShot   = 2  // TCX_DROP
)

// progMaps are the program's maps.
type progMaps struct {
	blocks  *ebpf.Map // LPM trie: IPv4 prefix -> Target (value)
	ports   *ebpf.Map // hash: a bridge port's ifindex -> its bridge and the bridge's MAC (portValue)
	hosts   *ebpf.Map // LRU hash: a container's IPv4 address -> its port and MAC, learned
	counter *ebpf.Map // per-CPU array: packets redirected (counterAll, counterPeer)
}

// program is the fast path's classifier, written with cilium/ebpf's
// assembler so that carve ships no compiled object and needs no compiler.
// It runs at the ingress of the underlay device, of carve's bridges and of
// their ports (the host ends of the containers' veths). For an IPv4 packet
// with a TTL above 1 it looks up the source and the destination in blocks
// (longest prefix match). A packet on a port counts as coming in on the
// port's bridge, and only when it is addressed to the bridge's MAC (routed,
// not switched). It acts only when
//
//   - the source's entry names the device the packet came in on (a packet
//     from a routed peer's block arrives on the underlay device, one from a
//     local block on its bridge: carve's own reverse path check),
//   - the two entries are of different kinds (one a routed peer's block,
//     the other a local bridge's): nothing else is carve's to shortcut,
//   - the kernel's FIB, asked as the stack would ask it (bpf_fib_lookup,
//     all rules and tables), forwards the packet out of the device the
//     destination's entry names, with a resolved neighbour.
//
// Then it decrements the TTL (fixing the checksum), writes the MACs the FIB
// gave, counts the packet and redirects it to that device's egress, or, for
// a container of this host whose port and MAC it learned from the
// container's own packets (hosts), straight into the container's namespace
// (bpf_redirect_peer), past the bridge: only when that MAC is the one the
// FIB's neighbour gave and the port is still one of that bridge's. Every
// other packet goes on, untouched, to the kernel's own path: ARP,
// unresolved neighbours, TTL 1 (the ICMP error is the stack's), a packet
// too big for the egress device (FIB: fragmentation needed), anything a
// route or rule of the operator's sends elsewhere.
func program(m progMaps) asm.Instructions {
	// reload loads the packet pointers again (helpers invalidate them) and
	// checks that the IPv4 header is in the linear data.
	reload := func() asm.Instructions {
		return asm.Instructions{
			asm.LoadMem(asm.R2, asm.R6, skbData, asm.Word),
			asm.LoadMem(asm.R3, asm.R6, skbDataEnd, asm.Word),
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, ipHdrEnd),
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		}
	}
	// lookup looks up the stack's key at key in mp, leaving the entry in R0
	// and jumping to miss when there is none.
	lookup := func(mp *ebpf.Map, key int32, miss string) asm.Instructions {
		return asm.Instructions{
			asm.LoadMapPtr(asm.R1, mp.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, key),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, miss),
		}
	}
	// blockOf looks up the address at the packet's offset off in blocks.
	blockOf := func(off int16) asm.Instructions {
		return append(asm.Instructions{
			asm.LoadMem(asm.R5, asm.R2, off, asm.Word),
			asm.StoreMem(asm.RFP, stKey+4, asm.R5, asm.Word),
		}, lookup(m.blocks, stKey, "pass")...)
	}
	// sameMAC jumps to differ unless the 6 bytes at a+aoff equal those at
	// b+boff (16 bits at a time: stack accesses must be aligned).
	sameMAC := func(a asm.Register, aoff int16, b asm.Register, boff int16, differ string) asm.Instructions {
		var is asm.Instructions
		for i := int16(0); i < 6; i += 2 {
			is = append(is,
				asm.LoadMem(asm.R4, a, aoff+i, asm.Half),
				asm.LoadMem(asm.R5, b, boff+i, asm.Half),
				asm.JNE.Reg(asm.R4, asm.R5, differ))
		}
		return is
	}
	// labeled gives the first instruction of is the symbol sym.
	labeled := func(sym string, is asm.Instructions) asm.Instructions {
		is[0] = is[0].WithSymbol(sym)
		return is
	}
	// storeBytes writes n bytes from the stack at from to the packet at to.
	storeBytes := func(to int32, from int32, n int32, fail string) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R2, to),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, from),
			asm.Mov.Imm(asm.R4, n),
			asm.Mov.Imm(asm.R5, 0),
			asm.FnSkbStoreBytes.Call(),
			asm.JNE.Imm(asm.R0, 0, fail),
		}
	}
	var p asm.Instructions
	add := func(is ...asm.Instructions) {
		for _, i := range is {
			p = append(p, i...)
		}
	}
	add(asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}, reload(), asm.Instructions{
		asm.LoadMem(asm.R5, asm.R2, ethProto, asm.Half),
		asm.JNE.Imm(asm.R5, etherIPv4, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipTTL, asm.Byte),
		asm.JLE.Imm(asm.R5, 1, "pass"),
		asm.StoreImm(asm.RFP, stKey, 32, asm.Word),
		// The device it came in on, and whether that is a port.
		asm.LoadMem(asm.R5, asm.R6, skbIfindex, asm.Word),
		asm.StoreMem(asm.RFP, stDev, asm.R5, asm.Word),
		asm.StoreMem(asm.RFP, stPort, asm.R5, asm.Word),
	}, lookup(m.ports, stPort, "noport"))
	// A port: the packet must be addressed to its bridge, and counts as
	// coming in on it.
	add(asm.Instructions{asm.Mov.Reg(asm.R7, asm.R0)}, reload(), sameMAC(asm.R2, ethDst, asm.R7, portMAC, "pass"), asm.Instructions{
		asm.LoadMem(asm.R5, asm.R7, portBridge, asm.Word),
		asm.StoreMem(asm.RFP, stDev, asm.R5, asm.Word),
		asm.Ja.Label("source"),
		asm.Mov.Imm(asm.R5, 0).WithSymbol("noport"),
		asm.StoreMem(asm.RFP, stPort, asm.R5, asm.Word),
	})
	// The source: its entry must name the device; R8 keeps its kind.
	add(labeled("source", reload()), blockOf(ipSrc), asm.Instructions{
		asm.LoadMem(asm.R5, asm.R0, valueIfindex, asm.Word),
		asm.LoadMem(asm.R4, asm.RFP, stDev, asm.Word),
		asm.JNE.Reg(asm.R5, asm.R4, "pass"),
		asm.LoadMem(asm.R8, asm.R0, valueKind, asm.Word),
		// From a port: learn where its source lives (a container of the
		// port's bridge, in one of the bridge's blocks).
		asm.LoadMem(asm.R5, asm.RFP, stPort, asm.Word),
		asm.JEq.Imm(asm.R5, 0, "destination"),
		asm.StoreMem(asm.RFP, stHostVal+hostPort, asm.R5, asm.Word),
	}, reload(), asm.Instructions{
		asm.LoadMem(asm.R5, asm.R2, ethSrc, asm.Word),
		asm.StoreMem(asm.RFP, stHostVal+hostMAC, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R2, ethSrc+4, asm.Half),
		asm.StoreMem(asm.RFP, stHostVal+hostMAC+4, asm.R5, asm.Half),
		asm.Mov.Imm(asm.R5, 0),
		asm.StoreMem(asm.RFP, stHostVal+hostMAC+6, asm.R5, asm.Half),
		asm.StoreMem(asm.RFP, stHostVal+12, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R2, ipSrc, asm.Word),
		asm.StoreMem(asm.RFP, stHost, asm.R5, asm.Word),
		asm.LoadMapPtr(asm.R1, m.hosts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stHost),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stHostVal),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
	})
	// The destination: of the other kind; R7 keeps its device.
	add(labeled("destination", reload()), blockOf(ipDst), asm.Instructions{
		asm.LoadMem(asm.R5, asm.R0, valueKind, asm.Word),
		asm.JEq.Reg(asm.R5, asm.R8, "pass"),
		asm.StoreMem(asm.RFP, stDstKind, asm.R5, asm.Word),
		asm.LoadMem(asm.R7, asm.R0, valueIfindex, asm.Word),
	})
	// The FIB, asked for the packet as it came in.
	add(reload(), asm.Instructions{asm.Mov.Imm(asm.R0, 0)})
	for off := int16(stFib); off < stFib+fibSize; off += 8 {
		p = append(p, asm.StoreMem(asm.RFP, off, asm.R0, asm.DWord))
	}
	add(asm.Instructions{
		asm.StoreImm(asm.RFP, fibFamily, afInet, asm.Byte),
		asm.LoadMem(asm.R5, asm.R2, ipProto, asm.Byte),
		asm.StoreMem(asm.RFP, fibL4Proto, asm.R5, asm.Byte),
		asm.LoadMem(asm.R5, asm.RFP, stDev, asm.Word),
		asm.StoreMem(asm.RFP, fibIfindex, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R2, ipTOS, asm.Byte),
		asm.StoreMem(asm.RFP, fibTOS, asm.R5, asm.Byte),
		asm.LoadMem(asm.R5, asm.R2, ipSrc, asm.Word),
		asm.StoreMem(asm.RFP, fibSrc, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R2, ipDst, asm.Word),
		asm.StoreMem(asm.RFP, fibDst, asm.R5, asm.Word),
		asm.StoreMem(asm.RFP, stHost, asm.R5, asm.Word), // the hosts key, for later
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stFib),
		asm.Mov.Imm(asm.R3, fibSize),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnFibLookup.Call(),
		asm.JNE.Imm(asm.R0, 0, "pass"), // BPF_FIB_LKUP_RET_SUCCESS only
		asm.LoadMem(asm.R5, asm.RFP, fibIfindex, asm.Word),
		asm.JNE.Reg(asm.R5, asm.R7, "pass"),
	})
	// The TTL, less one, with the header checksum fixed (the TTL is the
	// low byte of the 16-bit word as loaded, and above 1). Once the packet
	// is changed, a failed write drops it (a sender retransmits) rather
	// than let a half-rewritten packet on.
	add(reload(), asm.Instructions{
		asm.LoadMem(asm.R8, asm.R2, ipTTL, asm.Half),
		asm.Mov.Reg(asm.R9, asm.R8),
		asm.Add.Imm(asm.R9, -1),
		asm.StoreMem(asm.RFP, stTTL, asm.R9, asm.Half),
	}, storeBytes(ipTTL, stTTL, 2, "pass"), asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, ipCsum),
		asm.Mov.Reg(asm.R3, asm.R8),
		asm.Mov.Reg(asm.R4, asm.R9),
		asm.Mov.Imm(asm.R5, 2), // the field's size
		asm.FnL3CsumReplace.Call(),
		asm.JNE.Imm(asm.R0, 0, "drop"),
	}, storeBytes(ethDst, fibDMAC, 6, "drop"), storeBytes(ethSrc, fibSMAC, 6, "drop"))
	// Count it (a per-CPU slot: no atomics needed).
	add(asm.Instructions{
		asm.StoreImm(asm.RFP, stCounter, counterAll, asm.Word),
	}, lookup(m.counter, stCounter, "peer"), asm.Instructions{
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
	})
	// To a container here whose port and MAC are known, and still agree
	// with the FIB's neighbour and the ports: into its namespace.
	add(asm.Instructions{
		asm.LoadMem(asm.R5, asm.RFP, stDstKind, asm.Word).WithSymbol("peer"),
		asm.JNE.Imm(asm.R5, int32(KindLocal), "redirect"),
	}, lookup(m.hosts, stHost, "redirect"), sameMAC(asm.R0, hostMAC, asm.RFP, fibDMAC, "redirect"), asm.Instructions{
		asm.LoadMem(asm.R8, asm.R0, hostPort, asm.Word),
		asm.StoreMem(asm.RFP, stPort, asm.R8, asm.Word),
	}, lookup(m.ports, stPort, "redirect"), asm.Instructions{
		asm.LoadMem(asm.R5, asm.R0, portBridge, asm.Word),
		asm.JNE.Reg(asm.R5, asm.R7, "redirect"),
		asm.StoreImm(asm.RFP, stCounter, counterPeer, asm.Word),
	}, lookup(m.counter, stCounter, "intopeer"), asm.Instructions{
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R8).WithSymbol("intopeer"),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirectPeer.Call(),
		asm.Return(),
		asm.Mov.Reg(asm.R1, asm.R7).WithSymbol("redirect"),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcActShot).WithSymbol("drop"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcActUnspec).WithSymbol("pass"),
		asm.Return(),
	})
	return p
}
