package sdp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// Per connection: recvBufs receives of bufSize octets posted, sendBufs
// send buffers of the same size. A message carries at most bufSize −
// BSDHLen octets of data (and no more than the peer's buffers hold).
const (
	bufSize  = 64 << 10
	recvBufs = 16
	sendBufs = 16
	// reserve credits are kept for messages without data: data never
	// takes the last two (ib_sdp's SDP_MIN_TX_CREDITS).
	reserve = 2
	// zSize is each of the two Read Zcopy regions: the source's, which
	// SrcAvails advertise, and the sink's, which its RDMA Reads fill.
	// It bounds the octets on their way: with 1 MiB, a 64 KiB stream
	// between two namespaces here went at 0.57-0.77x the datapath's
	// send_bw, waiting on the wake-ups of each round of SrcAvail, Read
	// and RdmaRdCompl; with 4 MiB, four SrcAvails outstanding and two
	// Reads in flight, 0.8-0.9x.
	zSize = 4 << 20
	// DefaultZcopyThreshold: a Write of at least this many octets goes
	// by Read Zcopy (ib_sdp's default), anything shorter by Bcopy.
	DefaultZcopyThreshold = 64 << 10
	// maxAdverts is the MaxAdverts of our Hello and HelloAck: the
	// SrcAvails a peer may have outstanding to us (not yet answered
	// by RdmaRdCompl or SendSM), and the most we keep outstanding to a
	// peer whose own MaxAdverts allows it. One would leave the link idle
	// for a round trip and two wake-ups after every SrcAvail (the
	// RdmaRdCompl's way back, the next SrcAvail's way out): with more,
	// the sink finds the next SrcAvail waiting when a Read completes.
	maxAdverts = 4
	// maxSinkParts bounds the SrcAvails the sink has read and the
	// application not yet taken: past it, no RDMA Read starts for the
	// next, so a peer of many small SrcAvails cannot grow the queue.
	maxSinkParts = 256
	// maxReads is the RDMA Reads the sink keeps in flight (the EP's
	// ORD, and the source's IRD): with one, the link idles between
	// them for a wake-up and a round trip.
	maxReads = 2
)

// The connection's memory, registered for local access only: the receive
// buffers, the send buffers, then the sink region of Read Zcopy. The
// source region is registered apart, the only memory a peer may read.
const (
	zSinkOff = (recvBufs + sendBufs) * bufSize
	memSize  = zSinkOff + zSize
)

// Cookies of RDMA Reads (the buffers' indexes are the others').
const readCookie = 1 << 32

// Conn is an SDP connection: a net.Conn whose octets travel as RDMA
// Sends. Its methods may be called from any goroutine.
type Conn struct {
	t   *transport
	ep  *client.EP
	evd *client.EVD
	buf *client.Buffer
	lmr *client.LMR
	// zbuf is the source region of Read Zcopy, which zlmr lets the peer
	// read.
	zbuf *client.Buffer
	zlmr *client.LMR
	// pz is the connection's own: its Zcopy region is RemoteRead, and a
	// PZ shared with the process's other connections would let any of
	// their peers read it with a guessed STag.
	pz     *client.PZ
	local  net.Addr
	remote net.Addr
	// peerRcvSz is the size of each of the peer's receive buffers.
	peerRcvSz int
	// early are completions that came before ESTABLISHED (see
	// established).
	early []client.Event

	mu sync.Mutex
	// changed is closed, and replaced, whenever anything a waiting Read,
	// Write or Close looks at changes.
	changed chan struct{}
	// polling: a waiting call sleeps on the EVD for all of them (see
	// wait); released: the EVD is gone; broken: it failed (the daemon
	// went away) and nobody looks at it again.
	polling, released, broken bool
	// fg counts the calls waiting; bgPolling: the one asleep on the EVD
	// is the background goroutine (see background); stopping: it is to
	// end, bgDone: it has.
	fg               int
	bgPolling        bool
	stopping, bgDone bool
	// Send side: free send buffers (indexes), the next MSeq, and what
	// the peer's latest message said (MSeqAck, Bufs).
	free              []int
	inflight          []int // send buffers posted, in order
	nextMSeq, peerAck uint32
	peerBufs          uint16
	sendsOut          int
	// Receive side: the MSeq of the last message received; receives
	// posted; the MSeqAck and Bufs our latest message carried; messages
	// received and not yet read.
	lastRecv uint32
	posted   int
	advAck   uint32
	advBufs  int
	queue    []rxMsg
	// Read Zcopy, source side: the source region is a ring holding what
	// Writes gave it, from zHead: the octets SrcAvails advertised (zAdvs,
	// their lengths, oldest first, at most peerAdverts of them; in all
	// advertised()), then zPend not yet advertised (the next SrcAvail's,
	// once one outstanding is answered). zsrcSM: the sink declined the
	// advertised octets (SendSM), and zsrcSent of them went by Bcopy.
	zHead, zPend int
	zAdvs        []int
	peerAdverts  int
	zsrcSent     int
	zsrcSM       bool
	// Sink side: the sink region's ring (see startRead), and the lengths
	// of the RDMA Reads in flight, oldest first.
	sinkHead, sinkUsed int
	reads              []int
	// peerAdvs counts the peer's SrcAvails not yet answered by an
	// RdmaRdCompl or SendSM we sent (those waiting in ctrl count), at
	// most maxAdverts. A SrcAvailCancel declines every one not begun:
	// smAfter of them wait for a SendSM that goes after the RdmaRdCompls
	// of those begun; from the cancel until the peer acknowledges the
	// SendSM (smSent, at MSeq smMSeq), SrcAvails are the peer's from
	// before it saw the SendSM, declined with the rest, and dropped.
	peerAdvs, smAfter int
	smOpen, smSent    bool
	smMSeq            uint32
	// peerSinks counts the peer's SinkAvails since its last
	// SinkAvailCancel: we write into none of them (Write Zcopy is not
	// ours), so each stays outstanding until the peer cancels it; at
	// most maxAdverts. recvBuffered: the peer, as a data source, told us
	// (ModeChange) that our receiving half is in Buffered mode, and so
	// sends no SrcAvail.
	peerSinks        int
	recvBuffered     bool
	ctrl             []ctrlMsg
	threshold        int
	eof              bool // the peer's DisConn came (after the queued data)
	gone             bool // the connection's DISCONNECTED event came
	wrClosed, closed bool
	err              error // the connection is broken: reset, protocol error
	rdDeadline       time.Time
	wrDeadline       time.Time
	linger           int // SetLinger's; -1 by default
	pollFor          time.Duration
	stats            Stats
}

// Stats count what a connection did.
type Stats struct {
	MessagesSent, MessagesReceived uint64
	CreditUpdatesSent              uint64
	// ZcopySent counts the octets written into the source region (for
	// SrcAvails; a declined one's go by Bcopy after all), ZcopyReceived
	// those read from the sink region (brought by RDMA Read).
	ZcopySent, ZcopyReceived uint64
	// MinCredits is the fewest credits the connection had to the peer
	// after a send: never negative, by construction.
	MinCredits int
}

// rxMsg is received data not yet read: a Data message in receive buffer
// idx ([off, end) of it left), or (zero) a SrcAvail's, read part by part
// into the sink region.
type rxMsg struct {
	idx, off, end int
	zero          bool
	// A SrcAvail's: the source's region, and how much of it RDMA Reads
	// were posted for, have brought, and Read has taken.
	src                       SrcAvail
	requested, arrived, taken int
}

// ctrlMsg is a message without data waiting for a credit.
type ctrlMsg struct {
	mid      MID
	n        uint32 // RdmaRdCompl's length, ChRcvBufAck's size
	declined int    // the SrcAvails a SendSM declines
}

// Flow control modes of a ModeChange (Annex A4 as the first SDP
// generation numbers them: bits 4-6 of its first octet; bit 7 set means
// the receiver's sending half, clear its receiving half).
const (
	modeBuffered  = 0
	modeCombined  = 1
	modePipelined = 2
	modeSendHalf  = 0x8
)

// newConn sets up what a connection needs before it connects: an EVD for
// its completions and connection events, an EP, the buffers, registered,
// and its receives posted. zcopyThreshold and pollFor are as configured
// (Dialer's).
func newConn(t *transport, zcopyThreshold int, pollFor time.Duration) (*Conn, error) {
	c := &Conn{t: t, changed: make(chan struct{}), linger: -1, threshold: option(zcopyThreshold, DefaultZcopyThreshold),
		pollFor: option(pollFor, DefaultPollFor), stats: Stats{MinCredits: -1}}
	var err error
	if c.pz, err = t.ia.CreatePZ(); err != nil {
		return nil, err
	}
	if c.evd, err = t.ia.CreateEVD(client.EVDOptions{Depth: 2*(recvBufs+sendBufs) + 8, Kind: client.DTOEvents | client.ConnectionEvents}); err != nil {
		c.release()
		return nil, err
	}
	if c.buf, err = t.ia.Alloc(memSize); err != nil {
		c.release()
		return nil, err
	}
	if c.lmr, err = c.pz.RegisterLMR(c.buf, client.LocalWrite); err != nil {
		c.release()
		return nil, err
	}
	if c.zbuf, err = t.ia.Alloc(zSize); err != nil {
		c.release()
		return nil, err
	}
	if c.zlmr, err = c.pz.RegisterLMR(c.zbuf, client.RemoteRead); err != nil {
		c.release()
		return nil, err
	}
	if c.ep, err = t.ia.CreateEP(client.EPAttr{PZ: c.pz, RecvEVD: c.evd, RequestEVD: c.evd, ConnectEVD: c.evd,
		SQDepth: sendBufs + maxReads + 4, RQDepth: recvBufs, IRD: maxReads, ORD: maxReads}); err != nil {
		c.release()
		return nil, err
	}
	for i := range recvBufs {
		if err := c.ep.PostRecv(uint64(i), []client.Segment{c.seg(i, bufSize)}); err != nil {
			c.release()
			return nil, err
		}
	}
	c.posted = recvBufs
	for i := range sendBufs {
		c.free = append(c.free, recvBufs+i)
	}
	return c, nil
}

func (c *Conn) seg(idx, n int) client.Segment {
	return client.Segment{LMR: c.lmr, Offset: uint64(idx * bufSize), Length: uint32(n)}
}

func (c *Conn) bytes(idx int) []byte { return c.buf.Bytes[idx*bufSize : (idx+1)*bufSize] }

// release frees what newConn made.
func (c *Conn) release() {
	if c.ep != nil {
		_ = c.ep.Free()
	}
	for _, l := range []*client.LMR{c.lmr, c.zlmr} {
		if l != nil {
			_ = l.Free()
		}
	}
	for _, b := range []*client.Buffer{c.buf, c.zbuf} {
		if b != nil {
			_ = b.Free()
		}
	}
	if c.evd != nil {
		_ = c.evd.Free()
	}
	if c.pz != nil {
		_ = c.pz.Free()
	}
}

// start runs an established connection, whose peer posted peerBufs
// receives of peerRcvSz octets: the completions that came early, then the
// background goroutine.
func (c *Conn) start(peerBufs uint16, peerRcvSz int, peerAdverts uint8) {
	c.peerBufs, c.peerRcvSz = peerBufs, peerRcvSz
	c.peerAdverts = min(max(int(peerAdverts), 1), maxAdverts)
	c.nextMSeq = 1 // the Hello and HelloAck were MSeq 0
	c.advBufs = recvBufs
	c.mu.Lock()
	for _, ev := range c.early {
		c.completion(ev)
	}
	c.early = nil
	c.mu.Unlock()
	go c.background()
}

// established waits for the connection's ESTABLISHED event; completions
// that come first (the peer may send at once) are kept for start.
func (c *Conn) established(ctx context.Context) error {
	for {
		ev, err := c.evd.Wait(ctx)
		if err != nil {
			return err
		}
		switch {
		case ev.Type == client.DTOCompletion:
			c.early = append(c.early, ev)
		case ev.Type == client.ConnectionEvent && ev.Conn == client.Established:
			return nil
		default:
			return fmt.Errorf("%v", ev.Conn)
		}
	}
}

// credits is what may be sent now (c.mu held).
func (c *Conn) credits() int {
	return int(int32(c.peerAck-c.nextMSeq)) + 1 + int(c.peerBufs)
}

// notify wakes every waiter, the one asleep on the EVD too (c.mu held).
func (c *Conn) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
	if c.polling {
		c.evd.Interrupt()
	}
}

// Events are taken off the EVD by whoever waits for them. One waiter at a
// time sleeps on the EVD for all (polling), handles what comes and wakes
// the others. A Read or Write that waits takes that role itself, so that
// the completion it waits for reaches it with no goroutine in between;
// while none waits, the connection's background goroutine does, so that
// what the protocol owes the peer (a declined SrcAvail's data, the answer
// to a SrcAvailCancel, credits) goes without a call, as a TCP connection's
// does.

// drain handles the events waiting on the EVD and reports whether there
// were any (c.mu held).
func (c *Conn) drain() bool {
	if c.released || c.polling || c.broken {
		return false
	}
	any := false
	for {
		ev, ok, err := c.evd.Dequeue()
		if err != nil {
			c.evdFailed(err)
			return true
		}
		if !ok {
			return any
		}
		any = true
		c.handle(ev)
	}
}

// wait is a call's wait until something changes or the deadline passes
// (c.mu held, released meanwhile). Callers look at the deadline
// themselves. A call that waits for an answer within a round trip (a
// Read for the next message) looks for it first (spin, see poll); one
// that waits for a transfer (a Write for room, a Read for the RDMA Read
// in flight) sleeps at once: what it waits for takes longer than a look,
// and looking would only take the processor from the daemons that do the
// transfer (on a host whose cores they share, a stream's rate was the same
// either way, for less processor time asleep).
func (c *Conn) wait(deadline time.Time, spin bool) {
	c.fg++
	c.await(deadline, false, spin)
	if c.fg--; c.fg == 0 && !c.polling {
		c.notify() // the background goroutine takes over
	}
}

// await waits as a call (bg false) or as the background goroutine.
func (c *Conn) await(deadline time.Time, bg, spin bool) {
	if c.drain() || pastDeadline(deadline) {
		return
	}
	if c.polling && c.bgPolling && !bg {
		c.evd.Interrupt() // the call takes over from the background
	}
	if c.polling || c.released || c.broken || bg && (c.fg > 0 || c.stopping) {
		c.follow(deadline)
		return
	}
	c.polling, c.bgPolling = true, bg
	c.mu.Unlock()
	ev, err := c.poll(deadline, spin && !bg)
	c.mu.Lock()
	c.polling, c.bgPolling = false, false
	switch {
	case err == nil:
		c.handle(ev)
		c.drain()
	case errors.Is(err, client.ErrInterrupted), errors.Is(err, client.ErrTimeout):
	default:
		c.evdFailed(err)
	}
	c.notify() // another waiter may take over
}

// evdFailed ends the connection whose EVD failed (the daemon went away):
// nobody looks at the EVD again, or the background goroutine would spin
// on the error and hold c.mu (c.mu held).
func (c *Conn) evdFailed(err error) {
	c.broken = true
	c.fail(fmt.Errorf("sdp: %w", err))
}

// DefaultPollFor is how long a waiting call looks for its event before it
// sleeps on the EVD (Dialer.PollFor, ListenConfig.PollFor). It must be
// longer than a round trip on a slow day: once the answer takes longer,
// every round trip sleeps and pays a wake-up, and grows longer still.
// With 60 µs, on a day this host's kernel TCP ping-pong took 22-31 µs
// (twice its usual), the 1-octet round trip between two namespaces was
// 180-220 µs on the xdp datapath; with 200 µs 24.5-29 µs (TCP's 23-27
// in the same runs), with 500 µs 32-34 µs. In one process on two cores
// (BenchmarkPingPong) 200 µs gives 43-90 µs, 60 µs 111-115 µs.
const DefaultPollFor = 200 * time.Microsecond

// poll takes the next event as the one asleep on the EVD (c.mu not held).
// With spin, a call looks for c.pollFor first, yielding the processor
// between looks (to the daemon that is to produce the answer, and to the other
// goroutines): an answer that comes within a round trip is then taken
// without a wake-up, which costs about another round trip. Measured
// first between two namespaces (xdp datapath, both ends pinned to one
// core as make bench pins them), the 1-octet round trip: asleep at once
// 70 µs, 20 µs looking 64 µs, 40 µs 34 µs, 60 µs 24–29 µs, 100 µs 25 µs;
// later figures at DefaultPollFor.
func (c *Conn) poll(deadline time.Time, spin bool) (client.Event, error) {
	if spin && c.pollFor > 0 {
		end := time.Now().Add(c.pollFor)
		if !deadline.IsZero() && deadline.Before(end) {
			end = deadline
		}
		for time.Now().Before(end) {
			ev, ok, err := c.evd.Dequeue()
			if ok || err != nil {
				return ev, err
			}
			runtime.Gosched()
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
	d := time.Duration(-1)
	if !deadline.IsZero() {
		d = max(time.Until(deadline), 0)
	}
	ev, _, err := c.evd.WaitTimeout(d, 1)
	return ev, err
}

// follow waits for a change or the deadline (c.mu held, released
// meanwhile).
func (c *Conn) follow(deadline time.Time) {
	ch := c.changed
	c.mu.Unlock()
	defer c.mu.Lock()
	if deadline.IsZero() {
		<-ch
		return
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// background takes the events while no call waits, until Close.
func (c *Conn) background() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.stopping {
		c.await(time.Time{}, true, false)
	}
	c.bgDone = true
	c.notify()
}

// fail ends the connection with err, once (c.mu held).
func (c *Conn) fail(err error) {
	if c.err == nil {
		c.err = err
	}
	c.notify()
}

// handle takes one event off the EVD (c.mu held).
func (c *Conn) handle(ev client.Event) {
	switch ev.Type {
	case client.DTOCompletion:
		c.completion(ev)
	case client.ConnectionEvent:
		switch ev.Conn {
		case client.Disconnected:
			// The event can overtake the completions of the last
			// messages (a DisConn among them): what it means is
			// decided once every posted receive has completed or
			// been flushed (settle), or after settleAfter at the
			// latest.
			if !c.gone {
				c.gone = true
				time.AfterFunc(settleAfter, func() {
					c.mu.Lock()
					c.settled()
					c.mu.Unlock()
				})
				c.settle()
			}
		default:
			c.fail(fmt.Errorf("%w: %v", syscall.ECONNRESET, ev.Conn))
		}
		c.notify()
	}
}

// settleAfter bounds the wait for the completions a disconnect overtook.
const settleAfter = 2 * time.Second

// settle decides what the peer's disconnect means once no receive or Read
// is outstanding (c.mu held).
func (c *Conn) settle() {
	if c.gone && c.posted == 0 && len(c.reads) == 0 {
		c.settled()
	}
}

// settled ends the connection after the peer's disconnect: Reads see EOF
// after its DisConn, Writes a broken pipe; without a DisConn both see a
// reset (c.mu held).
func (c *Conn) settled() {
	if c.eof {
		c.fail(syscall.EPIPE)
	} else {
		c.fail(syscall.ECONNRESET)
	}
}

// completion handles one DTO completion (c.mu held).
func (c *Conn) completion(ev client.Event) {
	// The cookie is the buffer's index: receives below recvBufs, sends
	// above; an RDMA Read's is readCookie.
	idx := int(ev.Cookie)
	readLen := 0
	switch {
	case ev.Cookie == readCookie:
		if len(c.reads) > 0 {
			readLen, c.reads = c.reads[0], c.reads[1:]
		}
	case idx >= recvBufs && idx < recvBufs+sendBufs:
		// Sends complete in order, and most are unsignaled: this one's
		// completion is every earlier one's too.
		for len(c.inflight) > 0 {
			done := c.inflight[0]
			c.inflight = c.inflight[1:]
			c.free = append(c.free, done)
			c.sendsOut--
			if done == idx {
				break
			}
		}
		c.notify()
	default:
		c.posted--
	}
	if ev.Status != completion.Success {
		// Flushed at the end: after the peer's disconnect (settle
		// says what it means), or our Close, that is no error.
		if c.err == nil && !c.closed && !c.eof && !c.gone {
			c.fail(fmt.Errorf("%w: %v", syscall.ECONNRESET, ev.Status))
		}
		c.settle()
		return
	}
	switch {
	case ev.Cookie == readCookie:
		c.readDone(readLen)
	case idx < recvBufs && ev.Opcode == completion.OpRecv:
		c.received(idx, int(ev.Length))
	}
	c.pump()
	c.settle()
}

// received handles the message in receive buffer idx (c.mu held).
func (c *Conn) received(idx, n int) {
	if idx < 0 || idx >= recvBufs {
		c.abort(fmt.Errorf("sdp: a receive completed for buffer %d", idx))
		return
	}
	msg := c.bytes(idx)[:n]
	h, err := ParseBSDH(msg)
	if err == nil && h.MSeq != c.lastRecv+1 {
		err = fmt.Errorf("%w: MSeq %d after %d", ErrMalformed, h.MSeq, c.lastRecv)
	}
	if sent := c.nextMSeq - 1; err == nil && int32(h.MSeqAck-sent) > 0 {
		// An acknowledgement of a message we never sent: taken, it
		// would give credits for receives the peer never posted.
		err = fmt.Errorf("%w: MSeqAck %d, our last MSeq %d", ErrMalformed, h.MSeqAck, sent)
	}
	if err == nil && c.eof && (h.MID == MIDData && n > BSDHLen || h.MID == MIDSrcAvail || h.MID == MIDDisConn) {
		// The DisConn came after the peer's last octet (Annex A4's
		// graceful close; TCP's FIN): what it sends after it may be
		// credits and answers, no data. The data is dropped and the
		// peer reset; Reads see the EOF the DisConn gave.
		err = fmt.Errorf("%w: %v after the peer's DisConn", ErrMalformed, h.MID)
	}
	if err != nil {
		c.abort(err)
		return
	}
	c.stats.MessagesReceived++
	c.lastRecv = h.MSeq
	// The peer's MSeqAck only moves forward; Bufs are as of its
	// MSeqAck.
	if int32(h.MSeqAck-c.peerAck) >= 0 {
		c.peerAck, c.peerBufs = h.MSeqAck, h.Bufs
	}
	if c.smOpen && c.smSent && int32(h.MSeqAck-c.smMSeq) >= 0 {
		c.smOpen = false // the peer has seen our SendSM
	}
	switch h.MID {
	case MIDData:
		if n > BSDHLen {
			c.queue = append(c.queue, rxMsg{idx: idx, off: BSDHLen, end: n})
			c.notify()
			return
		}
		// A credit update: only the BSDH mattered.
	case MIDDisConn:
		c.eof = true
	case MIDAbortConn:
		c.fail(syscall.ECONNRESET)
	case MIDSrcAvail:
		sa := ParseSrcAvail(msg)
		if sa.Len == 0 || n != BSDHLen+16 {
			// Data carried in a SrcAvail is the Combined mode of
			// the first SDP generation, which we do not speak.
			c.abort(fmt.Errorf("%w: SrcAvail of %d octets advertising %d", ErrMalformed, n, sa.Len))
			return
		}
		if c.smOpen {
			break // sent before the peer saw our SendSM: declined
		}
		if c.recvBuffered {
			c.abort(fmt.Errorf("%w: a SrcAvail after the peer's ModeChange to Buffered", ErrMalformed))
			return
		}
		if c.peerAdvs >= maxAdverts {
			c.abort(fmt.Errorf("%w: a SrcAvail beyond the %d outstanding our MaxAdverts allows", ErrMalformed, maxAdverts))
			return
		}
		c.peerAdvs++
		c.queue = append(c.queue, rxMsg{zero: true, src: sa})
		c.startRead()
	case MIDSrcAvailCancel:
		// Withdrawn: those we have not begun to read are declined
		// (SendSM), and the source sends their data by Bcopy; those
		// begun complete, and their RdmaRdCompls go first, so that
		// the SendSM answers every SrcAvail still outstanding, as our
		// own source takes it.
		d := 0
		for i := 0; i < len(c.queue); {
			if m := &c.queue[i]; m.zero && m.requested == 0 {
				c.queue = append(c.queue[:i], c.queue[i+1:]...)
				d++
				continue
			}
			i++
		}
		if d > 0 {
			c.smOpen, c.smSent = true, false
			c.smAfter += d
			c.declineAfterReads()
		}
	case MIDRdmaRdCompl:
		// It answers the oldest SrcAvail outstanding, whole.
		if k := int(ParseLen(msg)); len(c.zAdvs) == 0 || c.zsrcSM || k != c.zAdvs[0] {
			c.abort(fmt.Errorf("%w: RdmaRdCompl of %d octets, %v advertised", ErrMalformed, k, c.zAdvs))
			return
		}
		k := c.zAdvs[0]
		c.zAdvs = c.zAdvs[1:]
		c.zHead = (c.zHead + k) % zSize
	case MIDSendSM:
		// Our SrcAvails declined, every one outstanding: their data
		// goes by Bcopy (pump), in order. With none outstanding there
		// is nothing to end.
		if len(c.zAdvs) > 0 {
			c.zsrcSM = true
		}
	case MIDSinkAvail:
		// A sink's buffer for Write Zcopy may be ignored: the data
		// comes by Bcopy or Read Zcopy. It stays outstanding until
		// the peer cancels it, and no more than MaxAdverts may be.
		if c.peerSinks >= maxAdverts {
			c.abort(fmt.Errorf("%w: a SinkAvail beyond the %d outstanding our MaxAdverts allows", ErrMalformed, maxAdverts))
			return
		}
		c.peerSinks++
	case MIDSinkAvailCancel:
		// Annex A4: the source completes the SinkAvails it has begun
		// to fill (RdmaWrCompl) and acknowledges the cancel of the
		// rest with SinkCancelAck. We begin none, so every one is
		// dropped unused, and the peer, which waits for the
		// acknowledgement before it takes its buffers back, gets it
		// whatever we counted.
		if !c.owe(MIDSinkCancelAck, "SinkAvailCancel") {
			return
		}
		c.peerSinks = 0
	case MIDChRcvBuf:
		// A request to change the size of our receive buffers: they
		// are posted and the peer's credits count them, so we keep
		// the size, and the acknowledgement says so (Annex A4 lets the
		// receiver refuse; the first SDP generation did the same).
		if !c.owe(MIDChRcvBufAck, "ChRcvBuf") {
			return
		}
	case MIDModeChange:
		if !c.modeChange(msg[BSDHLen]) {
			return
		}
	default:
		c.abort(fmt.Errorf("sdp: %v is not supported", h.MID))
		return
	}
	c.repost(idx)
	c.notify()
}

// owe queues the answer to a request of the peer's (SinkAvailCancel,
// ChRcvBuf) and reports whether the connection goes on: a peer that asks
// again before our answer to the first could go (it gives us no credit
// for it) is reset, so that what waits for credits stays bounded (c.mu
// held).
func (c *Conn) owe(answer MID, req string) bool {
	for _, m := range c.ctrl {
		if m.mid == answer {
			c.abort(fmt.Errorf("%w: a second %s before our %v to the first could go", ErrMalformed, req, answer))
			return false
		}
	}
	m := ctrlMsg{mid: answer}
	if answer == MIDChRcvBufAck {
		m.n = bufSize
	}
	c.ctrl = append(c.ctrl, m)
	return true
}

// modeChange takes the peer's ModeChange, whose first octet is mch, and
// reports whether the connection goes on (c.mu held). Annex A4's modes
// are per direction: Buffered (Bcopy only), Combined (one SrcAvail
// outstanding, carrying data), Pipelined (up to MaxAdverts SrcAvails).
// A data source changes its peer's receiving half, a data sink its
// peer's sending half, and a change to the mode already in force is a
// protocol error (as the first SDP generation reads the annex). Our
// receiving half starts Pipelined, as ib_sdp's does (SrcAvails without
// data, MaxAdverts outstanding), and takes a source's change to Buffered
// (with none of its SrcAvails outstanding) and back; Combined we do not
// speak, and our sending half is always Pipelined: any other change
// resets the connection.
func (c *Conn) modeChange(mch byte) bool {
	mode := mch >> 4
	cur := byte(modePipelined)
	if c.recvBuffered {
		cur = modeBuffered
	}
	var err error
	switch {
	case mode&modeSendHalf != 0:
		err = fmt.Errorf("sdp: ModeChange of our sending half to mode %d: it is Pipelined, and stays so", mode&^modeSendHalf)
	case mode == cur:
		err = fmt.Errorf("%w: ModeChange to the mode in force (%d)", ErrMalformed, mode)
	case mode == modeBuffered && c.peerAdvs > 0:
		err = fmt.Errorf("%w: ModeChange to Buffered with %d SrcAvails outstanding", ErrMalformed, c.peerAdvs)
	case mode == modeBuffered, mode == modePipelined:
		c.recvBuffered = mode == modeBuffered
		return true
	case mode == modeCombined:
		err = errors.New("sdp: ModeChange to Combined, which we do not speak")
	default:
		err = fmt.Errorf("%w: ModeChange to mode %d", ErrMalformed, mode)
	}
	c.abort(err)
	return false
}

// The sink region is a ring: RDMA Reads fill it at its tail, in the order
// of the SrcAvails, while Read takes from its head, so that the next part
// is on its way while the application copies the last out. sinkHead is
// the next octet Read takes, sinkUsed the octets from there on that are
// read or being read.

// startRead posts RDMA Reads of the next parts of the SrcAvails queued,
// each as much as fits in the sink region before its end, while fewer
// than maxReads are in flight (c.mu held).
func (c *Conn) startRead() {
	for len(c.reads) < maxReads && c.readNext() {
	}
}

// readNext posts one RDMA Read, if there is a part to read and room for
// it, and reports whether it did (c.mu held).
func (c *Conn) readNext() bool {
	if c.err != nil || c.closed {
		return false
	}
	if c.sinkUsed == 0 {
		c.sinkHead = 0 // whole parts rather than the ring's end
	}
	tail := (c.sinkHead + c.sinkUsed) % zSize
	room := min(zSize-c.sinkUsed, zSize-tail, zSize/maxReads)
	if room == 0 {
		return false
	}
	for i := range c.queue {
		m := &c.queue[i]
		if !m.zero || m.requested == int(m.src.Len) {
			continue
		}
		if i >= maxSinkParts {
			return false // until the application takes some
		}
		k := min(int(m.src.Len)-m.requested, room)
		err := c.ep.PostRead(readCookie, client.Segment{LMR: c.lmr, Offset: uint64(zSinkOff + tail), Length: uint32(k)},
			client.RemoteBuffer{Context: m.src.STag, Address: m.src.VA + uint64(m.requested)}, client.Signaled)
		if err != nil {
			c.abort(fmt.Errorf("sdp: RDMA Read: %w", err))
			return false
		}
		m.requested += k
		c.sinkUsed += k
		c.reads = append(c.reads, k)
		return true
	}
	return false
}

// readDone: the oldest RDMA Read in flight brought its part, readLen
// octets (c.mu held). Reads complete in the order they were posted, and
// each is of one SrcAvail, the first not yet arrived whole.
func (c *Conn) readDone(readLen int) {
	for i := range c.queue {
		if m := &c.queue[i]; m.zero && m.arrived < m.requested {
			m.arrived += readLen
			if m.arrived == int(m.src.Len) {
				// All of it is here: the source's region is free
				// now, not once it is taken.
				c.ctrl = append(c.ctrl, ctrlMsg{mid: MIDRdmaRdCompl, n: m.src.Len})
				c.declineAfterReads()
			}
			break
		}
	}
	c.startRead()
	c.notify()
}

// takeZero copies what Read may take of the SrcAvail at the queue's head
// into b (c.mu held).
func (c *Conn) takeZero(b []byte) int {
	m := &c.queue[0]
	n := min(len(b), m.arrived-m.taken, zSize-c.sinkHead)
	copy(b, c.buf.Bytes[zSinkOff+c.sinkHead:zSinkOff+c.sinkHead+n])
	c.sinkHead = (c.sinkHead + n) % zSize
	c.sinkUsed -= n
	m.taken += n
	c.stats.ZcopyReceived += uint64(n)
	if m.taken == int(m.src.Len) {
		c.queue = c.queue[1:]
	}
	c.startRead()
	c.pump()
	return n
}

// pump sends what waited for a credit or a send buffer: messages without
// data, then a declined SrcAvail's data by Bcopy (c.mu held).
func (c *Conn) pump() {
	for len(c.ctrl) > 0 && c.err == nil && c.mayAnswer() && len(c.free) > 0 {
		m := c.ctrl[0]
		var p []byte
		switch m.mid {
		case MIDRdmaRdCompl, MIDChRcvBufAck:
			p = binary.BigEndian.AppendUint32(nil, m.n)
		}
		mseq := c.nextMSeq
		if err := c.send(m.mid, p); err != nil {
			c.fail(fmt.Errorf("sdp: send: %w", err))
			return
		}
		c.ctrl = c.ctrl[1:]
		switch m.mid {
		case MIDRdmaRdCompl:
			c.peerAdvs--
		case MIDSendSM:
			c.peerAdvs -= m.declined
			c.smSent, c.smMSeq = true, mseq
		}
	}
	for c.zsrcSM && c.err == nil && c.credits() > reserve && len(c.free) > 0 {
		// The advertised octets may wrap at the region's end (two
		// SrcAvails, one each side of it).
		adv := c.advertised()
		at := (c.zHead + c.zsrcSent) % zSize
		k := min(adv-c.zsrcSent, c.maxData(), zSize-at)
		if err := c.send(MIDData, c.zbuf.Bytes[at:at+k]); err != nil {
			c.fail(fmt.Errorf("sdp: send: %w", err))
			return
		}
		if c.zsrcSent += k; c.zsrcSent == adv {
			c.zHead, c.zAdvs, c.zsrcSent, c.zsrcSM = (c.zHead+adv)%zSize, c.zAdvs[:0], 0, false
			c.notify()
		}
	}
	c.advertise()
}

// advertise sends SrcAvails for the octets pending in the source region
// while fewer than the peer's MaxAdverts are outstanding, each as many
// octets as lie before the region's end, and no more than the region's
// share of one SrcAvail of those the peer allows, so that the next is
// out before the sink has read the last (c.mu held).
func (c *Conn) advertise() {
	for len(c.zAdvs) < c.peerAdverts && c.zPend > 0 && !c.zsrcSM && c.err == nil && c.credits() > reserve && len(c.free) > 0 {
		at := (c.zHead + c.advertised()) % zSize
		k := min(c.zPend, zSize-at, zSize/c.peerAdverts)
		var x [16]byte
		SrcAvail{Len: uint32(k), STag: c.zlmr.Context, VA: c.zlmr.Address(uint64(at))}.Put(x[:])
		if err := c.send(MIDSrcAvail, x[:]); err != nil {
			c.fail(fmt.Errorf("sdp: send: %w", err))
			return
		}
		c.zAdvs = append(c.zAdvs, k)
		c.zPend -= k
		c.notify()
	}
}

// advertised is the octets of the SrcAvails outstanding (c.mu held).
func (c *Conn) advertised() int {
	n := 0
	for _, k := range c.zAdvs {
		n += k
	}
	return n
}

// declineAfterReads queues the SendSM for the SrcAvails a cancel declined
// once no SrcAvail begun is still being read, so that it follows their
// RdmaRdCompls (c.mu held).
func (c *Conn) declineAfterReads() {
	if c.smAfter == 0 {
		return
	}
	for i := range c.queue {
		if m := &c.queue[i]; m.zero && m.arrived < int(m.src.Len) {
			return
		}
	}
	c.ctrl = append(c.ctrl, ctrlMsg{mid: MIDSendSM, declined: c.smAfter})
	c.smAfter = 0
}

// abort resets the connection: an AbortConn if a credit allows, then
// the QP's abortive close (c.mu held).
func (c *Conn) abort(why error) {
	if c.err != nil {
		return
	}
	if c.credits() >= 1 {
		_ = c.sendControl(MIDAbortConn)
	}
	c.fail(fmt.Errorf("%w: %w", syscall.ECONNRESET, why))
	_ = c.ep.Disconnect(false)
}

// repost gives receive buffer idx back to the peer and sends a credit
// update if the peer has fewer than half our buffers to send into and
// nothing of ours is about to tell it (c.mu held).
func (c *Conn) repost(idx int) {
	if c.err != nil || c.closed || c.gone {
		return
	}
	if err := c.ep.PostRecv(uint64(idx), []client.Segment{c.seg(idx, bufSize)}); err != nil {
		c.fail(fmt.Errorf("sdp: repost: %w", err))
		return
	}
	c.posted++
	if given := c.given(); given < recvBufs/2 && c.posted > given && c.credits() >= 1 && len(c.free) > 0 {
		if c.sendControl(MIDData) == nil {
			c.stats.CreditUpdatesSent++
		}
	}
}

// given is the credits the peer has to us, as our latest message told it
// (c.mu held). A message sent now gives it more if c.posted is more.
func (c *Conn) given() int { return int(int32(c.advAck-c.lastRecv)) + c.advBufs }

// mayAnswer reports whether a message without data that answers the peer
// (RdmaRdCompl, SendSM, SinkCancelAck, ChRcvBufAck) may go now (c.mu
// held). Annex A4 CA4-82: with one credit left, only a message that gives
// credits and carries no data may be sent; otherwise both ends could
// spend their last credits on answers and neither could ever send the
// other a credit again. An answer that gives credits (receives posted
// since our last message) is such a message.
func (c *Conn) mayAnswer() bool {
	cr := c.credits()
	return cr >= 2 || cr == 1 && c.posted > c.given()
}

// sendControl sends a message without data (c.mu held; a free buffer
// and a credit there).
func (c *Conn) sendControl(mid MID) error {
	if len(c.free) == 0 {
		return errors.New("sdp: no send buffer")
	}
	return c.send(mid, nil)
}

// send posts one message with data p (c.mu held; a credit and a free
// buffer there).
func (c *Conn) send(mid MID, p []byte) error {
	idx := c.free[len(c.free)-1]
	b := c.bytes(idx)
	h := BSDH{MID: mid, Bufs: uint16(c.posted), Len: uint32(BSDHLen + len(p)), MSeq: c.nextMSeq, MSeqAck: c.lastRecv}
	h.Put(b)
	copy(b[BSDHLen:], p)
	// A Data message, a SrcAvail and an RdmaRdCompl are signaled only
	// when the send buffers run below half, so that a completion is one
	// wake-up per several messages, not one per message; any other
	// message always is, so that the last send of a connection (a
	// DisConn, or a credit update after it) completes.
	var flags client.Flags
	// After our DisConn (wrClosed) every message is signaled: Close
	// waits for the last to complete.
	streaming := !c.wrClosed && (mid == MIDData && len(p) > 0 || mid == MIDSrcAvail || mid == MIDRdmaRdCompl)
	if !streaming || len(c.free)-1 < sendBufs/2 {
		flags = client.Signaled
	}
	if err := c.ep.PostSend(uint64(idx), []client.Segment{c.seg(idx, int(h.Len))}, flags); err != nil {
		return err
	}
	c.free = c.free[:len(c.free)-1]
	c.inflight = append(c.inflight, idx)
	c.sendsOut++
	c.nextMSeq++
	c.advAck, c.advBufs = c.lastRecv, c.posted
	c.stats.MessagesSent++
	if cr := c.credits(); c.stats.MinCredits < 0 || cr < c.stats.MinCredits {
		c.stats.MinCredits = cr
	}
	return nil
}

// Read reads data the peer sent, as a TCP connection's Read.
func (c *Conn) Read(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case c.closed:
			return 0, c.opErr("read", net.ErrClosed)
		case pastDeadline(c.rdDeadline):
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		case len(b) == 0:
			return 0, nil
		case len(c.queue) > 0 && c.queue[0].zero && c.queue[0].arrived > c.queue[0].taken:
			return c.takeZero(b), nil
		case len(c.queue) > 0 && !c.queue[0].zero:
			m := &c.queue[0]
			n := copy(b, c.bytes(m.idx)[m.off:m.end])
			m.off += n
			if m.off == m.end {
				idx := m.idx
				c.queue = c.queue[1:]
				c.repost(idx)
			}
			return n, nil
		case len(c.queue) > 0:
			// A SrcAvail's data is on its way, unless the connection
			// broke.
			if c.err != nil {
				return 0, c.opErr("read", c.err)
			}
			c.wait(c.rdDeadline, false)
			continue
		case c.eof:
			return 0, io.EOF
		case c.err != nil:
			return 0, c.opErr("read", c.err)
		}
		c.wait(c.rdDeadline, true)
	}
}

func pastDeadline(t time.Time) bool { return !t.IsZero() && !time.Now().Before(t) }

// maxData is the most data one message carries (c.mu held).
func (c *Conn) maxData() int { return min(bufSize, c.peerRcvSz) - BSDHLen }

// Write sends b, as a TCP connection's Write: it returns once every octet
// is in a posted Send, or with the error that stopped it.
func (c *Conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for n < len(b) {
		switch {
		case c.closed:
			return n, c.opErr("write", net.ErrClosed)
		case pastDeadline(c.wrDeadline):
			return n, c.opErr("write", os.ErrDeadlineExceeded)
		case c.err != nil:
			return n, c.opErr("write", c.err)
		case c.wrClosed:
			return n, c.opErr("write", syscall.EPIPE)
		}
		// A Write from the threshold up goes into the source region, and
		// so does everything after it while the region holds data, so
		// that nothing overtakes it (a declined SrcAvail's data must be
		// next in the stream). The region is the connection's send
		// buffer: a Write returns once its octets are there, and the
		// next SrcAvail advertises all that gathered meanwhile.
		if rest, held := len(b)-n, c.advertised()+c.zPend; held > 0 || c.threshold > 0 && rest >= c.threshold {
			if space := zSize - held; space > 0 {
				k := min(rest, space)
				tail := (c.zHead + held) % zSize
				m := copy(c.zbuf.Bytes[tail:], b[n:n+k])
				copy(c.zbuf.Bytes, b[n+m:n+k])
				c.zPend += k
				c.stats.ZcopySent += uint64(k)
				n += k
				c.advertise()
				continue
			}
		} else if c.credits() > reserve && len(c.free) > 0 {
			k := min(len(b)-n, c.maxData())
			if err := c.send(MIDData, b[n:n+k]); err != nil {
				c.fail(fmt.Errorf("sdp: send: %w", err))
				continue
			}
			n += k
			continue
		}
		c.wait(c.wrDeadline, false)
	}
	return n, nil
}

// lingerTimeout bounds how long a closed connection goes on, in the
// background, waiting for a credit to send its DisConn and for its sends to
// complete, as an orphaned TCP connection sends its FIN; past it the
// connection is reset.
const lingerTimeout = 10 * time.Second

// CloseWrite sends a DisConn after the data written: the peer reads EOF,
// and may go on writing (a TCP half-close). It waits for a credit, at most
// until the write deadline, as it is while it waits (SetWriteDeadline
// moves it, as it moves a waiting Write's), or lingerTimeout without one.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("close", net.ErrClosed)
	}
	linger := time.Now().Add(lingerTimeout)
	deadline := func() time.Time {
		if c.wrDeadline.IsZero() {
			return linger
		}
		return c.wrDeadline
	}
	if err := c.disconnect(deadline); err != nil {
		return c.opErr("close", err)
	}
	return nil
}

// disconnect sends the DisConn once, waiting at most until deadline()
// (c.mu held; deadline is read again after every wait). It takes two
// credits: the last one is only for a message that gives credits (CA4-82).
func (c *Conn) disconnect(deadline func() time.Time) error {
	if c.wrClosed {
		return nil
	}
	// After every octet written: the source region's too.
	for c.err == nil && (c.credits() < 2 || len(c.free) == 0 || c.advertised()+c.zPend > 0) {
		d := deadline()
		if pastDeadline(d) {
			return os.ErrDeadlineExceeded
		}
		c.wait(d, false)
	}
	if c.err != nil {
		return c.err
	}
	c.wrClosed = true
	return c.sendControl(MIDDisConn)
}

// SetLinger sets what Close does with data not yet delivered, as a TCP
// connection's: sec < 0 (the default) sends it and the DisConn in the
// background, sec == 0 resets the connection at once, sec > 0 has Close
// wait up to sec seconds for it to go, then reset.
func (c *Conn) SetLinger(sec int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.linger = sec
	return nil
}

// SetZcopyThreshold sets the size from which a Write goes by Read Zcopy
// (DefaultZcopyThreshold to begin with); 0 sends everything by Bcopy.
func (c *Conn) SetZcopyThreshold(n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.threshold = max(n, 0)
	return nil
}

// The TCP options below are accepted, so that code written for a
// *net.TCPConn (or Dialer.Setup and ListenConfig.Setup) runs unchanged,
// and mean what follows for an SDP connection; each fails with
// net.ErrClosed after Close, as TCP's do.

// SetNoDelay: every Write is sent at once, as with TCP_NODELAY; false
// does not make Writes wait for one another (there is no Nagle here).
func (c *Conn) SetNoDelay(bool) error { return c.setOK() }

// SetKeepAlive and SetKeepAlivePeriod: the daemon's TCP connection
// under the RDMA stream keeps itself alive (its retransmissions and
// timeouts), and a peer that vanishes ends it (a Read or Write then
// fails with a reset), whatever is set.
func (c *Conn) SetKeepAlive(bool) error                { return c.setOK() }
func (c *Conn) SetKeepAlivePeriod(time.Duration) error { return c.setOK() }

// SetReadBuffer and SetWriteBuffer: the buffers are fixed when the
// connection is made, the posted receives and sends (16 of 64 KiB each
// way) and the Read Zcopy regions (4 MiB each way), whatever is set.
func (c *Conn) SetReadBuffer(int) error  { return c.setOK() }
func (c *Conn) SetWriteBuffer(int) error { return c.setOK() }

func (c *Conn) setOK() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	return nil
}

// Close closes the connection: Reads and Writes waiting return
// net.ErrClosed, and the data written goes to the peer before its DisConn
// (see SetLinger). Unlike a kernel socket's, that goes on in this process:
// one that exits at once after Close resets what had not gone (the daemon
// aborts a departed session's connections). SetLinger(n) with n > 0 makes
// Close wait for it, and so, in effect, does CloseWrite followed by
// reading to the EOF of a peer that closes once it has read everything.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	c.notify()
	linger := c.linger
	if len(c.queue) > 0 {
		// Data not read: the peer is reset, as Linux resets a TCP
		// connection closed with unread data.
		linger = 0
	}
	c.mu.Unlock()
	switch {
	case linger == 0:
		c.finish(time.Now())
	case linger > 0:
		c.finish(time.Now().Add(time.Duration(linger) * time.Second))
	default:
		go c.finish(time.Now().Add(lingerTimeout))
	}
	return nil
}

// finish sends the DisConn after what was written and lets the connection
// go, gracefully if that was done by the deadline (a FIN each way, then the
// EP freed), abortively otherwise.
func (c *Conn) finish(deadline time.Time) {
	c.mu.Lock()
	graceful := c.err == nil && time.Now().Before(deadline) && c.disconnect(func() time.Time { return deadline }) == nil
	for graceful && c.err == nil && (c.sendsOut > 0 || c.advertised()+c.zPend > 0) {
		if pastDeadline(deadline) {
			graceful = false
			break
		}
		c.wait(deadline, false)
	}
	graceful = graceful && c.err == nil
	if graceful {
		// Our FIN, then the peer's (its RNIC answers one in order),
		// before the EP goes: freeing a connected EP is an abort (DAT's
		// ep_free), a reset that would end the peer's connection broken
		// while it closes in order too.
		c.mu.Unlock()
		_ = c.ep.Disconnect(true)
		c.mu.Lock()
		for !c.gone && c.err == nil && !pastDeadline(deadline) {
			c.wait(deadline, false)
		}
	}
	// The background goroutine, and a call asleep on the EVD when Close
	// came, let go of it before the EVD goes.
	c.stopping = true
	c.notify()
	for c.polling || !c.bgDone {
		c.follow(time.Time{})
	}
	c.released = true
	c.mu.Unlock()
	if !graceful {
		_ = c.ep.Disconnect(false)
	}
	c.release()
}

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "sdp", Source: c.local, Addr: c.remote, Err: err}
}

// LocalAddr and RemoteAddr are the connection's TCP addresses.
func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both deadlines, as a TCP connection's.
func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdDeadline, c.wrDeadline = t, t
	c.notify()
	return nil
}

// SetReadDeadline sets the deadline of Reads, waiting and future.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdDeadline = t
	c.notify()
	return nil
}

// SetWriteDeadline sets the deadline of Writes, waiting and future.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.wrDeadline = t
	c.notify()
	return nil
}

// Stats returns the connection's counters.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}
