package tcp

import (
	"time"
)

// Conn is one TCP connection. Its methods are called by the poller that
// owns its Stack, never concurrently.
type Conn struct {
	stack *Stack
	id    FourTuple
	state State
	h     Handler
	err   error
	// events wait for the Handler (see events.go).
	events []Event
	// listener is the Listener a passive connection belongs to until
	// Accept takes it.
	listener *Listener

	// Send sequence space (RFC 9293 §3.3.1).
	iss    Seq
	sndUna Seq
	sndNxt Seq
	// sndMax is the highest sequence number sent; after an RTO, sndNxt
	// goes back to sndUna and climbs again to sndMax (go-back-N).
	sndMax     Seq
	sndWnd     int // the peer's window, scaled
	sndWl1     Seq
	sndWl2     Seq
	maxSndWnd  int
	snd        sendBuf
	finQueued  bool // Close called: a FIN follows the data
	peerMSS    int
	mss        int // segment payload limit, options excluded
	sndWS      uint8
	writeShort bool // a Write came up short: report EventWritable

	// otherMax, while otherMaxValid: an imported connection's bound on
	// what the other TCP sent. It went on sending after its state was
	// read (an ACK from its backlog, TCP small queues' tasklet, a loss
	// probe), up to the end of the data it held, so the peer may
	// acknowledge past SND.MAX as imported, up to here.
	otherMax      Seq
	otherMaxValid bool

	// Receive sequence space.
	irs     Seq
	rcv     recvBuf
	rcvAdv  Seq // right edge of the window last advertised
	rcvWS   uint8
	finRcvd bool
	// finSeq is the sequence number of the peer's FIN when it arrived
	// out of order (finPending).
	finPending bool
	finSeq     Seq

	// Options in force.
	wsOK, tsOK, sackOK bool
	tsRecent           uint32
	tsRecentAt         Time
	// tsRecentUnset: an imported connection has no TS.Recent (the
	// kernel does not give it): PAWS waits for the first acceptable
	// segment to set it.
	tsRecentUnset bool
	tsOffset      uint32
	lastAckSent   Seq

	// RFC 6298 state.
	srtt, rttvar, rto time.Duration
	rttSeq            Seq  // timing this octet's ACK (no timestamps)
	rttAt             Time // when it was sent
	rttTiming         bool
	backoff           int // consecutive RTO expiries

	// Timers: zero when off. twAt ends TIME-WAIT, or bounds FIN-WAIT-2
	// (Options.FinTimeout).
	rtoAt, delackAt, keepAt, twAt Time
	rtoKind                       rtoKind // what rtoAt is for
	probes                        int     // window probes since the last ACK
	keepProbes                    int

	// ACK policy.
	ackNow bool // an ACK must go out
	// dupAcksOwed: duplicate ACKs still to send, one per out-of-order
	// segment (RFC 5681 §4.2), not coalesced: a sender without SACK
	// counts them.
	dupAcksOwed int
	unacked     int // full segments received since the last ACK
	quickAcks   int

	// Loss recovery (RFC 6675, RFC 5681).
	dupAcks    int
	inRecovery bool
	recoverSeq Seq // SND.MAX when recovery started
	// recoverValid: recoverSeq holds a past recovery point (RFC 6582
	// §3.2 step 1 compares against it).
	recoverValid bool
	// retransmitUna: send the segment at SND.UNA next, whatever the
	// window (fast retransmit, RFC 5681 §3.2 step 3; partial ACKs).
	retransmitUna bool
	highRxt       Seq // highest octet retransmitted in this recovery
	// reordering is the duplicate threshold in use: DupThresh, raised
	// when D-SACKs show a recovery was spurious (reordering, not loss),
	// as Linux raises tp->reordering. Zero means DupThresh.
	reordering int
	// Undo of a spurious fast recovery (RFC 2883 §4, Linux's DSACK
	// undo): the window before it, and how many of its retransmissions
	// the peer has not yet reported as duplicates.
	undoValid              bool
	undoRxt                int
	undoStart, undoEnd     Seq
	priorCwnd, priorThresh int
	// dsack is a duplicate segment to report in the next ACK's first
	// SACK block (RFC 2883).
	dsack      span
	dsackValid bool
	sb         scoreboard
	// tx and rack: RACK loss detection (rack.go), SACK connections.
	tx        txlog
	rack      rackState
	prr       prrState
	win       Window
	cc        CongestionControl
	sendProbe bool // send a window probe or keepalive now
	// Tail loss probe (RFC 8985 §7). sendTLP: the probe timeout (PTO)
	// expired, send the probe. One probe at a time: tlpValid until an ACK covers tlpHigh (SND.MAX
	// after the probe); tlpRxt while the probe, a retransmission of
	// tlpSpan, has not been reported a duplicate. lastSentAt: the last
	// new data sent, which pushes the PTO back without a timer update
	// per segment.
	sendTLP bool
	// probeRounds: probe timer expiries in fast recovery since the last
	// cumulative ACK; after maxProbeRounds the RTO takes over.
	probeRounds      int
	tlpValid, tlpRxt bool
	tlpHigh          Seq
	tlpSpan          span
	lastSentAt       Time

	// needsOutput: queued on the stack's output list.
	needsOutput bool
	// timer heap bookkeeping.
	timerAt  Time
	heapIdx  int
	released bool

	Stats ConnStats
}

// ConnStats count what a connection did.
type ConnStats struct {
	SegmentsIn, SegmentsOut       uint64
	OctetsIn, OctetsOut           uint64
	Retransmits, FastRetransmits  uint64
	RTOs, DupAcksIn, SACKBlocksIn uint64
	OutOfOrder, Dropped           uint64
	LostRetransmits               uint64
	// DSACKsIn: duplicate reports received; SpuriousRecoveries: fast
	// recoveries they showed unneeded, whose window was restored.
	DSACKsIn, SpuriousRecoveries uint64
	// Reorderings: times the duplicate threshold rose for reordering.
	Reorderings uint64
	// LossProbes: tail loss probes sent; ProbeRepairs: those that were
	// retransmissions repairing a loss (the window was reduced).
	LossProbes, ProbeRepairs uint64
	// LossTimeouts: fast recoveries started by the probe timer, for a
	// hole with too few segments SACKed above it to count as lost.
	LossTimeouts             uint64
	ChallengeACKs, PAWSDrops uint64
}

// ID returns the connection's addresses and ports.
func (c *Conn) ID() FourTuple { return c.id }

// State returns the connection's state.
func (c *Conn) State() State { return c.state }

// Err says why a closed connection ended: nil after an orderly close.
func (c *Conn) Err() error { return c.err }

// SetHandler sets the consumer (for accepted connections).
func (c *Conn) SetHandler(h Handler) { c.h = h }

// Handler returns the consumer.
func (c *Conn) Handler() Handler { return c.h }

// MSS is the payload size of a full segment.
func (c *Conn) MSS() int { return c.mss }

// Window returns the congestion window, slow-start threshold and MSS.
func (c *Conn) Window() Window { return c.win }

// SRTT is the smoothed round-trip time.
func (c *Conn) SRTT() time.Duration { return c.srtt }

// SendSpace is how many octets Write would take now.
func (c *Conn) SendSpace() int {
	if c.finQueued || !c.canSend() {
		return 0
	}
	return c.snd.free()
}

// Unacked is the number of octets written and not yet acknowledged.
func (c *Conn) Unacked() int { return c.snd.n }

func (c *Conn) canSend() bool {
	switch c.state {
	case StateSynSent, StateSynRcvd, StateEstablished, StateCloseWait:
		return true
	}
	return false
}

// Write queues octets to send and returns how many fit in the send buffer.
// If it took fewer than len(p), EventWritable follows when space frees.
func (c *Conn) Write(p []byte) (int, error) {
	if c.finQueued || !c.canSend() {
		if c.err != nil {
			return 0, c.err
		}
		return 0, ErrClosed
	}
	n := c.snd.write(p)
	if n < len(p) {
		c.writeShort = true
	}
	if n > 0 {
		c.wantOutput()
	}
	return n, nil
}

// Read copies octets the Handler left in the receive buffer.
func (c *Conn) Read(p []byte) int {
	total := 0
	for len(p) > 0 {
		b := c.rcv.peek()
		if len(b) == 0 {
			break
		}
		k := copy(p, b)
		c.rcv.consume(k)
		p = p[k:]
		total += k
	}
	if total > 0 {
		c.windowOpened()
	}
	return total
}

// Kick tells the stack that the connection's Filler has data to give:
// the next Output asks it.
func (c *Conn) Kick() { c.wantOutput() }

// Buffered is the number of received octets waiting for Read.
func (c *Conn) Buffered() int { return c.rcv.n }

// Close starts an orderly close: a FIN follows the data written (RFC 9293
// §3.10.4). Received data keeps arriving until the peer closes too.
func (c *Conn) Close() {
	switch c.state {
	case StateSynSent:
		c.terminate(nil)
	case StateSynRcvd, StateEstablished, StateCloseWait:
		c.finQueued = true
		c.wantOutput()
	}
}

// Abort resets the connection (RFC 9293 §3.10.5): a RST goes out and
// everything queued is dropped.
func (c *Conn) Abort() {
	switch c.state {
	case StateSynRcvd, StateEstablished, StateFinWait1, StateFinWait2, StateCloseWait:
		c.stack.queueRST(c.id, c.sndMax, 0, false)
	}
	if c.state != StateClosed {
		c.terminate(ErrAborted)
	}
}

// terminate ends the connection with err and releases it.
func (c *Conn) terminate(err error) {
	if c.state == StateClosed && c.released {
		return
	}
	c.state = StateClosed
	if c.err == nil {
		c.err = err
	}
	c.rtoAt, c.delackAt, c.keepAt, c.twAt = 0, 0, 0, 0
	// Nothing more is sent, and only octets in order may still be read:
	// the rest of the buffers goes back to the pool now, not when the
	// Conn is collected.
	c.snd.drop()
	c.sb.reset()
	c.txRelease()
	c.rack.lost = 0
	c.rcv.ooo, c.rcv.last = nil, -1 // never to be read: consuming the rest drops the ring
	c.rcv.dropIfEmpty()
	c.stack.release(c)
	c.event(EventClosed)
}

// thresh is the duplicate threshold: DupThresh, or more after reordering.
func (c *Conn) thresh() int { return max(c.reordering, dupThresh) }

// maxReordering bounds the duplicate threshold reordering can raise.
const maxReordering = 16

// wantOutput puts the connection on the stack's output list.
func (c *Conn) wantOutput() { c.stack.wantOutput(c) }

// flight is the octets outstanding (RFC 5681 FlightSize).
func (c *Conn) flight() int { return c.sndMax.Sub(c.sndUna) }

// pipe estimates octets in the network (RFC 6675 §4 SetPipe): outstanding,
// less SACKed, less lost and not yet retransmitted.
func (c *Conn) pipe() int {
	if !c.inRecovery {
		return c.sndNxt.Sub(c.sndUna) - c.sb.sacked
	}
	if !c.sackOK {
		return max(c.sndMax.Sub(c.sndUna)-c.sb.sacked, 0)
	}
	return max(c.sndMax.Sub(c.sndUna)-c.sb.sacked-c.rack.lost, 0)
}

// windowOpened: the consumer freed receive space; advertise it if the
// window grew enough (RFC 9293 §3.8.6.2.2, receiver SWS avoidance).
func (c *Conn) windowOpened() {
	if !c.state.synchronized() {
		return
	}
	grown := c.rcv.rightEdge().Sub(c.rcvAdv)
	if grown >= min(c.rcv.size/2, c.mss) {
		c.ackNow = true
		c.wantOutput()
	}
}

// rtoSample folds a round-trip measurement in (RFC 6298 §2).
func (c *Conn) rtoSample(r time.Duration) {
	if r <= 0 {
		r = time.Microsecond
	}
	if c.srtt == 0 {
		c.srtt, c.rttvar = r, r/2
	} else {
		d := c.srtt - r
		if d < 0 {
			d = -d
		}
		c.rttvar = (3*c.rttvar + d) / 4
		c.srtt = (7*c.srtt + r) / 8
	}
	o := c.stack.opts
	// RFC 6298 (2.3) with G folded into RTOMin, as Linux does.
	c.rto = min(max(c.srtt+max(4*c.rttvar, time.Millisecond), o.RTOMin), o.RTOMax)
}

// currentRTO is the RTO with the back-off applied (RFC 6298 §5.5).
func (c *Conn) currentRTO() time.Duration {
	r := c.rto
	for i := 0; i < c.backoff && r < c.stack.opts.RTOMax; i++ {
		r *= 2
	}
	return min(r, c.stack.opts.RTOMax)
}

// rtoKind says which of four timers rtoAt is: they never run together.
type rtoKind uint8

const (
	timerRTO     rtoKind = iota // retransmission timeout (RFC 6298)
	timerPersist                // zero-window probe (RFC 9293 §3.8.6.1)
	timerProbe                  // tail loss probe timeout (RFC 8985 §7.2)
	timerReo                    // RACK reordering timer (RFC 8985 §6.3)
)

// armRTO (re)starts the retransmission timer (RFC 6298 §5.1, §5.3).
func (c *Conn) armRTO(now Time) {
	c.rtoKind = timerRTO
	c.rtoAt = now.Add(c.currentRTO())
	c.stack.timerChanged(c)
}

// tlpSlack is added to twice the smoothed RTT for the probe timeout: room
// for a receiver's batching (Linux adds two jiffies, RFC 8985 §7.2 says
// the sender may add its own delay).
const tlpSlack = 2 * time.Millisecond

// maxProbeRounds bounds the probe timer's retransmissions in one fast
// recovery without progress, before the RTO.
const maxProbeRounds = 3

// beforeRecoveryPoint: SND.UNA has not passed the recovery point of the
// last recovery or RTO (RFC 6582's "recover"), whose losses it covers.
func (c *Conn) beforeRecoveryPoint() bool {
	return c.recoverValid && c.sndUna.LessThan(c.recoverSeq)
}

// armRetransmit starts the timer that covers data in flight: the probe
// timeout when a tail loss probe may follow (RFC 8985 §7.2), else the RTO.
// Without it a lost ACK for the last data in flight, or a loss among the
// last segments, waits out a whole RTO (200 ms at least) when cwnd is
// full and nothing more is sent to draw SACKs.
func (c *Conn) armRetransmit(now Time) {
	if !c.armProbe(now) {
		c.armRTO(now)
	}
}

// armProbe arms the probe timer where it may fire before the RTO (see
// probeTimeout) and reports whether it did; otherwise the timer is left
// as it was.
func (c *Conn) armProbe(now Time) bool {
	pto, ok := c.probeTimeout()
	if !ok {
		return false
	}
	c.rtoKind = timerProbe
	c.rtoAt = now.Add(pto)
	c.stack.timerChanged(c)
	return true
}

// probeTimeout is the PTO, when the probe timer may fire before the RTO:
// SACK in use, an RTT measured, no timeout in progress, the peer's window
// open, and, outside fast recovery, no probe outstanding or SACKed data
// above a hole.
func (c *Conn) probeTimeout() (time.Duration, bool) {
	if !c.sackOK || c.srtt == 0 || c.backoff > 0 || c.sndWnd == 0 ||
		!c.state.synchronized() || c.state == StateTimeWait {
		return 0, false
	}
	switch {
	case c.inRecovery:
		if c.probeRounds >= maxProbeRounds {
			return 0, false
		}
	case c.beforeRecoveryPoint():
		return 0, false // recovering from an RTO
	case c.tlpValid && c.sb.empty():
		return 0, false
	}
	pto := 2*c.srtt + tlpSlack
	if c.flight() <= c.mss {
		// A lone segment may wait for the peer's delayed ACK.
		pto += c.stack.opts.RTOMin
	}
	return pto, pto < c.currentRTO()
}

// probeFired: no cumulative ACK within the PTO. New data sent since the
// timer was set pushes it back. In fast recovery, the segment at SND.UNA
// is lost (again). Data SACKed above SND.UNA for that long
// means the hole below it was lost, not overtaken, however few segments
// were SACKed: fast recovery starts, as RACK's reordering timer would
// start it (RFC 8985 §6.2). Otherwise the next output sends a tail loss
// probe, and the RTO covers what follows (RFC 8985 §7.3).
func (c *Conn) probeFired(now Time) {
	pto, ok := c.probeTimeout()
	if !ok {
		c.armRTO(now)
		return
	}
	if due := c.lastSentAt.Add(pto); now < due {
		c.rtoAt = due // still the probe timer
		c.stack.timerChanged(c)
		return
	}
	if c.inRecovery {
		// Two round trips and more since the last cumulative ACK in
		// fast recovery: the segment at SND.UNA is lost, whether its
		// retransmission was lost too or, after a partial ACK, too
		// few segments are SACKed above it to count it lost. Send it
		// and walk the holes again, where the RTO would have gone
		// back to one segment of window.
		if c.sndUna.LessThan(c.highRxt) {
			c.Stats.LostRetransmits++
		}
		c.highRxt = c.sndUna
		c.retransmitUna = true
		c.probeRounds++
		c.armRetransmit(now)
		c.wantOutput()
		return
	}
	if !c.sb.empty() && c.sndUna.LessThan(c.sb.s[0].start) {
		c.Stats.LossTimeouts++
		c.enterRecovery(now)
		c.armRetransmit(now)
		return
	}
	c.armRTO(now)
	if !c.tlpValid {
		c.sendTLP = true
		c.wantOutput()
	}
}

// keepaliveReset restarts the keepalive idle period.
func (c *Conn) keepaliveReset(now Time) {
	c.keepProbes = 0
	if c.stack.opts.KeepAlive && c.state.synchronized() {
		c.keepAt = now.Add(c.stack.opts.KeepIdle)
		c.stack.timerChanged(c)
	}
}

// nextTimer is the earliest armed timer.
func (c *Conn) nextTimer() Time {
	t := Time(0)
	for _, x := range []Time{c.rtoAt, c.delackAt, c.keepAt, c.twAt} {
		if x != 0 && (t == 0 || x < t) {
			t = x
		}
	}
	return t
}

// onTimer fires the timers due at now.
func (c *Conn) onTimer(now Time) {
	if c.twAt != 0 && now >= c.twAt {
		c.twAt = 0
		if c.state == StateFinWait2 {
			// The peer never closed its side (Options.FinTimeout):
			// reset, as Linux does an orphaned FIN-WAIT-2 socket.
			c.stack.queueRST(c.id, c.sndMax, c.rcvNxt(), true)
			c.terminate(ErrTimedOut)
			return
		}
		c.terminate(nil) // TIME-WAIT over (RFC 9293 §3.10.8)
		return
	}
	if c.delackAt != 0 && now >= c.delackAt {
		c.delackAt = 0
		c.ackNow = true
		c.wantOutput()
	}
	if c.rtoAt != 0 && now >= c.rtoAt {
		c.rtoAt = 0
		switch c.rtoKind {
		case timerPersist:
			c.persistFired(now)
		case timerProbe:
			c.probeFired(now)
		case timerReo:
			c.reoFired(now)
		default:
			c.rtoFired(now)
		}
		if c.state == StateClosed {
			return
		}
	}
	if c.keepAt != 0 && now >= c.keepAt {
		c.keepAt = 0
		c.keepaliveFired(now)
	}
}

// rtoFired handles an expired retransmission timer (RFC 6298 §5.4-5.6).
func (c *Conn) rtoFired(now Time) {
	o := c.stack.opts
	limit := o.Retries
	if c.state == StateSynSent || c.state == StateSynRcvd {
		limit = o.SynRetries
	}
	if c.backoff >= limit {
		c.stack.queueRST(c.id, c.sndMax, 0, false)
		c.terminate(ErrTimedOut)
		return
	}
	c.Stats.RTOs++
	if c.sndWnd == 0 && c.state.synchronized() && c.snd.end().Sub(c.sndUna) > 0 {
		// The peer's window is closed: nothing was lost, the data is
		// waiting for room. Probe instead of counting toward a
		// timeout (RFC 9293 §3.8.6.1).
		c.sndNxt = minSeq(c.sndNxt, c.sndUna)
		c.persistFired(now)
		return
	}
	c.backoff++
	if c.state.synchronized() && c.flight() > 0 {
		c.cc.OnRTO(now, c.flight())
	}
	// Go back to SND.UNA. The SACK scoreboard is kept so that the
	// retransmission skips what the peer holds (RFC 6675 §5.1); if the
	// peer reneged, the next RTO finds SND.UNA unacknowledged again and
	// the scoreboard is dropped then.
	if c.backoff > 1 {
		c.sb.reset()
	}
	c.txForgetMarks(c.backoff > 1)
	c.inRecovery = false
	c.undoValid = false // after a timeout, no undo
	c.tlpValid, c.sendTLP = false, false
	// RFC 6582 §4 / RFC 6675 §5.1: no fast recovery for data sent before
	// the timeout (late SACKs for it would cut the window again).
	c.recoverSeq, c.recoverValid = c.sndMax, true
	c.dupAcks = 0
	c.sndNxt = c.sndUna
	c.rttTiming = false // Karn: no samples from retransmissions
	c.quickAcks = o.QuickACKs
	c.armRTO(now)
	c.wantOutput()
}

// persistFired sends a zero-window probe (RFC 9293 §3.8.6.1).
func (c *Conn) persistFired(now Time) {
	// A peer that answers probes keeps the connection (the count resets
	// on every ACK); one that stops answering times it out.
	if c.probes >= c.stack.opts.Retries {
		c.stack.queueRST(c.id, c.sndMax, 0, false)
		c.terminate(ErrTimedOut)
		return
	}
	c.probes++
	c.backoff = min(c.backoff+1, 16)
	c.sendProbe = true
	c.armPersist(now)
	c.wantOutput()
}

func (c *Conn) armPersist(now Time) {
	c.rtoKind = timerPersist
	r := c.currentRTO()
	c.rtoAt = now.Add(max(r, c.stack.opts.RTOMin))
	c.stack.timerChanged(c)
}

// keepaliveFired probes an idle connection (RFC 9293 §3.8.4).
func (c *Conn) keepaliveFired(now Time) {
	o := c.stack.opts
	if !c.state.synchronized() || c.state == StateTimeWait {
		return
	}
	if c.keepProbes >= o.KeepCount {
		c.stack.queueRST(c.id, c.sndNxt, 0, false)
		c.terminate(ErrTimedOut)
		return
	}
	if c.flight() == 0 {
		c.keepProbes++
		c.sendProbe = true
		c.wantOutput()
	}
	c.keepAt = now.Add(o.KeepInterval)
	c.stack.timerChanged(c)
}
