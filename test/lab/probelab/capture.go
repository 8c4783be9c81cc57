package probelab

// Captures of the underlay: tcpdump on the lab's underlay bridge, in the
// underlay namespace, and the IPv4 packets it saw.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
)

// Capture is a running tcpdump on the underlay bridge.
type Capture struct {
	cmd    *exec.Cmd
	out    lockedBuffer  // the pcap stream
	stderr lockedBuffer  // what tcpdump said
	done   chan struct{} // closed when tcpdump exited
}

// StartCapture starts tcpdump (Debian's package) on lab's underlay bridge,
// whole packets, each written as it comes (--immediate-mode: a packet
// still in the kernel's buffer when tcpdump stops would be lost), and
// returns once it listens.
func StartCapture(ctx context.Context, lab *netnslab.Lab) (*Capture, error) {
	path, err := exec.LookPath("tcpdump")
	if err != nil {
		return nil, fmt.Errorf("probelab: capture needs tcpdump (deploy/install-deps.sh installs it): %w", err)
	}
	cp := &Capture{done: make(chan struct{})}
	cp.cmd = exec.Command(path, "--immediate-mode", "-i", netnslab.UnderlayBridge, "-n", "-U", "-s", "0", "-w", "-")
	cp.cmd.Stdout = &cp.out
	pr, pw := io.Pipe()
	cp.cmd.Stderr = pw
	if err := lab.Underlay.Start(cp.cmd); err != nil {
		return nil, fmt.Errorf("probelab: start tcpdump: %w", err)
	}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := false
		for sc.Scan() {
			_, _ = cp.stderr.Write([]byte(sc.Text() + "\n"))
			if !once && strings.Contains(sc.Text(), "listening on") {
				once = true
				close(listening)
			}
		}
	}()
	go func() {
		_ = cp.cmd.Wait()
		pw.Close()
		close(cp.done)
	}()
	select {
	case <-listening:
		return cp, nil
	case <-cp.done:
		return nil, fmt.Errorf("probelab: tcpdump exited: %s", cp.stderr.bytes())
	case <-ctx.Done():
		_ = cp.cmd.Process.Kill()
		return nil, fmt.Errorf("probelab: tcpdump did not start listening: %w", ctx.Err())
	case <-time.After(10 * time.Second):
		_ = cp.cmd.Process.Kill()
		return nil, errors.New("probelab: tcpdump did not start listening within 10s")
	}
}

// Stop ends the capture (SIGINT, by its PID) and returns the IPv4 packets
// it saw.
func (cp *Capture) Stop() ([]Packet, error) {
	_ = cp.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-cp.done:
		return cp.Packets()
	case <-time.After(10 * time.Second):
		_ = cp.cmd.Process.Kill()
		<-cp.done
		return nil, fmt.Errorf("probelab: tcpdump did not stop on SIGINT: %s", cp.stderr.bytes())
	}
}

// Packets are the IPv4 packets captured so far.
func (cp *Capture) Packets() ([]Packet, error) {
	return parsePcap(cp.out.bytes())
}

// lockedBuffer is the pcap stream, written by tcpdump's output copier and
// read by Packets meanwhile.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// Packet is one IPv4 packet seen on the underlay.
type Packet struct {
	Src, Dst netip.Addr
	// Proto is the IP protocol (6 TCP, 17 UDP, 1 ICMP).
	Proto            uint8
	SrcPort, DstPort uint16 // TCP and UDP
	// Data is the whole frame, Ethernet header included.
	Data []byte
}

// String is a tcpdump-like summary.
func (p Packet) String() string {
	return fmt.Sprintf("%s:%d > %s:%d proto %d len %d", p.Src, p.SrcPort, p.Dst, p.DstPort, p.Proto, len(p.Data))
}

// parsePcap reads a pcap stream of Ethernet frames and keeps the IPv4
// packets.
func parsePcap(b []byte) ([]Packet, error) {
	if len(b) < 24 {
		return nil, errors.New("probelab: capture: no pcap header")
	}
	var order binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		order = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		order = binary.BigEndian
	default:
		return nil, errors.New("probelab: capture: not a pcap stream")
	}
	if lt := order.Uint32(b[20:]); lt != 1 {
		return nil, fmt.Errorf("probelab: capture: link type %d, want Ethernet", lt)
	}
	var out []Packet
	for b = b[24:]; len(b) >= 16; {
		n := int(order.Uint32(b[8:]))
		if len(b) < 16+n {
			break // cut short by the SIGINT
		}
		frame := b[16 : 16+n]
		b = b[16+n:]
		if len(frame) < 34 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
			continue
		}
		ip := frame[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ihl < 20 || len(ip) < ihl {
			continue
		}
		p := Packet{Proto: ip[9], Data: frame}
		p.Src, _ = netip.AddrFromSlice(ip[12:16])
		p.Dst, _ = netip.AddrFromSlice(ip[16:20])
		if (p.Proto == 6 || p.Proto == 17) && len(ip) >= ihl+4 {
			p.SrcPort = binary.BigEndian.Uint16(ip[ihl:])
			p.DstPort = binary.BigEndian.Uint16(ip[ihl+2:])
		}
		out = append(out, p)
	}
	return out, nil
}
