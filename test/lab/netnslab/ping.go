package netnslab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carve-net/carve/internal/retry"
)

// DefaultPingTimeout bounds one echo when the context carries no deadline,
// like `ping -c1 -W1`.
const DefaultPingTimeout = time.Second

var pingSeq atomic.Uint32

// ErrNotSent is a ping whose deadline passed before its echo request was
// sent (the caller's goroutine or the switch into the namespace stalled, as
// on a loaded machine): it says nothing about the path.
var ErrNotSent = errors.New("the deadline passed before the echo request was sent")

// Ping sends one ICMP (or ICMPv6) echo request to dst from inside the
// namespace and waits for the matching reply until ctx's deadline or
// DefaultPingTimeout. It uses a raw socket opened inside the namespace (a
// socket stays bound to the namespace it was created in), so it needs no
// ping binary and never sends anything from the caller's namespace.
func (n *Namespace) Ping(ctx context.Context, dst netip.Addr) error {
	return n.ping(ctx, dst, 32, false)
}

// PingDF is Ping with payload bytes of echo data (the ICMP header's 8 and
// the IP header come on top) and fragmentation forbidden: the kernel
// refuses a packet bigger than the path MTU it knows with an error wrapping
// unix.EMSGSIZE ("message too long"), as `ping -M do -s payload` reports it,
// and a packet the path drops on the way gets no reply.
func (n *Namespace) PingDF(ctx context.Context, dst netip.Addr, payload int) error {
	if payload < 0 || payload > 65507 {
		return fmt.Errorf("netnslab: ping payload %d: want 0-65507", payload)
	}
	return n.ping(ctx, dst, payload, true)
}

func (n *Namespace) ping(ctx context.Context, dst netip.Addr, payload int, df bool) error {
	dst = dst.Unmap()
	if !dst.IsValid() {
		return errors.New("netnslab: ping: invalid address")
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultPingTimeout)
	}
	af, proto, reqType, replyType := unix.AF_INET6, unix.IPPROTO_ICMPV6, byte(128), byte(129)
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
	if dst.Is4() {
		af, proto, reqType, replyType = unix.AF_INET, unix.IPPROTO_ICMP, 8, 0
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	}
	fd := -1
	err := n.Do(func() error {
		var err error
		fd, err = unix.Socket(af, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil || !df {
			return err
		}
		if af == unix.AF_INET {
			err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		} else {
			err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
		}
		if err != nil {
			unix.Close(fd)
			fd = -1
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("netnslab: ping socket in %s: %w", n.Name, err)
	}
	defer unix.Close(fd)
	// connect() makes the kernel hand us only packets from dst.
	if err := unix.Connect(fd, sa); err != nil {
		return fmt.Errorf("netnslab: ping %s from %s: %w", dst, n.Name, err)
	}

	id := uint16(rand.Uint32())
	seq := uint16(pingSeq.Add(1))
	pkt := make([]byte, 8+payload)
	pkt[0] = reqType
	binary.BigEndian.PutUint16(pkt[4:], id)
	binary.BigEndian.PutUint16(pkt[6:], seq)
	for i := 8; i < len(pkt); i++ {
		pkt[i] = byte(i)
	}
	if dst.Is4() {
		binary.BigEndian.PutUint16(pkt[2:], checksum(pkt))
	} // the kernel fills in ICMPv6 checksums on raw ICMPv6 sockets
	if time.Now().After(deadline) {
		return fmt.Errorf("netnslab: ping %s from %s: %w", dst, n.Name, errors.Join(ErrNotSent, ctx.Err()))
	}
	if _, err := unix.Write(fd, pkt); err != nil {
		return fmt.Errorf("netnslab: ping %s from %s: %w", dst, n.Name, err)
	}

	buf := make([]byte, max(1500, len(pkt)+60))
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("netnslab: ping %s from %s: %w", dst, n.Name, err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("netnslab: ping %s from %s: no reply", dst, n.Name)
		}
		// Short slices so that a cancelled context is noticed quickly.
		tv := unix.NsecToTimeval(min(left, 100*time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		nr, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("netnslab: ping %s from %s: %w", dst, n.Name, err)
		}
		msg := buf[:nr]
		if dst.Is4() { // raw IPv4 sockets deliver the IP header too
			if len(msg) < 20 {
				continue
			}
			ihl := int(msg[0]&0x0f) * 4
			if len(msg) < ihl {
				continue
			}
			msg = msg[ihl:]
		}
		if len(msg) >= 8 && msg[0] == replyType &&
			binary.BigEndian.Uint16(msg[4:]) == id && binary.BigEndian.Uint16(msg[6:]) == seq {
			return nil
		}
	}
}

// PingRetry pings up to attempts times (each with DefaultPingTimeout, within
// ctx) and returns nil on the first reply: the first packets of a fresh path
// may be lost while neighbours resolve.
func (n *Namespace) PingRetry(ctx context.Context, dst netip.Addr, attempts int) error {
	_, _, err := n.PingEchoes(ctx, dst, attempts)
	return err
}

// pingRetryInterval spaces echoes that fail at once (no route, say); one
// that times out is followed by the next immediately.
const pingRetryInterval = 100 * time.Millisecond

// PingEchoes is PingRetry that also tells how many echoes it sent and the
// round trip of the one answered (zero when none was).
func (n *Namespace) PingEchoes(ctx context.Context, dst netip.Addr, attempts int) (sent int, rtt time.Duration, err error) {
	attempts = max(attempts, 1)
	err = retry.Until(ctx, pingRetryInterval, func() error {
		sent++
		pctx, cancel := context.WithTimeout(ctx, DefaultPingTimeout)
		defer cancel()
		start := time.Now()
		err := n.Ping(pctx, dst)
		if err == nil {
			rtt = time.Since(start)
			return nil
		}
		if sent >= attempts {
			return retry.Permanent(err)
		}
		return err
	})
	return sent, rtt, err
}

// checksum is the Internet checksum (RFC 1071).
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
