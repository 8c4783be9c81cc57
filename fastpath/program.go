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
	stKey     = -8  // the LPM key: prefix length (32), then the address
	stFib     = -72 // struct bpf_fib_lookup, 64 bytes, up to -9
	stTTL     = -80 // the new TTL and protocol word
	stCounter = -88 // the counter's key (0)

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

	// valueIfindex and valueKind are the fields of a blocks entry (entry).
	valueIfindex = 0
	valueKind    = 4

	tcActUnspec = -1 // TCX_NEXT: the next program, or the kernel's own path
	tcActShot   = 2  // TCX_DROP
)

// program is the fast path's classifier, written with cilium/ebpf's
// assembler so that carve ships no compiled object and needs no compiler.
// For an IPv4 packet with a TTL above 1 it looks up the source and the
// destination in blocks (longest prefix match). It acts only when
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
// gave, counts the packet and redirects it to that device's egress. Every
// other packet goes on, untouched, to the kernel's own path: ARP,
// unresolved neighbours, TTL 1 (the ICMP error is the stack's), a packet
// too big for the egress device (FIB: fragmentation needed), anything a
// route or rule of the operator's sends elsewhere.
func program(blocks, counter *ebpf.Map) asm.Instructions {
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
	// lookup looks up the address at the packet's offset off in blocks,
	// leaving the entry in R0 (passing when there is none).
	lookup := func(off int16) asm.Instructions {
		return asm.Instructions{
			asm.LoadMem(asm.R5, asm.R2, off, asm.Word),
			asm.StoreMem(asm.RFP, stKey+4, asm.R5, asm.Word),
			asm.LoadMapPtr(asm.R1, blocks.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, stKey),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "pass"),
		}
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
	})
	// The source: its entry must name the ingress device; R8 keeps its kind.
	add(lookup(ipSrc), asm.Instructions{
		asm.LoadMem(asm.R5, asm.R0, valueIfindex, asm.Word),
		asm.LoadMem(asm.R4, asm.R6, skbIfindex, asm.Word),
		asm.JNE.Reg(asm.R5, asm.R4, "pass"),
		asm.LoadMem(asm.R8, asm.R0, valueKind, asm.Word),
	})
	// The destination: of the other kind; R7 keeps its device.
	add(reload(), lookup(ipDst), asm.Instructions{
		asm.LoadMem(asm.R5, asm.R0, valueKind, asm.Word),
		asm.JEq.Reg(asm.R5, asm.R8, "pass"),
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
		asm.LoadMem(asm.R5, asm.R6, skbIfindex, asm.Word),
		asm.StoreMem(asm.RFP, fibIfindex, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R2, ipTOS, asm.Byte),
		asm.StoreMem(asm.RFP, fibTOS, asm.R5, asm.Byte),
		asm.LoadMem(asm.R5, asm.R2, ipSrc, asm.Word),
		asm.StoreMem(asm.RFP, fibSrc, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R2, ipDst, asm.Word),
		asm.StoreMem(asm.RFP, fibDst, asm.R5, asm.Word),
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
	}, storeBytes(0, fibDMAC, 6, "drop"), storeBytes(6, fibSMAC, 6, "drop"))
	// Count it (a per-CPU slot: no atomics needed) and send it on.
	add(asm.Instructions{
		asm.StoreImm(asm.RFP, stCounter, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, counter.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stCounter),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "redirect"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
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
