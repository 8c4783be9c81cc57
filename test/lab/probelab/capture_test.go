package probelab

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// pcapOf is a little-endian pcap stream of Ethernet frames.
func pcapOf(linkType uint32, frames ...[]byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 0xa1b2c3d4)
	b = binary.LittleEndian.AppendUint16(b, 2)
	b = binary.LittleEndian.AppendUint16(b, 4)
	b = append(b, make([]byte, 8)...) // thiszone, sigfigs
	b = binary.LittleEndian.AppendUint32(b, 65535)
	b = binary.LittleEndian.AppendUint32(b, linkType)
	for _, f := range frames {
		b = append(b, make([]byte, 8)...) // ts
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return b
}

// udpFrame is an Ethernet frame carrying an IPv4 UDP header.
func udpFrame(src, dst string, sport, dport uint16) []byte {
	f := make([]byte, 14+20+8)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[9] = 0x45, 17
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[20:], sport)
	binary.BigEndian.PutUint16(ip[22:], dport)
	return f
}

// TestParsePcap keeps the IPv4 packets of a stream, with their ports, skips
// other frames and a record cut short, and refuses what is not a pcap
// stream of Ethernet frames.
func TestParsePcap(t *testing.T) {
	arp := make([]byte, 42)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	udp := udpFrame("198.18.0.11", "198.18.0.12", 40000, 4789)
	whole := pcapOf(1, arp, udp)
	tests := []struct {
		name    string
		in      []byte
		want    int
		wantErr bool
	}{
		{"ipv4 kept, arp skipped", whole, 1, false},
		{"last record cut short", append(pcapOf(1, udp), 1, 2, 3, 4, 5, 6, 7, 8, 100, 0, 0, 0, 100, 0, 0, 0, 1), 1, false},
		{"no header", []byte{1, 2, 3}, 0, true},
		{"not pcap", make([]byte, 24), 0, true},
		{"not ethernet", pcapOf(101, udp), 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePcap(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if len(got) != tc.want {
				t.Fatalf("%d packets %v, want %d", len(got), got, tc.want)
			}
			if tc.want > 0 {
				p := got[0]
				if p.Src != netip.MustParseAddr("198.18.0.11") || p.Dst != netip.MustParseAddr("198.18.0.12") || p.Proto != 17 || p.SrcPort != 40000 || p.DstPort != 4789 {
					t.Fatalf("packet %v", p)
				}
			}
		})
	}
}

// FuzzParsePcap: no stream makes the parser panic.
func FuzzParsePcap(f *testing.F) {
	f.Add(pcapOf(1, udpFrame("198.18.0.11", "198.18.0.12", 1, 2)))
	f.Add(pcapOf(1, []byte{0, 1, 2}))
	f.Add([]byte{0xd4, 0xc3, 0xb2, 0xa1})
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = parsePcap(b) })
}
