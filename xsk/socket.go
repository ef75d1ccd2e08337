package xsk

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Mode is how a socket moves packets between the device and the UMEM.
type Mode int

const (
	// ModeAuto asks for zero-copy and falls back to copy mode when the
	// device cannot do it (the kernel's behaviour when bind names neither).
	// Socket.Mode tells which one the socket got.
	ModeAuto Mode = iota
	// ModeCopy copies packets between skbs or driver buffers and the UMEM
	// (XDP_COPY). Works on every device with XDP, veth included.
	ModeCopy
	// ModeZeroCopy has the driver DMA straight into the UMEM (XDP_ZEROCOPY);
	// NewSocket fails with ErrNoZeroCopy where the driver cannot.
	ModeZeroCopy
)

// String returns "auto", "copy" or "zero-copy".
func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeCopy:
		return "copy"
	case ModeZeroCopy:
		return "zero-copy"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// DefaultRingSize is the default number of entries of every ring.
const DefaultRingSize = 2048

// SocketOptions describe a socket. Ring sizes are powers of two; zero means
// DefaultRingSize.
type SocketOptions struct {
	// Ifindex is the interface to bind to, in the network namespace of the
	// thread that calls NewSocket.
	Ifindex int
	// QueueID is the interface's receive (and transmit) queue. The socket
	// receives only what the device steers to this queue and the XDP program
	// redirects to this socket.
	QueueID uint32
	// RXSize and TXSize are the sizes of the RX and TX rings.
	RXSize, TXSize uint32
	// FillSize and CompletionSize are the sizes of the fill and completion
	// rings, used when the socket gets a pair of its own (the first socket
	// on a queue); a socket joining a queue that another socket of the UMEM
	// uses shares that socket's pair and ignores them.
	FillSize, CompletionSize uint32
	// Mode selects copy or zero-copy. Sockets after the first over a UMEM
	// inherit the first one's mode from the kernel: a Mode other than
	// ModeAuto that contradicts it fails with ErrInvalidOptions.
	Mode Mode
	// NoNeedWakeup binds without XDP_USE_NEED_WAKEUP: the kernel then
	// never sets the need_wakeup flags, every TX submit needs a Kick (so
	// TXQueue.NeedWakeup is always true) and, in zero-copy mode, the driver
	// polls the fill ring itself. With need_wakeup (the default) the kernel
	// says when it must be woken, which saves system calls under load.
	// Sockets after the first over a UMEM must agree with it.
	NoNeedWakeup bool
}

func (o *SocketOptions) setDefaults() error {
	for _, p := range []*uint32{&o.RXSize, &o.TXSize, &o.FillSize, &o.CompletionSize} {
		if *p == 0 {
			*p = DefaultRingSize
		}
		if !isPowerOfTwo(*p) {
			return fmt.Errorf("%w: ring size %d is not a power of two", ErrInvalidOptions, *p)
		}
	}
	if o.Ifindex <= 0 {
		return fmt.Errorf("%w: interface index %d", ErrInvalidOptions, o.Ifindex)
	}
	if o.Mode < ModeAuto || o.Mode > ModeZeroCopy {
		return fmt.Errorf("%w: mode %v", ErrInvalidOptions, o.Mode)
	}
	return nil
}

// ringPair is a fill and completion ring pair, shared by the sockets of one
// buffer pool (one UMEM on one queue).
type ringPair struct {
	fill       FillQueue
	completion CompletionQueue
	fillMem    []byte
	compMem    []byte
	refs       int
}

func (p *ringPair) unmap() error {
	p.fill.detach()
	p.completion.detach()
	var errs []error
	for _, m := range []*[]byte{&p.fillMem, &p.compMem} {
		if *m != nil {
			errs = append(errs, unix.Munmap(*m))
			*m = nil
		}
	}
	return errors.Join(errs...)
}

// Socket is an AF_XDP socket bound to one queue of one interface, with its
// RX and TX rings and the fill and completion rings of its buffer pool. The
// rings are not safe for concurrent use: one goroutine drives a socket.
type Socket struct {
	fd      int
	umem    *UMEM
	ifindex int
	queue   uint32
	mode    Mode

	rx    RXQueue
	tx    TXQueue
	rxMem []byte
	txMem []byte
	pair  *ringPair

	pfd    [1]unix.PollFd
	closed bool
}

// NewSocket creates an AF_XDP socket over u, binds it to opts.Ifindex and
// opts.QueueID, and maps its rings. The first socket over u registers it with
// the kernel; later ones bind with XDP_SHARED_UMEM: a later socket on a new
// queue gets a fill and completion ring pair of its own, one on a queue that
// an open socket of u already uses shares that socket's pair.
//
// A queue that a socket closed a moment ago may still be busy in the kernel;
// NewSocket retries bind for up to a second while it is.
//
// The socket belongs to the network namespace of the calling thread.
// Packets reach it only through an XDP program that redirects them into an
// XSKMAP entry holding FD().
func NewSocket(u *UMEM, opts SocketOptions) (_ *Socket, err error) {
	if err := opts.setDefaults(); err != nil {
		return nil, fmt.Errorf("new xsk socket: %w", err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, fmt.Errorf("new xsk socket: %w", ErrClosed)
	}
	needWakeup := !opts.NoNeedWakeup
	if len(u.sockets) > 0 && needWakeup != u.needWakeup {
		return nil, fmt.Errorf("new xsk socket: %w: need_wakeup %v, but the UMEM's first socket has %v",
			ErrInvalidOptions, needWakeup, u.needWakeup)
	}

	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("new xsk socket: socket(AF_XDP): %w", err)
	}
	s := &Socket{fd: fd, umem: u, ifindex: opts.Ifindex, queue: opts.QueueID}
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	where := fmt.Sprintf("ifindex %d queue %d", opts.Ifindex, opts.QueueID)

	// Pick the socket to share with: one on the same queue shares its pool
	// (and fill/completion rings); any other shares only the UMEM.
	var peer *Socket
	for _, o := range u.sockets {
		if o.ifindex == opts.Ifindex && o.queue == opts.QueueID {
			peer = o
			break
		}
	}
	sa := unix.SockaddrXDP{Ifindex: uint32(opts.Ifindex), QueueID: opts.QueueID}
	switch {
	case peer != nil:
		s.pair = peer.pair
		s.pair.refs++
		sa.Flags = unix.XDP_SHARED_UMEM
		sa.SharedUmemFD = uint32(peer.fd)
	case len(u.sockets) > 0:
		sa.Flags = unix.XDP_SHARED_UMEM
		sa.SharedUmemFD = uint32(u.sockets[0].fd)
	default:
		reg := unix.XDPUmemReg{
			Addr:     addressOf(u.mem),
			Len:      uint64(len(u.mem)),
			Size:     u.frameSize,
			Headroom: u.headroom,
		}
		if err := registerUMEM(fd, &reg); err != nil {
			return nil, fmt.Errorf("new xsk socket %s: register umem: %w", where, err)
		}
		switch opts.Mode {
		case ModeCopy:
			sa.Flags = unix.XDP_COPY
		case ModeZeroCopy:
			sa.Flags = unix.XDP_ZEROCOPY
		}
		if needWakeup {
			sa.Flags |= unix.XDP_USE_NEED_WAKEUP
		}
	}

	// Ring sizes, then the layout, then the mappings, then bind.
	type ringSize struct {
		name string
		opt  int
		size uint32
	}
	sizes := []ringSize{{"rx", unix.XDP_RX_RING, opts.RXSize}, {"tx", unix.XDP_TX_RING, opts.TXSize}}
	if s.pair == nil {
		sizes = append(sizes, ringSize{"fill", unix.XDP_UMEM_FILL_RING, opts.FillSize},
			ringSize{"completion", unix.XDP_UMEM_COMPLETION_RING, opts.CompletionSize})
	}
	for _, r := range sizes {
		if err := setRingSize(fd, r.opt, r.size); err != nil {
			return nil, fmt.Errorf("new xsk socket %s: %s ring size %d: %w", where, r.name, r.size, err)
		}
	}
	off, err := mmapOffsets(fd)
	if err != nil {
		return nil, fmt.Errorf("new xsk socket %s: XDP_MMAP_OFFSETS: %w", where, err)
	}
	if s.pair == nil {
		s.pair = &ringPair{refs: 1}
		p := s.pair
		if p.fillMem, err = mapRing(fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, opts.FillSize, addrSize); err != nil {
			return nil, fmt.Errorf("new xsk socket %s: mmap fill ring: %w", where, err)
		}
		if err := p.fill.attach(p.fillMem, off.Fr, opts.FillSize); err != nil {
			return nil, fmt.Errorf("new xsk socket %s: fill ring: %w", where, err)
		}
		if p.compMem, err = mapRing(fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, opts.CompletionSize, addrSize); err != nil {
			return nil, fmt.Errorf("new xsk socket %s: mmap completion ring: %w", where, err)
		}
		if err := p.completion.attach(p.compMem, off.Cr, opts.CompletionSize); err != nil {
			return nil, fmt.Errorf("new xsk socket %s: completion ring: %w", where, err)
		}
	}
	if s.rxMem, err = mapRing(fd, unix.XDP_PGOFF_RX_RING, off.Rx, opts.RXSize, descSize); err != nil {
		return nil, fmt.Errorf("new xsk socket %s: mmap rx ring: %w", where, err)
	}
	if err := s.rx.attach(s.rxMem, off.Rx, opts.RXSize); err != nil {
		return nil, fmt.Errorf("new xsk socket %s: rx ring: %w", where, err)
	}
	if s.txMem, err = mapRing(fd, unix.XDP_PGOFF_TX_RING, off.Tx, opts.TXSize, descSize); err != nil {
		return nil, fmt.Errorf("new xsk socket %s: mmap tx ring: %w", where, err)
	}
	if err := s.tx.attach(s.txMem, off.Tx, opts.TXSize); err != nil {
		return nil, fmt.Errorf("new xsk socket %s: tx ring: %w", where, err)
	}
	s.tx.alwaysKick = !needWakeup

	if err := bind(fd, &sa); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) && sa.Flags&unix.XDP_ZEROCOPY != 0 {
			return nil, fmt.Errorf("new xsk socket %s: bind: %w (%w)", where, ErrNoZeroCopy, err)
		}
		return nil, fmt.Errorf("new xsk socket %s: bind (flags %#x): %w", where, sa.Flags, err)
	}
	flags, err := xdpOptions(fd)
	if err != nil {
		return nil, fmt.Errorf("new xsk socket %s: XDP_OPTIONS: %w", where, err)
	}
	s.mode = ModeCopy
	if flags&unix.XDP_OPTIONS_ZEROCOPY != 0 {
		s.mode = ModeZeroCopy
	}
	if opts.Mode != ModeAuto && opts.Mode != s.mode {
		if opts.Mode == ModeZeroCopy {
			return nil, fmt.Errorf("new xsk socket %s: %w: the UMEM's first socket is in copy mode",
				where, ErrNoZeroCopy)
		}
		return nil, fmt.Errorf("new xsk socket %s: %w: asked for %v, the UMEM's first socket is in %v",
			where, ErrInvalidOptions, opts.Mode, s.mode)
	}
	if len(u.sockets) == 0 {
		u.needWakeup = needWakeup
	}
	u.sockets = append(u.sockets, s)
	return s, nil
}

// bindBusyFor bounds how long bind retries a busy queue.
const bindBusyFor = time.Second

// bind binds fd, retrying while the queue is busy for at most bindBusyFor:
// the kernel tears down the buffer pool of a closed socket in a work item
// after an RCU grace period, so a queue just released stays registered for
// a moment. A failed bind leaves the socket's rings in place for the retry.
// A queue held by another live socket still fails with EBUSY in the end.
func bind(fd int, sa *unix.SockaddrXDP) error {
	deadline := time.Now().Add(bindBusyFor)
	wait := time.Millisecond
	for {
		err := unix.Bind(fd, sa)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// release unmaps what s mapped and closes its descriptor; u.mu is held.
func (s *Socket) release() error {
	var errs []error
	s.rx.detach()
	s.tx.detach()
	for _, m := range []*[]byte{&s.rxMem, &s.txMem} {
		if *m != nil {
			errs = append(errs, unix.Munmap(*m))
			*m = nil
		}
	}
	if s.pair != nil {
		s.pair.refs--
		if s.pair.refs == 0 {
			errs = append(errs, s.pair.unmap())
		}
		s.pair = nil
	}
	errs = append(errs, unix.Close(s.fd))
	s.fd = -1
	return errors.Join(errs...)
}

// Close unbinds the socket: it unmaps its rings (the fill and completion
// rings when no other socket shares them) and closes its descriptor, which
// removes it from XSKMAPs. Frames the kernel held for it are lost to the
// caller's accounting. Closing twice returns nil.
func (s *Socket) Close() error {
	u := s.umem
	u.mu.Lock()
	defer u.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	u.sockets = slices.DeleteFunc(u.sockets, func(o *Socket) bool { return o == s })
	if err := s.release(); err != nil {
		return fmt.Errorf("close xsk socket: %w", err)
	}
	return nil
}

// FD returns the socket's descriptor: the value to store in an XSKMAP, and
// what to poll(2) on alongside other descriptors. It stays owned by the
// socket.
func (s *Socket) FD() int { return s.fd }

// UMEM returns the UMEM the socket receives into and sends from.
func (s *Socket) UMEM() *UMEM { return s.umem }

// Ifindex returns the interface the socket is bound to.
func (s *Socket) Ifindex() int { return s.ifindex }

// QueueID returns the queue the socket is bound to.
func (s *Socket) QueueID() uint32 { return s.queue }

// Mode returns ModeCopy or ModeZeroCopy: what the kernel bound the socket in.
func (s *Socket) Mode() Mode { return s.mode }

// RX returns the socket's RX ring.
func (s *Socket) RX() *RXQueue { return &s.rx }

// TX returns the socket's TX ring.
func (s *Socket) TX() *TXQueue { return &s.tx }

// Fill returns the fill ring of the socket's buffer pool (shared with the
// other sockets on the same queue, if any).
func (s *Socket) Fill() *FillQueue { return &s.pair.fill }

// Completion returns the completion ring of the socket's buffer pool
// (shared with the other sockets on the same queue, if any).
func (s *Socket) Completion() *CompletionQueue { return &s.pair.completion }

// isTransient reports the errors of a wakeup call that mean "try again
// later" rather than a broken socket: the kernel is busy, out of buffers, the
// completion ring is full, or the link is down.
func isTransient(e unix.Errno) bool {
	switch e {
	case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS, unix.ENETDOWN, unix.EINTR:
		return true
	}
	return false
}

// Kick wakes the kernel to send what was submitted on the TX ring
// (sendto(MSG_DONTWAIT)). Call it when TX().NeedWakeup() is true. In copy
// mode each call sends a bounded batch (32 frames by default) and the kernel
// needs room on the completion ring for every frame, so keep kicking and
// draining completions while frames are outstanding. Transient refusals
// (EAGAIN, EBUSY, ENOBUFS, ENETDOWN) return nil.
func (s *Socket) Kick() error {
	if e := sendtoKick(s.fd); !isTransient(e) {
		return fmt.Errorf("xsk kick tx: %w", e)
	}
	return nil
}

// KickFill wakes the kernel after frames were added to a fill ring that
// needed it (recvfrom(MSG_DONTWAIT)); call it when Fill().NeedWakeup() is
// true. Transient refusals return nil.
func (s *Socket) KickFill() error {
	if e := recvfromKick(s.fd); !isTransient(e) {
		return fmt.Errorf("xsk kick fill: %w", e)
	}
	return nil
}

// Poll waits until the RX ring has entries or timeout passes, and reports
// whether it has; a negative timeout waits without limit. It also wakes the
// kernel for the fill and TX rings. An interrupted wait returns false, nil.
func (s *Socket) Poll(timeout time.Duration) (bool, error) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	s.pfd[0] = unix.PollFd{Fd: int32(s.fd), Events: unix.POLLIN}
	n, err := unix.Poll(s.pfd[:], ms)
	if err != nil {
		if errors.Is(err, unix.EINTR) {
			return false, nil
		}
		return false, fmt.Errorf("xsk poll: %w", err)
	}
	if n > 0 && s.pfd[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
		return false, fmt.Errorf("xsk poll: revents %#x", s.pfd[0].Revents)
	}
	return n > 0 && s.pfd[0].Revents&unix.POLLIN != 0, nil
}

// Statistics are the kernel's counters of a socket (XDP_STATISTICS).
type Statistics struct {
	// RXDropped counts received packets the socket dropped: no frame on
	// the fill ring (also counted in RXFillRingEmptyDescs), a packet too
	// long for a frame.
	RXDropped uint64
	// RXInvalidDescs counts invalid fill-ring addresses.
	RXInvalidDescs uint64
	// TXInvalidDescs counts invalid TX descriptors (an address outside the
	// UMEM, a length beyond the frame). The kernel skips them; kernel 6.18
	// in copy mode still returns their address on the completion ring.
	TXInvalidDescs uint64
	// RXRingFull counts packets dropped because the RX ring was full.
	RXRingFull uint64
	// RXFillRingEmptyDescs counts times the fill ring was found empty.
	RXFillRingEmptyDescs uint64
	// TXRingEmptyDescs counts times the TX ring was found empty when the
	// kernel looked for frames to send.
	TXRingEmptyDescs uint64
}

// Statistics reads the socket's counters.
func (s *Socket) Statistics() (Statistics, error) {
	st, err := statistics(s.fd)
	if err != nil {
		return Statistics{}, fmt.Errorf("xsk statistics: %w", err)
	}
	return Statistics{
		RXDropped:            st.Rx_dropped,
		RXInvalidDescs:       st.Rx_invalid_descs,
		TXInvalidDescs:       st.Tx_invalid_descs,
		RXRingFull:           st.Rx_ring_full,
		RXFillRingEmptyDescs: st.Rx_fill_ring_empty_descs,
		TXRingEmptyDescs:     st.Tx_ring_empty_descs,
	}, nil
}
