package vxlan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// carve speaks rtnetlink directly (netlink*.go) for the per-peer entries,
// because they are the part that scales with the cluster: instead of one
// request and one acknowledgement per entry (two system calls and a wake-up
// each), a batch of messages goes out in one sendmsg and only failures are
// answered, plus one acknowledgement that closes the batch. Reading back is
// one dump per table.

var (
	errNoEntry = unix.ENOENT // neighbour / FDB entry already gone
	errNoRoute = unix.ESRCH  // route already gone
	// errAckLost marks entries whose outcome is unknown because the kernel
	// dropped acknowledgements (receive buffer overrun); they are retried.
	errAckLost = errors.New("netlink acknowledgement lost, outcome unknown")
)

var native = binary.NativeEndian

// Kernel constants not exported by x/sys/unix under these names.
const (
	ndaDst      = 1
	ndaLLAddr   = 2
	ndaPort     = 6
	ndaVNI      = 7
	ndaIfindex  = 8
	ndaProtocol = 12

	rtaDst       = 1
	rtaOif       = 4
	rtaGateway   = 5
	rtaPriority  = 6
	rtaMultipath = 9
	rtaTable     = 15
	rtaVia       = 18

	sizeofNdmsg     = 12
	sizeofRtmsg     = 12
	sizeofIfinfomsg = 16
	sizeofNlmsghdr  = 16

	maxBatchBytes = 64 << 10 // well under the default socket send buffer
	rcvBufSize    = 8 << 20
	sockTimeout   = 30 * time.Second
)

// nlSocket is a NETLINK_ROUTE socket opened inside the dataplane's namespace
// (a socket stays in the namespace it was created in, whatever thread uses it).
type nlSocket struct {
	fd       int
	seq      uint32
	rbuf     []byte
	maxBatch int // messages per sendmsg, bounded by what the receive buffer holds
}

// openSocket opens the socket with inNS, which runs a function inside the
// namespace to program.
func openSocket(inNS func(func() error) error) (*nlSocket, error) {
	fd := -1
	err := inNS(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	s := &nlSocket{fd: fd, seq: uint32(time.Now().UnixNano()), rbuf: make([]byte, 1<<20)}
	fail := func(err error) (*nlSocket, error) {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fail(fmt.Errorf("netlink bind: %w", err))
	}
	// Errors carry only the failing message's header, not a copy of it, and
	// a text message from the kernel when it has one.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	// A big receive buffer so that the kernel never drops error messages of
	// a batch; FORCE needs CAP_NET_ADMIN, which programming routes needs anyway.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBufSize); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBufSize)
	}
	tv := unix.NsecToTimeval(sockTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail(err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return fail(err)
	}
	// An error message costs about 1 KiB of receive buffer (skb overhead);
	// size batches so that all of them failing still fits, twice over.
	rb, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		rb = 212992
	}
	s.maxBatch = min(max(rb/4096, 16), 1024)
	return s, nil
}

func (s *nlSocket) close() {
	if s != nil && s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// exec sends the batch in chunks and returns one error per message (nil on
// success). Messages carry no ACK flag except the last of each chunk: the
// kernel processes a chunk synchronously inside sendmsg, reporting each
// failure, so once the closing acknowledgement arrives every failure of the
// chunk has been read. canceled is checked between chunks.
func (s *nlSocket) exec(b *batch, canceled func() error) []error {
	errs := make([]error, b.len())
	for i := 0; i < b.len(); {
		if err := canceled(); err != nil {
			for k := i; k < b.len(); k++ {
				errs[k] = err
			}
			return errs
		}
		j := i + 1
		for j < b.len() && j-i < s.maxBatch && b.msgEnd(j)-b.offs[i] <= maxBatchBytes {
			j++
		}
		s.execChunk(b, i, j, errs)
		i = j
	}
	return errs
}

func (s *nlSocket) execChunk(b *batch, i, j int, errs []error) {
	base := s.seq + 1
	for k := i; k < j; k++ {
		h := b.buf[b.offs[k]:]
		native.PutUint32(h[8:], base+uint32(k-i))
		fl := native.Uint16(h[6:]) &^ unix.NLM_F_ACK
		if k == j-1 {
			fl |= unix.NLM_F_ACK
		}
		native.PutUint16(h[6:], fl)
	}
	s.seq = base + uint32(j-i-1)
	last := s.seq
	setAll := func(err error) {
		for k := i; k < j; k++ {
			if errs[k] == nil {
				errs[k] = err
			}
		}
	}
	if err := unix.Sendto(s.fd, b.buf[b.offs[i]:b.msgEnd(j-1)], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		setAll(fmt.Errorf("netlink send: %w", err))
		return
	}
	lost := false
	for {
		n, _, err := unix.Recvfrom(s.fd, s.rbuf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOBUFS) {
			lost = true // some error messages were dropped; keep reading
			continue
		}
		if err != nil {
			setAll(fmt.Errorf("netlink receive: %w", err))
			return
		}
		done := false
		forEachMsg(s.rbuf[:n], func(h *unix.NlMsghdr, data []byte) {
			if h.Type != unix.NLMSG_ERROR || h.Seq < base || h.Seq > last || len(data) < 4 {
				return
			}
			if errno := -int32(native.Uint32(data)); errno != 0 {
				errs[i+int(h.Seq-base)] = ackError(h, data, unix.Errno(errno))
			}
			if h.Seq == last {
				done = true
			}
		})
		if done {
			break
		}
	}
	if lost {
		setAll(errAckLost)
	}
}

// ackError adds the kernel's extended-ack message, when there is one.
func ackError(h *unix.NlMsghdr, data []byte, errno unix.Errno) error {
	if h.Flags&unix.NLM_F_ACK_TLVS == 0 || len(data) < 4+sizeofNlmsghdr {
		return errno
	}
	// With NETLINK_CAP_ACK only the header of the request is echoed.
	off := 4 + sizeofNlmsghdr
	if h.Flags&unix.NLM_F_CAPPED == 0 {
		off = 4 + int(native.Uint32(data[4:]))
	}
	if off > len(data) {
		return errno
	}
	msg := ""
	forEachAttr(data[off:], func(typ uint16, v []byte) {
		if typ == unix.NLMSGERR_ATTR_MSG && len(v) > 0 {
			msg = string(trimNul(v))
		}
	})
	if msg == "" {
		return errno
	}
	return fmt.Errorf("%w (%s)", errno, msg)
}

func trimNul(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

// forEachMsg walks the netlink messages of one datagram.
func forEachMsg(b []byte, fn func(h *unix.NlMsghdr, data []byte)) {
	for len(b) >= sizeofNlmsghdr {
		h := unix.NlMsghdr{
			Len:   native.Uint32(b[0:]),
			Type:  native.Uint16(b[4:]),
			Flags: native.Uint16(b[6:]),
			Seq:   native.Uint32(b[8:]),
			Pid:   native.Uint32(b[12:]),
		}
		if h.Len < sizeofNlmsghdr || int(h.Len) > len(b) {
			return
		}
		fn(&h, b[sizeofNlmsghdr:h.Len])
		adv := (int(h.Len) + 3) &^ 3
		if adv > len(b) {
			return
		}
		b = b[adv:]
	}
}

// forEachAttr walks rtattrs.
func forEachAttr(b []byte, fn func(typ uint16, v []byte)) {
	for len(b) >= 4 {
		l := int(native.Uint16(b[0:]))
		if l < 4 || l > len(b) {
			return
		}
		fn(native.Uint16(b[2:])&^unix.NLA_F_NESTED, b[4:l])
		adv := (l + 3) &^ 3
		if adv > len(b) {
			return
		}
		b = b[adv:]
	}
}

// dump sends one dump request and calls fn for every answer. A dump that
// the kernel flags as interrupted (the table changed while it was read) is
// started again, so fn may see a prefix of the answers twice: reset is
// called before each attempt. (netlinksafe does this for the netlink
// library's calls; these dumps are carve's own, on its batch socket.)
func (s *nlSocket) dump(typ uint16, hdr []byte, reset func(), fn func(data []byte)) error {
	for attempt := 0; ; attempt++ {
		reset()
		intr, err := s.dumpOnce(typ, hdr, fn)
		if err != nil {
			return err
		}
		if !intr {
			return nil
		}
		if attempt == 4 {
			return errors.New("netlink dump interrupted 5 times in a row")
		}
	}
}

func (s *nlSocket) dumpOnce(typ uint16, hdr []byte, fn func(data []byte)) (interrupted bool, err error) {
	var b batch
	b.begin(typ, unix.NLM_F_DUMP)
	b.raw(hdr)
	b.end()
	s.seq++
	seq := s.seq
	native.PutUint32(b.buf[8:], seq)
	if err := unix.Sendto(s.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("netlink dump: %w", err)
	}
	for {
		n, _, err := unix.Recvfrom(s.fd, s.rbuf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("netlink dump: %w", err)
		}
		done := false
		var derr error
		forEachMsg(s.rbuf[:n], func(h *unix.NlMsghdr, data []byte) {
			if h.Seq != seq || done {
				return
			}
			if h.Flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch h.Type {
			case unix.NLMSG_DONE:
				done = true
			case unix.NLMSG_ERROR:
				if len(data) >= 4 {
					if errno := -int32(native.Uint32(data)); errno != 0 {
						derr = unix.Errno(errno)
					}
				}
				done = true
			default:
				fn(data)
			}
		})
		if derr != nil {
			return false, fmt.Errorf("netlink dump: %w", derr)
		}
		if done {
			return interrupted, nil
		}
	}
}
