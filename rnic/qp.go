package rnic

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
	"weak"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/shrink"
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
	// RTR is the set of RTR messages offered (initiator) or accepted
	// (responder) in the peer-to-peer model; zero is a zero-length Write
	// or Read, which every iWARP implementation takes.
	RTR mpa.RTR
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
	// Completed, if set, runs after a goroutine that made completions on
	// the QP's CQs under its lock has released it: with no lock of the
	// QP held, on that goroutine (the kernel datapath's receive or
	// posting goroutine, a poller, a consumer's call), before it goes on.
	// A consumer that forwards completions (the daemon: into its rings)
	// does it there, with no hand-off. It must not block.
	Completed func()
	// Poll, if set, looks for work the consumer queued elsewhere and
	// posts it (the daemon: the client's rings), reporting whether it
	// found any. On the kernel datapath the receive goroutine, once it
	// has delivered what arrived, calls it while nothing more arrives,
	// for at most PollFor (DefaultPollFor if 0), yielding the processor
	// between looks: an application that answers what it was sent has
	// its answer taken and sent from there, with no wake-up. It runs
	// with no lock held and must not block.
	Poll    func() bool
	PollFor time.Duration
	// PollDone, if set, is called when such a run of Polls ends.
	PollDone func()
}

// Timeouts of connection management.
const (
	// DefaultMPATimeout bounds the wait for the MPA Reply (initiator) or
	// Request (responder).
	DefaultMPATimeout = 10 * time.Second
	// closeTimeout bounds the wait for the peer's FIN after ours.
	closeTimeout = 5 * time.Second
	ioBuf        = 256 << 10
	// DefaultPollFor is QPAttr.PollFor's default: about two round trips
	// of kernel TCP between two hosts on one machine.
	DefaultPollFor = 50 * time.Microsecond
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
	// Nothing holding mu calls into its connection's driving calls (the
	// TCP engine's, see tcp/events.go; the kernel connection's mutex),
	// so the connections' callbacks may take it.
	mu  sync.Mutex
	evq []ConnEvent
	// delivering: a goroutine is delivering evq (see unlock).
	delivering bool
	eng        *qp.QP
	// conn is the QP's connection, on whichever datapath; nil before
	// Connect or Accept and after Reset.
	conn llpConn
	// accepting: an Accept has taken the QP and has not yet published
	// conn.
	accepting bool
	// cpuCalls and cpuOff: engine calls counted by noteCPU, and those
	// off the poller's CPU (with cpuCheck on).
	cpuCalls, cpuOff int
	// abort: the consumer disconnected abortively, or the peer did not
	// answer our FIN; the connection is reset.
	abort bool
	// batch counts BeginPosts not yet ended; batchKick: a post in the
	// batch waits for EndPosts to be sent.
	batch     int
	batchKick bool
	// closeTimer, if set, replaces the closeTimeout timer that attach
	// starts at our FIN (the engine fuzz harness runs it on its clock).
	closeTimer func(fire func())

	// events is made only for a consumer without OnEvent.
	events chan ConnEvent

	destroyOnce sync.Once
}

// llpConn is a QP's connection as the QP sees it, one implementation per
// datapath (llp_kernel.go, llp_engine.go). Its MPA layer (mpaConn) is read
// and driven under q.mu; the other methods are called with no lock held.
type llpConn interface {
	// mpa is the connection's MPA layer.
	mpa() *mpaConn
	// kick: work was posted or the QP disconnected; transmit what the
	// engine has (the kernel datapath from the calling goroutine when
	// its socket takes it), or reset the connection if q.abort.
	kick()
	// release lets go of the connection for Reset or Destroy, resetting
	// it if abort, once the QP's engine is over with it; it returns when
	// nothing of the connection runs the QP's engine any more.
	release(abort bool)
	addrs() (local, remote string)
	// diag describes the connection's state for Device.Dump; called
	// with no lock held.
	diag() string
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
	q := &QP{dev: d, pd: pd, attr: attr, qpn: d.newQPN()}
	if attr.OnEvent == nil {
		q.events = make(chan ConnEvent, 8)
	}
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

// newQPN picks a QP number no live QP of d has, at random in [2, 2^24):
// 24 bits as InfiniBand's (perftest and qperf keep them so), 0 and 1
// left out as InfiniBand's special QPs are. At random, not in sequence:
// a QP connected the InfiniBand way is found by its number, which a peer
// then cannot guess (daemon/ibconn.go). d.mu held.
func (d *Device) newQPN() uint32 {
	for {
		n := 2 + rand.Uint32N(1<<24-2)
		if _, used := d.qps[n]; !used {
			return n
		}
	}
}

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
	c := q.conn
	q.unlock()
	if c == nil {
		return "", ""
	}
	return c.addrs()
}

// Vector is the completion vector (poller) the QP and its CQs belong to.
func (q *QP) Vector() int { return q.attr.SendCQ.Vector() }

// Events delivers the QP's connection events; the last is Disconnected or
// Broken, exactly once. A QP made with OnEvent has none (nil).
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
	completed := q.attr.Completed != nil && q.eng.TakePushed()
	if completed {
		defer q.attr.Completed()
	}
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
	c := q.conn
	held := q.batch > 0
	if held && err == nil {
		q.batchKick = true
	}
	q.unlock()
	if err == nil && c != nil && !held {
		c.kick()
	}
	return err
}

// BeginPosts and EndPosts bracket a batch of posts: what the batch posted
// is sent once, at EndPosts (on the kernel datapath one sendmsg for the
// batch, not one per post). Batches may nest.
func (q *QP) BeginPosts() {
	q.mu.Lock()
	q.batch++
	q.unlock()
}

// EndPosts ends a batch BeginPosts began.
func (q *QP) EndPosts() {
	q.mu.Lock()
	q.batch--
	kick := q.batch == 0 && q.batchKick
	if kick {
		q.batchKick = false
	}
	c := q.conn
	q.unlock()
	if kick && c != nil {
		c.kick()
	}
}

// PostRecv posts a receive work request; it may be posted before the QP is
// connected.
func (q *QP) PostRecv(wr *qp.RecvWR) error {
	q.mu.Lock()
	defer q.unlock()
	return q.eng.PostRecv(wr)
}

// KeepRecvsAtPeerEnd: the peer's end of the connection, with nothing of
// ours outstanding, flushes no receive until a Send, a disconnect or a
// reset (qp.QP.KeepRecvsAtPeerEnd): for a QP connected the InfiniBand way.
func (q *QP) KeepRecvsAtPeerEnd() {
	q.mu.Lock()
	q.eng.KeepRecvsAtPeerEnd()
	q.unlock()
}

// FlushKeptRecvs flushes the receives a QP kept at its peer's end
// (qp.QP.FlushKeptRecvs): a disconnect of a QP whose connection is over.
func (q *QP) FlushKeptRecvs() {
	q.mu.Lock()
	q.eng.FlushKeptRecvs()
	q.unlock()
}

// PostedRecvs is the number of receives posted and not yet completed.
func (q *QP) PostedRecvs() int {
	q.mu.Lock()
	defer q.unlock()
	return q.eng.PostedRecvs()
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
	// which did nothing wrong, would end Broken. An abortive disconnect
	// of any other connection resets it, a graceful one in progress
	// included: the consumer asked for it.
	q.disconnectLocked(graceful, !graceful && !q.closedInOrderLocked())
}

// disconnectLocked is Disconnect, abort set if the connection is to be
// reset; it releases q.mu.
func (q *QP) disconnectLocked(graceful, abort bool) {
	if abort {
		q.abort = true
	}
	q.eng.Disconnect(graceful)
	c := q.conn
	q.unlock()
	if c != nil {
		c.kick()
	}
}

// closedInOrderLocked: the connection ended with Disconnected; q.mu held.
func (q *QP) closedInOrderLocked() bool { return q.eng.Ended() && q.eng.State() == qp.Idle }

// closingDrainedLocked: a graceful disconnect was asked, and the engine
// has nothing left to send but the FIN (q.mu held).
func (q *QP) closingDrainedLocked() bool { return q.eng.State() == qp.Closing && q.eng.Drained() }

// Reset returns a QP whose connection ended to a fresh, unconnected state
// (DAT ep_reset), once its connection has let go of it.
func (q *QP) Reset() error {
	q.mu.Lock()
	ended, c, abort := q.eng.Ended(), q.conn, q.abort
	q.unlock()
	if !ended {
		return fmt.Errorf("reset QP %d: connection not over: %w", q.qpn, ErrState)
	}
	if c != nil {
		c.release(abort)
	}
	q.mu.Lock()
	defer q.unlock()
	if err := q.eng.Reset(); err != nil {
		return fmt.Errorf("reset QP %d: %w", q.qpn, ErrState)
	}
	q.conn, q.abort = nil, false
	return nil
}

// Destroy aborts the connection if any, waits for the connection to let go
// of the QP, and frees the QP. A connection that ended in order, or whose
// graceful disconnect has nothing left to send but its FIN, is left to
// finish its close on its own timers, as a socket Linux siw releases is:
// perftest and rping destroy the QP right after rdma_disconnect, and a
// reset after our FIN would end the peer's connection broken. The engine
// flushes what is posted and places nothing more either way.
func (q *QP) Destroy() {
	q.destroyOnce.Do(func() {
		q.mu.Lock()
		q.disconnectLocked(false, !q.closedInOrderLocked() && !q.closingDrainedLocked())
		q.mu.Lock()
		c, abort := q.conn, q.abort
		q.unlock()
		if c != nil {
			c.release(abort)
		}
		q.dev.mu.Lock()
		delete(q.dev.qps, q.qpn)
		q.dev.qps = shrink.Map(q.dev.qps, &q.dev.qpsMost)
		q.dev.mu.Unlock()
		q.pd.refs.Add(-1)
	})
}

// mpaConfig is what this QP asks for in MPA startup.
func (q *QP) mpaConfig(private []byte) mpa.Config {
	c := mpa.Config{Revision: q.attr.MPARevision, CRC: !q.attr.NoCRC, Markers: q.attr.Markers,
		IRD: uint16(q.attr.IRD), ORD: uint16(q.attr.ORD), PeerToPeer: q.attr.PeerToPeer, PrivateData: private}
	// As initiator we offer a zero-length Write or Read, the RTRs every
	// iWARP implementation takes (the responder picks); as responder we
	// accept them.
	c.RTR = q.attr.RTR
	if c.RTR == 0 {
		c.RTR = mpa.RTRWrite | mpa.RTRRead
	}
	return c
}

// attach makes llp the QP's MPA layer: Established is posted where the
// QP reaches RTS, under the connection's locks and before anything that
// follows on the connection, and the wait for the peer's FIN starts where
// ours goes out. q.mu held, or the QP not yet shared with the connection.
func (q *QP) attach(llp *mpaConn) {
	llp.OnReady = func(e *mpaConn) {
		q.post(ConnEvent{Kind: Established, PrivateData: clone(e.Params.PeerPrivateData)})
	}
	llp.OnClose = func() {
		c := q.conn
		if q.closeTimer != nil {
			q.closeTimer(func() { q.closeTimedOut(c) })
			return
		}
		// The timer holds the QP and its connection weakly: a QP its
		// consumer destroyed and dropped, whose connection ended, is
		// collected now rather than kept for closeTimeout (ten thousand
		// closed at once held 40 MB for five seconds); one still in use,
		// or whose connection still runs, is held by them, and the timer
		// fires as before.
		wq := weak.Make(q)
		var wm weak.Pointer[mpaConn]
		if c != nil {
			wm = weak.Make(c.mpa())
		}
		time.AfterFunc(closeTimeout, func() {
			if q := wq.Value(); q != nil {
				q.closeTimedOutOf(wm)
			}
		})
	}
}

// closeTimedOutOf is closeTimedOut for the connection whose MPA layer m
// names, if it is still the QP's.
func (q *QP) closeTimedOutOf(m weak.Pointer[mpaConn]) {
	q.mu.Lock()
	c := q.conn
	q.unlock()
	if c == nil || c.mpa() != m.Value() {
		return
	}
	q.closeTimedOut(c)
}

// closeTimedOut ends a close the peer has not completed within
// closeTimeout of our FIN (a graceful disconnect, or the end after a
// Terminate): the connection is reset and what remains is flushed. A
// connection that ended in order has nothing left to reset.
func (q *QP) closeTimedOut(c llpConn) {
	q.mu.Lock()
	if q.conn != c || c == nil || q.closedInOrderLocked() {
		q.unlock()
		return
	}
	q.eng.LLPClosed(fmt.Errorf("%w: no FIN from the peer", ddp.LLPConnectionLost))
	q.abort = true
	q.unlock()
	c.kick()
}

// letGo forgets c, a connection whose active open failed: it finishes
// alone what it owes the peer (a Terminate, the FIN).
func (q *QP) letGo(c llpConn) {
	q.mu.Lock()
	if q.conn == c {
		q.conn = nil
	}
	q.unlock()
}

// nudgeDelay is how long an initiator waits for the first word from the
// peer before nudging it (see qp.QP.Nudge).
const nudgeDelay = 50 * time.Millisecond

// busyLocked: the QP has, or is getting, a connection, or cannot take one;
// q.mu held.
func (q *QP) busyLocked() bool {
	return q.conn != nil || q.accepting || q.eng.State() != qp.Idle || q.eng.Ended()
}

// nudgeIfSilent sends a zero-length Write if the peer has sent nothing
// since the connection came up although we have sent it FPDUs: Linux siw
// loses the wake-up for FPDUs that arrive between its MPA Reply and its
// QP taking over the socket, and waits until more data comes.
func (q *QP) nudgeIfSilent() {
	q.mu.Lock()
	c := q.conn
	if c == nil || c.mpa().heard || c.mpa().sent == 0 {
		q.unlock()
		return
	}
	q.eng.Nudge()
	q.unlock()
	c.kick()
}
