package rnic

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/qp"
)

// QPAttr describes a queue pair.
type QPAttr struct {
	SQDepth, RQDepth int
	// IRD and ORD offered in MPA startup; the negotiated values apply.
	IRD, ORD       int
	SendCQ, RecvCQ *completion.CQ
	// MaxInline bounds inline data (0: qp.DefaultInline, at most
	// qp.MaxInline).
	MaxInline int
	// NoCRC does not ask for MPA CRC32c (it is still used if the peer
	// asks). CRC is on by default: Linux siw defaults it off, but data
	// integrity is what our users judge us by.
	NoCRC bool
	// Markers requires MPA markers in what this QP receives.
	Markers bool
	// MPARevision 1 speaks plain RFC 5044; 0 or 2 the RFC 6581 setup.
	MPARevision uint8
	// PeerToPeer asks for (initiator) or accepts (responder) the
	// peer-to-peer model with a zero-length RTR.
	PeerToPeer bool
	// OnEvent, if set, receives the connection events instead of the
	// Events channel. It runs with no lock of the QP held (it may call
	// the QP), on whichever goroutine released the QP's lock after the
	// event happened — on the accelerated datapath often the QP's
	// poller — so it must not block. Events come one at a time, in order.
	OnEvent func(ConnEvent)
	// BeforeReceive, if set, runs before the engine takes what arrived
	// from the peer, with the QP unlocked: a consumer that queues
	// receives elsewhere before posting them (the daemon: the client's
	// ring) posts them there, so that a Send the peer made after such a
	// receive was queued finds it posted instead of ending the
	// connection with "no buffer". On the accelerated datapath it runs
	// on the QP's poller and must not block.
	BeforeReceive func()
}

// Timeouts of connection management.
const (
	// DefaultMPATimeout bounds the wait for the MPA Reply (initiator) or
	// Request (responder).
	DefaultMPATimeout = 10 * time.Second
	// closeTimeout bounds the wait for the peer's FIN after ours.
	closeTimeout = 5 * time.Second
	ioBuf        = 256 << 10
)

// ConnEventKind classifies connection events.
type ConnEventKind uint8

// Connection events.
const (
	Established ConnEventKind = iota
	TerminateSent
	TerminateReceived
	Disconnected // terminal: orderly close
	Broken       // terminal: reset, loss or protocol error
)

func (k ConnEventKind) String() string {
	return [...]string{"established", "terminate-sent", "terminate-received", "disconnected", "broken"}[k]
}

// ConnEvent is a connection event of a QP.
type ConnEvent struct {
	Kind ConnEventKind
	Err  error
	// PrivateData of the peer, with Established.
	PrivateData []byte
}

// QP is a queue pair of the device with its connection.
type QP struct {
	dev  *Device
	pd   *PD
	attr QPAttr
	qpn  uint32

	// mu guards the engine and the connection state below. Callbacks
	// that run while it is held (the engine's events, completion
	// handlers of the CQs) must not block or take it again; connection
	// events are queued in evq while it is held and delivered by unlock
	// after it is released, so a consumer's OnEvent never runs under it.
	// Nothing holding mu calls into the TCP engine's driving calls (see
	// tcp/events.go), so engineConn's callbacks may take it.
	mu  sync.Mutex
	evq []ConnEvent
	// delivering: a goroutine is delivering evq (see unlock).
	delivering bool
	eng        *qp.QP
	conn       *net.TCPConn
	ec         *engineConn // the connection on the accelerated datapath
	// accepting: an accelerated-datapath Accept has taken the QP and
	// has not yet published ec.
	accepting bool
	// cpuCalls and cpuOff: engine calls counted by noteCPU, and those
	// off the poller's CPU (with cpuCheck on).
	cpuCalls, cpuOff int
	sentTot          uint64
	abort            bool
	finSent          bool
	heard            atomic.Bool // the receive loop has read something
	// writing is set while the transmit loop has FPDUs in conn.Write that
	// the engine has not yet been told were sent; wrote is signalled when
	// it clears. See llpClosed.
	writing bool
	wrote   chan struct{}

	events chan ConnEvent
	txWake chan struct{}
	rxDone chan struct{}
	loops  sync.WaitGroup

	destroyOnce sync.Once
}

// CreateQP creates a queue pair in a protection domain.
func (d *Device) CreateQP(pd *PD, attr QPAttr) (*QP, error) {
	if pd == nil || pd.dev != d {
		return nil, fmt.Errorf("create QP: %w", ErrInvalidHandle)
	}
	// Seed 004: a QP runs on its CQ's poller, so both CQs share one.
	if attr.SendCQ != nil && attr.RecvCQ != nil && attr.SendCQ.Vector() != attr.RecvCQ.Vector() {
		return nil, fmt.Errorf("create QP: send CQ on vector %d, receive CQ on %d: %w",
			attr.SendCQ.Vector(), attr.RecvCQ.Vector(), ErrInvalidParam)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, ErrClosed
	}
	if len(d.qps) >= MaxQPs {
		d.mu.Unlock()
		return nil, fmt.Errorf("create QP: %w", ErrResources)
	}
	d.qpn++
	q := &QP{dev: d, pd: pd, attr: attr, qpn: d.qpn, events: make(chan ConnEvent, 8), txWake: make(chan struct{}, 1),
		wrote: make(chan struct{}, 1)}
	d.qps[q.qpn] = q
	d.mu.Unlock()
	eng, err := qp.New(qp.Config{QPN: q.qpn, PD: pd.id, SQDepth: attr.SQDepth, RQDepth: attr.RQDepth,
		IRD: attr.IRD, ORD: attr.ORD, MaxInline: attr.MaxInline, SendCQ: attr.SendCQ, RecvCQ: attr.RecvCQ, Mem: &d.stags,
		Events: q.engineEvent})
	if err != nil {
		d.mu.Lock()
		delete(d.qps, q.qpn)
		d.mu.Unlock()
		return nil, fmt.Errorf("create QP: %w: %v", ErrInvalidParam, err)
	}
	q.eng = eng
	pd.refs.Add(1)
	return q, nil
}

// QPN is the queue pair number.
func (q *QP) QPN() uint32 { return q.qpn }

// Ended reports that the QP's connection is over.
func (q *QP) Ended() bool {
	q.mu.Lock()
	defer q.unlock()
	return q.eng.Ended()
}

// Addrs returns the connection's local and remote addresses, or empty
// strings when the QP has no connection.
func (q *QP) Addrs() (local, remote string) {
	q.mu.Lock()
	defer q.unlock()
	if q.ec != nil {
		return q.ec.addrs()
	}
	if q.conn == nil {
		return "", ""
	}
	return q.conn.LocalAddr().String(), q.conn.RemoteAddr().String()
}

// Vector is the completion vector (poller) the QP and its CQs belong to.
func (q *QP) Vector() int { return q.attr.SendCQ.Vector() }

// Events delivers the QP's connection events; the last is Disconnected or
// Broken, exactly once.
func (q *QP) Events() <-chan ConnEvent { return q.events }

// State is the engine's RFC 5040 state.
func (q *QP) State() qp.State {
	q.mu.Lock()
	defer q.unlock()
	return q.eng.State()
}

// engineEventKinds maps the engine's terminal events to the device's.
var engineEventKinds = map[qp.EventKind]ConnEventKind{qp.TerminateSent: TerminateSent, qp.TerminateReceived: TerminateReceived,
	qp.Disconnected: Disconnected, qp.Broken: Broken}

// engineEvent runs under q.mu: it must not block.
func (q *QP) engineEvent(e qp.Event) {
	q.post(ConnEvent{Kind: engineEventKinds[e.Kind], Err: e.Err})
}

// post queues a connection event for delivery when q.mu is released;
// q.mu held.
func (q *QP) post(ev ConnEvent) { q.evq = append(q.evq, ev) }

// unlock releases q.mu and then delivers the events posted while it was
// held, with no lock held. One goroutine delivers at a time, taking what
// others post meanwhile, so events reach the consumer in order.
func (q *QP) unlock() {
	if len(q.evq) == 0 || q.delivering {
		q.mu.Unlock()
		return
	}
	q.delivering = true
	for len(q.evq) > 0 {
		evs := q.evq
		q.evq = nil
		q.mu.Unlock()
		for _, ev := range evs {
			q.deliver(ev)
		}
		q.mu.Lock()
	}
	q.delivering = false
	q.mu.Unlock()
}

// deliver hands one event to the consumer; no lock held.
func (q *QP) deliver(ev ConnEvent) {
	if q.attr.OnEvent != nil {
		q.attr.OnEvent(ev)
		return
	}
	select {
	case q.events <- ev:
	default:
		// At most four events per QP fit in the buffer; a consumer that
		// never reads loses only the oldest.
		select {
		case <-q.events:
		default:
		}
		q.events <- ev
	}
}

// PostSend posts a send work request.
func (q *QP) PostSend(wr *qp.SendWR) error {
	q.mu.Lock()
	err := q.eng.PostSend(wr)
	work := err == nil && q.conn != nil
	ec := q.ec
	q.unlock()
	if work {
		q.wake()
	}
	if err == nil && ec != nil {
		ec.kick()
	}
	return err
}

// PostRecv posts a receive work request; it may be posted before the QP is
// connected.
func (q *QP) PostRecv(wr *qp.RecvWR) error {
	q.mu.Lock()
	defer q.unlock()
	return q.eng.PostRecv(wr)
}

func (q *QP) wake() {
	select {
	case q.txWake <- struct{}{}:
	default:
	}
}

// Disconnect closes the connection: gracefully (outstanding requests finish,
// then FIN) or abortively (RST, everything flushed).
func (q *QP) Disconnect(graceful bool) {
	q.mu.Lock()
	// A connection that already ended in order (Disconnected: the
	// peer's FIN came and ours is queued, digest 004 §6) has nothing
	// left to abort: its LLP finishes the close on its own timers, as a
	// socket Linux siw releases does. Resetting it instead would throw
	// away our FIN if it is not yet sent or acknowledged, and the peer,
	// which did nothing wrong, would end Broken.
	if !graceful && !q.closedInOrderLocked() {
		q.abort = true
		if q.conn != nil {
			// A transmit loop blocked in Write on a peer that stopped
			// reading or acknowledging would see the abort only when
			// the write ended, and one waiting for the peer's FIN
			// after a Terminate only at closeTimeout: end both now;
			// the transmit loop then resets the connection.
			_ = q.conn.SetDeadline(time.Now())
		}
	}
	q.eng.Disconnect(graceful)
	ec := q.ec
	q.unlock()
	q.wake()
	if ec != nil {
		ec.kick()
	}
}

// closedInOrderLocked: the connection ended with Disconnected; q.mu held.
func (q *QP) closedInOrderLocked() bool { return q.eng.Ended() && q.eng.State() == qp.Idle }

// Reset returns a QP whose connection ended to a fresh, unconnected state
// (DAT ep_reset), once its loops are done.
func (q *QP) Reset() error {
	q.mu.Lock()
	ended := q.eng.Ended()
	q.unlock()
	if !ended {
		return fmt.Errorf("reset QP %d: connection not over: %w", q.qpn, ErrState)
	}
	q.loops.Wait()
	q.mu.Lock()
	ec := q.ec
	q.unlock()
	if ec != nil {
		ec.detach(false)
	}
	q.mu.Lock()
	defer q.unlock()
	if err := q.eng.Reset(); err != nil {
		return fmt.Errorf("reset QP %d: %w", q.qpn, ErrState)
	}
	q.conn, q.ec, q.sentTot, q.abort, q.finSent = nil, nil, 0, false, false
	q.heard.Store(false)
	return nil
}

// Destroy aborts the connection if any (one that ended in order is left
// to finish its close), waits for its loops to end, and frees the QP.
func (q *QP) Destroy() {
	q.destroyOnce.Do(func() {
		q.Disconnect(false)
		q.loops.Wait()
		q.mu.Lock()
		ec, abort := q.ec, q.abort
		q.unlock()
		if ec != nil {
			ec.detach(abort)
		}
		q.dev.mu.Lock()
		delete(q.dev.qps, q.qpn)
		q.dev.mu.Unlock()
		q.pd.refs.Add(-1)
	})
}

// mpaConfig is what this QP asks for in MPA startup.
func (q *QP) mpaConfig(private []byte) mpa.Config {
	c := mpa.Config{Revision: q.attr.MPARevision, CRC: !q.attr.NoCRC, Markers: q.attr.Markers,
		IRD: uint16(q.attr.IRD), ORD: uint16(q.attr.ORD), PeerToPeer: q.attr.PeerToPeer, PrivateData: private}
	// As initiator we send a zero-length Write, the RTR every iWARP
	// implementation takes; as responder we accept Write and Read.
	c.RTR = mpa.RTRWrite | mpa.RTRRead
	return c
}

// start moves the engine to RTS on conn and runs the loops.
func (q *QP) start(conn *net.TCPConn, p mpa.Params, initiator bool, established ConnEvent) error {
	emss, err := effectiveMSS(conn)
	if err != nil {
		return err
	}
	q.mu.Lock()
	if err := q.eng.Connect(p, emss, initiator); err != nil {
		q.unlock()
		return err
	}
	q.conn = conn
	q.rxDone = make(chan struct{})
	// Counted before Established goes out: a consumer may Destroy the
	// QP as soon as it has the event, and Destroy waits for the loops.
	q.loops.Add(2)
	// Established goes out before the loops run: once they do, a reset
	// that arrives at once makes the receive loop post Broken, which
	// must come after it (seen: a responder whose initiator aborted
	// right after connecting got Broken, then Established).
	q.post(established)
	q.unlock()
	go q.rxLoop()
	go q.txLoop()
	q.wake()
	return nil
}

func effectiveMSS(c *net.TCPConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var mss int
	var serr error
	if err := rc.Control(func(fd uintptr) { mss, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("TCP_MAXSEG: %w", serr)
	}
	return min(mss, mpa.MaxULPDU), nil
}

func (q *QP) rxLoop() {
	defer q.loops.Done()
	defer close(q.rxDone)
	buf := make([]byte, ioBuf)
	for {
		n, err := q.conn.Read(buf)
		if n > 0 {
			q.heard.Store(true)
			if q.attr.BeforeReceive != nil {
				q.attr.BeforeReceive()
			}
			q.mu.Lock()
			q.eng.Receive(buf[:n])
			q.unlock()
			q.wake()
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				q.llpClosed(nil)
			} else {
				q.llpClosed(fmt.Errorf("%w: %v", ddp.LLPConnectionLost, err))
			}
			q.wake()
			return
		}
	}
}

// llpClosed tells the engine the stream ended, once the transmit loop has
// reported what it was writing: a peer can take our last Send, answer and
// close before conn.Write returns, and that Send must complete, not be
// flushed. It waits at most closeTimeout for a write the peer is not
// reading.
func (q *QP) llpClosed(err error) {
	deadline := time.After(closeTimeout)
	q.mu.Lock()
	defer q.unlock()
	for q.writing {
		q.unlock()
		select {
		case <-q.wrote:
		case <-deadline:
			q.mu.Lock()
			q.eng.LLPClosed(err)
			return
		}
		q.mu.Lock()
	}
	q.eng.LLPClosed(err)
}

// wroteDone ends a write begun in txLoop; q.mu is held.
func (q *QP) wroteDone() {
	q.writing = false
	select {
	case q.wrote <- struct{}{}:
	default:
	}
}

func (q *QP) txLoop() {
	defer q.loops.Done()
	buf := make([]byte, ioBuf)
	var closeTimer <-chan time.Time
	for {
		q.mu.Lock()
		n := q.eng.Transmit(buf)
		ended, drained, abort := q.eng.Ended(), q.eng.Drained(), q.abort
		q.writing = n > 0
		q.unlock()
		if n > 0 {
			if _, err := q.conn.Write(buf[:n]); err != nil {
				q.mu.Lock()
				q.wroteDone()
				q.eng.LLPClosed(fmt.Errorf("%w: %v", ddp.LLPConnectionLost, err))
				q.unlock()
				q.abortConn()
				return
			}
			q.mu.Lock()
			q.sentTot += uint64(n)
			q.eng.Sent(q.sentTot)
			q.wroteDone()
			q.unlock()
			continue
		}
		switch {
		case ended && abort:
			q.abortConn()
			return
		case ended:
			// Graceful end, or after a Terminate: FIN, then wait a
			// while for the peer's so the Terminate is delivered
			// (RFC 5040 §6.2.1) — unless the consumer aborts meanwhile
			// (Disconnect ends the wait), which resets.
			q.sendFIN()
			q.mu.Lock()
			if !q.abort {
				_ = q.conn.SetReadDeadline(time.Now().Add(closeTimeout))
			}
			q.unlock()
			<-q.rxDone
			q.mu.Lock()
			abort := q.abort
			q.unlock()
			if abort {
				q.abortConn()
			} else {
				_ = q.conn.Close()
			}
			return
		case drained:
			q.sendFIN()
			if closeTimer == nil {
				closeTimer = time.After(closeTimeout)
			}
		}
		select {
		case <-q.txWake:
		case <-closeTimer:
			// The peer never answered our FIN.
			q.mu.Lock()
			q.eng.LLPClosed(fmt.Errorf("%w: no FIN from the peer", ddp.LLPConnectionLost))
			q.abort = true
			q.unlock()
		}
	}
}

// nudgeDelay is how long an initiator waits for the first word from the
// peer before nudging it (see qp.QP.Nudge).
const nudgeDelay = 50 * time.Millisecond

// busyLocked: the QP has, or is getting, a connection, or cannot take one;
// q.mu held.
func (q *QP) busyLocked() bool {
	return q.conn != nil || q.ec != nil || q.accepting || q.eng.State() != qp.Idle || q.eng.Ended()
}

// nudgeIfSilent sends a zero-length Write if the peer has sent nothing
// since the connection came up although we have sent it FPDUs: Linux siw
// loses the wake-up for FPDUs that arrive between its MPA Reply and its
// QP taking over the socket, and waits until more data comes.
func (q *QP) nudgeIfSilent() {
	if q.heard.Load() {
		return
	}
	q.mu.Lock()
	sent := q.sentTot > 0
	if q.ec != nil {
		sent = q.ec.llp.sent > 0 // the engine datapath counts in its LLP
	}
	if sent {
		q.eng.Nudge()
	}
	ec := q.ec
	q.unlock()
	q.wake()
	if ec != nil {
		ec.kick()
	}
}

func (q *QP) sendFIN() {
	if !q.finSent {
		q.finSent = true
		_ = q.conn.CloseWrite()
	}
}

// abortConn resets the connection (SO_LINGER 0 makes close send RST).
func (q *QP) abortConn() {
	_ = q.conn.SetLinger(0)
	_ = q.conn.Close()
}
