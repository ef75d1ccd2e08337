package tcp

import (
	"container/heap"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/internal/shrink"
)

// Stack is the TCP engine of one poller: its connections, listeners,
// timers and output queue.
type Stack struct {
	opts  Options
	conns map[FourTuple]*Conn
	// connsPeak is conns' high-water mark, kept by shrink.Map.
	connsPeak int
	listeners map[uint16]*Listener
	timers    timerHeap
	// outq[outHead:] is a FIFO of connections with something to send;
	// each is on it at most once (Conn.needsOutput).
	outq    []*Conn
	outHead int
	// ctl holds segments sent on behalf of no connection: RSTs and SYN
	// cookie SYN-ACKs. Bounded; when full, new ones are dropped.
	ctl      []ctlSegment
	nextPort uint16
	// RFC 5961 §7 challenge ACK limit: per second, stack-wide.
	challengeSecond int64
	challengeCount  int
	// evConns are the connections with events queued for their
	// Handlers; driving: inside Input, Advance or Output; calling: a
	// Handler call runs (see events.go).
	evConns          []*Conn
	driving, calling bool
	// isnOverride fixes initial sequence numbers (tests of wraparound).
	isnOverride func(FourTuple) Seq

	Stats StackStats
	// scratch is where a Filler builds data that crosses the end of a
	// connection's send ring (see Conn.fill).
	scratch []byte
	// txFree are transmission logs (rack.go) of connections whose
	// flight emptied, for the next one that sends: a connection with
	// nothing in flight holds none, and a busy one takes one without
	// allocating.
	txFree [][]txrec
}

// StackStats count what the stack did with segments it could not hand to
// a connection.
type StackStats struct {
	SegmentsIn, SegmentsOut           uint64
	BadChecksum, Malformed, NoSocket  uint64
	RSTsSent, SYNCookiesSent          uint64
	SYNCookiesValid, SYNCookiesFailed uint64
	AcceptQueueDrops                  uint64
}

type ctlSegment struct {
	id       FourTuple
	seq, ack Seq
	flags    uint8
	// SYN cookie SYN-ACK options.
	opts header.TCPOptions
	wnd  uint16
}

const maxCtl = 256

// challengeLimit is the number of challenge ACKs per second (RFC 5961
// §7; Linux's historical default).
const challengeLimit = 1000

// NewStack returns an empty stack.
func NewStack(opts Options) (*Stack, error) {
	opts.setDefaults()
	if _, err := newCC(opts.CongestionControl, &Window{}); err != nil {
		return nil, err
	}
	if opts.MTU < 576 || opts.MTU > 65535 {
		return nil, fmt.Errorf("tcp: MTU %d outside 576..65535", opts.MTU)
	}
	if opts.SendBuffer < 4096 || opts.ReceiveBuffer < 4096 || opts.ReceiveBuffer > 1<<30 {
		return nil, errors.New("tcp: send and receive buffers must be 4 KiB..1 GiB")
	}
	return &Stack{
		opts:      opts,
		conns:     make(map[FourTuple]*Conn),
		listeners: make(map[uint16]*Listener),
		nextPort:  opts.EphemeralLow,
	}, nil
}

// Options returns the stack's options with defaults filled in.
func (s *Stack) Options() Options { return s.opts }

// Conns returns the number of connections, TIME-WAIT included.
func (s *Stack) Conns() int { return len(s.conns) }

// Lookup returns the connection with the given addresses, or nil.
func (s *Stack) Lookup(id FourTuple) *Conn { return s.conns[id] }

// newConn makes a connection in the CLOSED state with its buffers sized.
func (s *Stack) newConn(now Time, id FourTuple, h Handler) *Conn {
	c := &Conn{
		stack:   s,
		id:      id,
		h:       h,
		snd:     newSendBuf(s.opts.SendBuffer),
		rcv:     newRecvBuf(s.opts.ReceiveBuffer),
		rto:     s.opts.RTOInitial,
		heapIdx: -1,
	}
	c.cc, _ = newCC(s.opts.CongestionControl, &c.win)
	// Our window scale: the smallest that lets the buffer be advertised
	// (RFC 7323 §2.3).
	if !s.opts.DisableWindowScale {
		c.rcvWS = rcvScale(s.opts.ReceiveBuffer)
	}
	c.iss = s.isn(now, id)
	c.sndUna, c.sndNxt, c.sndMax = c.iss, c.iss, c.iss
	c.snd.start = c.iss + 1
	c.tsOffset = s.hash32(id, 0x7473)
	c.mss = mssFor(s.opts.MTU, id.LocalAddr.Is6() && !id.LocalAddr.Is4In6())
	c.peerMSS = c.mss
	c.win = Window{MSS: c.mss, Cwnd: 10 * c.mss, Ssthresh: 1 << 30}
	return c
}

// Connect opens a connection actively (RFC 9293 §3.10.1). localPort 0
// picks a free ephemeral port.
func (s *Stack) Connect(now Time, local netip.Addr, localPort uint16, remote netip.AddrPort, h Handler) (*Conn, error) {
	id := FourTuple{LocalAddr: local, RemoteAddr: remote.Addr(), LocalPort: localPort, RemotePort: remote.Port()}
	if localPort == 0 {
		span := int(s.opts.EphemeralHigh-s.opts.EphemeralLow) + 1
		found := false
		for i := 0; i < span; i++ {
			p := s.nextPort
			s.nextPort++
			if s.nextPort > s.opts.EphemeralHigh || s.nextPort < s.opts.EphemeralLow {
				s.nextPort = s.opts.EphemeralLow
			}
			id.LocalPort = p
			if s.conns[id] == nil && s.listeners[p] == nil {
				found = true
				break
			}
		}
		if !found {
			return nil, ErrNoPorts
		}
	} else if s.conns[id] != nil {
		return nil, ErrPortInUse
	}
	c := s.newConn(now, id, h)
	c.state = StateSynSent
	s.add(c)
	c.wantOutput()
	return c, nil
}

// Listener accepts connections on a port.
type Listener struct {
	s    *Stack
	addr netip.Addr // unspecified: any local address
	port uint16
	h    Handler
	// half-open connections (SYN-RECEIVED) and established ones waiting
	// for Accept.
	synCount int
	accept   []*Conn
	closed   bool
}

// Listen opens a listener on port (RFC 9293 §3.10.1 passive OPEN). New
// connections get h as their Handler and report EventEstablished to it;
// they also queue for Accept.
func (s *Stack) Listen(addr netip.Addr, port uint16, h Handler) (*Listener, error) {
	if port == 0 {
		return nil, errors.New("tcp: listen on port 0")
	}
	if s.listeners[port] != nil {
		return nil, ErrPortInUse
	}
	l := &Listener{s: s, addr: addr, port: port, h: h}
	s.listeners[port] = l
	return l, nil
}

// Port is the listening port.
func (l *Listener) Port() uint16 { return l.port }

// Accept returns the next established connection, or nil.
func (l *Listener) Accept() *Conn {
	if len(l.accept) == 0 {
		return nil
	}
	c := l.accept[0]
	l.accept = l.accept[:copy(l.accept, l.accept[1:])]
	c.listener = nil
	return c
}

// Pending is the number of connections waiting for Accept.
func (l *Listener) Pending() int { return len(l.accept) }

// Close stops listening; connections not yet accepted are reset.
func (l *Listener) Close() {
	if l.closed {
		return
	}
	l.closed = true
	delete(l.s.listeners, l.port)
	for _, c := range l.accept {
		c.listener = nil
		c.Abort()
	}
	l.accept = nil
	for _, c := range l.s.conns {
		if c.listener == l {
			c.listener = nil
			c.Abort()
		}
	}
}

// established moves a passive connection from the SYN queue to the
// accept queue.
func (l *Listener) established(c *Conn) {
	l.synCount--
	if len(l.accept) >= l.s.opts.AcceptBacklog {
		l.s.Stats.AcceptQueueDrops++
		c.listener = nil
		c.Abort()
		return
	}
	l.accept = append(l.accept, c)
}

// Input takes one received TCP segment addressed from src to dst. The
// segment's checksum is verified here.
func (s *Stack) Input(now Time, src, dst netip.Addr, b []byte) {
	s.Stats.SegmentsIn++
	t := header.TCP(b)
	if !t.IsValid(len(b)) {
		s.Stats.Malformed++
		return
	}
	if !t.IsChecksumValid(src, dst) {
		s.Stats.BadChecksum++
		return
	}
	seg := Segment{
		SrcPort: t.SrcPort(), DstPort: t.DstPort(),
		Seq: Seq(t.Seq()), Ack: Seq(t.Ack()),
		Flags: t.Flags(), Window: t.Window(),
		Payload: t.Payload(),
	}
	if !header.ParseTCPOptions(t.Options(), &seg.Opts) {
		s.Stats.Malformed++
		return
	}
	s.InputSegment(now, src, dst, &seg)
}

// InputSegment is Input for a segment already parsed and checked.
func (s *Stack) InputSegment(now Time, src, dst netip.Addr, seg *Segment) {
	defer s.leave(s.enter())
	id := FourTuple{LocalAddr: dst, RemoteAddr: src, LocalPort: seg.DstPort, RemotePort: seg.SrcPort}
	if c := s.conns[id]; c != nil {
		// RFC 9293 §3.10.7.4 / RFC 6191: a new SYN may reopen a
		// connection in TIME-WAIT if it is beyond the old one.
		if c.state == StateTimeWait && seg.Flags&(header.TCPFlagSYN|header.TCPFlagACK|header.TCPFlagRST) == header.TCPFlagSYN &&
			(c.rcvNxt().LessThan(seg.Seq) || (c.tsOK && seg.Opts.HasTimestamp && int32(seg.Opts.TSVal-c.tsRecent) > 0)) {
			c.terminate(nil)
		} else {
			c.input(now, seg)
			return
		}
	}
	if l := s.listeners[seg.DstPort]; l != nil && (!l.addr.IsValid() || l.addr.IsUnspecified() || l.addr == dst) {
		l.input(now, id, seg)
		return
	}
	s.Stats.NoSocket++
	s.resetFor(id, seg)
}

// resetFor answers a segment that belongs to no connection (RFC 9293
// §3.10.7.1): never a RST to a RST.
func (s *Stack) resetFor(id FourTuple, seg *Segment) {
	if seg.Flags&header.TCPFlagRST != 0 {
		return
	}
	if seg.Flags&header.TCPFlagACK != 0 {
		s.queueRST(id, seg.Ack, 0, false)
	} else {
		s.queueRST(id, 0, seg.Seq.Add(seg.seqLen()), true)
	}
}

// input handles a segment for the listener (RFC 9293 §3.10.7.2).
func (l *Listener) input(now Time, id FourTuple, seg *Segment) {
	s := l.s
	switch {
	case seg.Flags&header.TCPFlagRST != 0:
		return
	case seg.Flags&header.TCPFlagACK != 0 && seg.Flags&header.TCPFlagSYN == 0:
		if c := l.cookieConn(now, id, seg); c != nil {
			c.input(now, seg)
			return
		}
		s.queueRST(id, seg.Ack, 0, false)
	case seg.Flags&header.TCPFlagSYN != 0 && seg.Flags&header.TCPFlagACK == 0:
		if l.synCount >= s.opts.SynBacklog || len(l.accept) >= s.opts.AcceptBacklog {
			l.sendCookie(now, id, seg)
			return
		}
		c := s.newConn(now, id, l.h)
		c.listener = l
		c.state = StateSynRcvd
		c.irs = seg.Seq
		c.rcv.start = seg.Seq + 1
		c.rcvAdv = c.rcv.start
		c.negotiate(now, &seg.Opts)
		c.sndWnd = int(seg.Window) // unscaled in a SYN
		c.sndWl1, c.sndWl2 = seg.Seq, 0
		l.synCount++
		s.add(c)
		c.wantOutput()
	}
}

// queueRST queues a RST (with ACK when withAck) for id.
func (s *Stack) queueRST(id FourTuple, seq, ack Seq, withAck bool) {
	flags := uint8(header.TCPFlagRST)
	if withAck {
		flags |= header.TCPFlagACK
	}
	s.queueCtl(ctlSegment{id: id, seq: seq, ack: ack, flags: flags})
	s.Stats.RSTsSent++
}

func (s *Stack) queueCtl(cs ctlSegment) {
	if len(s.ctl) < maxCtl {
		s.ctl = append(s.ctl, cs)
	}
}

// challengeAllowed applies the stack-wide challenge ACK limit.
func (s *Stack) challengeAllowed(now Time) bool {
	sec := int64(now) / 1e9
	if sec != s.challengeSecond {
		s.challengeSecond, s.challengeCount = sec, 0
	}
	if s.challengeCount >= challengeLimit {
		return false
	}
	s.challengeCount++
	return true
}

// Output writes the next segment to send into b (which must hold
// MaxHeader plus the MSS) and returns its length with the addresses to
// send it between; 0 when nothing is left to send now.
func (s *Stack) Output(now Time, b []byte) (n int, src, dst netip.Addr) {
	defer s.leave(s.enter())
	if len(s.ctl) > 0 {
		cs := &s.ctl[0]
		n = s.writeCtl(now, b, cs)
		src, dst = cs.id.LocalAddr, cs.id.RemoteAddr
		s.ctl = s.ctl[:copy(s.ctl, s.ctl[1:])] // rare: RSTs, cookies
		s.Stats.SegmentsOut++
		return n, src, dst
	}
	for s.outHead < len(s.outq) {
		c := s.outq[s.outHead]
		s.outq[s.outHead] = nil
		s.outHead++
		if c.released {
			continue
		}
		n = c.output(now, b)
		if n == 0 {
			c.needsOutput = false
			continue
		}
		s.pushOutput(c) // round robin between connections
		s.Stats.SegmentsOut++
		return n, c.id.LocalAddr, c.id.RemoteAddr
	}
	s.outq, s.outHead = s.outq[:0], 0
	return 0, src, dst
}

// pushOutput appends to the output FIFO, reusing the space before its
// head rather than growing.
func (s *Stack) pushOutput(c *Conn) {
	if len(s.outq) == cap(s.outq) && s.outHead > 0 {
		n := copy(s.outq, s.outq[s.outHead:])
		clear(s.outq[n:])
		s.outq, s.outHead = s.outq[:n], 0
	}
	s.outq = append(s.outq, c)
}

func (s *Stack) writeCtl(now Time, b []byte, cs *ctlSegment) int {
	optLen := header.EncodeTCPOptions(b[20:], &cs.opts)
	header.TCP(b).Encode(&header.TCPFields{
		SrcPort: cs.id.LocalPort, DstPort: cs.id.RemotePort,
		Seq: uint32(cs.seq), Ack: uint32(cs.ack), Flags: cs.flags, Window: cs.wnd,
		OptionsLen: optLen,
	})
	n := 20 + optLen
	header.TCP(b[:n]).SetChecksum(cs.id.LocalAddr, cs.id.RemoteAddr)
	return n
}

func (s *Stack) wantOutput(c *Conn) {
	if !c.needsOutput && !c.released {
		c.needsOutput = true
		s.pushOutput(c)
	}
}

// Advance fires every timer due at now.
func (s *Stack) Advance(now Time) {
	defer s.leave(s.enter())
	for len(s.timers) > 0 && s.timers[0].timerAt <= now {
		c := heap.Pop(&s.timers).(*Conn)
		c.timerAt = 0
		c.onTimer(now)
		if !c.released {
			s.timerChanged(c)
		}
	}
}

// NextTimer is when Advance next has work; ok is false with no timer.
func (s *Stack) NextTimer() (t Time, ok bool) {
	if len(s.timers) == 0 {
		return 0, false
	}
	return s.timers[0].timerAt, true
}

// timerChanged re-files c after its timers changed.
func (s *Stack) timerChanged(c *Conn) {
	if c.released {
		return
	}
	t := c.nextTimer()
	switch {
	case t == c.timerAt && (t == 0) == (c.heapIdx < 0):
	case t == 0:
		if c.heapIdx >= 0 {
			heap.Remove(&s.timers, c.heapIdx)
		}
		c.timerAt = 0
	case c.heapIdx >= 0:
		c.timerAt = t
		heap.Fix(&s.timers, c.heapIdx)
	default:
		c.timerAt = t
		heap.Push(&s.timers, c)
	}
}

// release forgets a closed connection.
func (s *Stack) release(c *Conn) {
	if c.released {
		return
	}
	if c.heapIdx >= 0 {
		heap.Remove(&s.timers, c.heapIdx)
	}
	if s.conns[c.id] == c {
		s.forget(c)
	}
	if l := c.listener; l != nil {
		if c.state == StateClosed && l.synCount > 0 && !c.inAccept() {
			l.synCount--
		}
		for i, x := range l.accept {
			if x == c {
				l.accept = append(l.accept[:i], l.accept[i+1:]...)
				break
			}
		}
		c.listener = nil
	}
	c.released = true
}

// add files c under its addresses.
func (s *Stack) add(c *Conn) {
	s.conns[c.id] = c
}

// forget takes c out of the connections, giving back the memory of the
// map once it is a quarter of its peak (shrink).
func (s *Stack) forget(c *Conn) {
	delete(s.conns, c.id)
	s.conns = shrink.Map(s.conns, &s.connsPeak)
}

// inAccept: c waits in its listener's accept queue.
func (c *Conn) inAccept() bool {
	for _, x := range c.listener.accept {
		if x == c {
			return true
		}
	}
	return false
}

// isn is an RFC 6528 initial sequence number: M, a clock ticking every
// 4 µs, plus F, a keyed hash of the connection's addresses.
func (s *Stack) isn(now Time, id FourTuple) Seq {
	if s.isnOverride != nil {
		return s.isnOverride(id)
	}
	return Seq(uint32(int64(now)/4000) + s.hash32(id, 0x6973))
}

// hash32 is a keyed hash of a connection's addresses (RFC 6528 F()).
func (s *Stack) hash32(id FourTuple, salt uint32) uint32 {
	var buf [16 + 16 + 16 + 8]byte
	copy(buf[:16], s.opts.Secret[:])
	la, ra := id.LocalAddr.As16(), id.RemoteAddr.As16()
	copy(buf[16:32], la[:])
	copy(buf[32:48], ra[:])
	binary.BigEndian.PutUint16(buf[48:], id.LocalPort)
	binary.BigEndian.PutUint16(buf[50:], id.RemotePort)
	binary.BigEndian.PutUint32(buf[52:], salt)
	sum := sha256.Sum256(buf[:])
	return binary.BigEndian.Uint32(sum[:4])
}

// timerHeap orders connections by their next timer.
type timerHeap []*Conn

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].timerAt < h[j].timerAt }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *timerHeap) Push(x any) {
	c := x.(*Conn)
	c.heapIdx = len(*h)
	*h = append(*h, c)
}
func (h *timerHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	c.heapIdx = -1
	return c
}

// Detach takes an established connection out of s so that another Stack
// can Adopt it: a poller hands a connection to the poller of the QP that
// takes it. Stacks that exchange connections must share one clock (their
// Times are compared across the move). It fails for a connection of
// another stack or one still waiting in a listener's accept queue.
func (s *Stack) Detach(c *Conn) error {
	if c.stack != s || c.released || s.conns[c.id] != c {
		return errors.New("tcp: detach: not a connection of this stack")
	}
	if c.listener != nil {
		return errors.New("tcp: detach: connection not yet accepted")
	}
	s.forget(c)
	s.dropQueued(c)
	if c.heapIdx >= 0 {
		heap.Remove(&s.timers, c.heapIdx)
	}
	if c.needsOutput {
		for i := s.outHead; i < len(s.outq); i++ {
			if s.outq[i] == c {
				s.outq = append(s.outq[:i], s.outq[i+1:]...)
				break
			}
		}
	}
	c.stack = nil
	return nil
}

// Adopt makes a connection another Stack detached one of s's, with its
// timers and any output it was waiting to send.
func (s *Stack) Adopt(c *Conn) error {
	if c.stack != nil {
		return errors.New("tcp: adopt: connection not detached")
	}
	if s.conns[c.id] != nil {
		return ErrPortInUse
	}
	c.stack = s
	s.add(c)
	c.timerAt = 0
	s.timerChanged(c)
	if c.needsOutput {
		s.pushOutput(c)
	}
	if len(c.events) > 0 {
		s.evConns = append(s.evConns, c) // delivered at s's next driving call
	}
	return nil
}

// fillScratch returns a scratch buffer of n octets, at most 64 KiB.
func (s *Stack) fillScratch(n int) []byte {
	n = min(n, 64<<10)
	if cap(s.scratch) < n {
		s.scratch = make([]byte, 64<<10)
	}
	return s.scratch[:n]
}
