package tcp

import "time"

// RACK loss detection (RFC 8985 §6), the engine's primary way of finding
// what a SACK connection lost, with RFC 6675's DupThresh rule as the
// fallback (both mark the same records; whichever is first).
//
// RACK judges a segment lost by time, not by counting: once a segment
// sent after it has been delivered and RACK.rtt plus a reordering window
// has passed since it was sent. So one SACKed segment above a hole is
// enough, a lost retransmission is found like any other loss (a
// retransmission is a later transmission), and the wait is a fraction of
// a round trip rather than a probe timeout. That takes per-segment send
// times, which the transmission log keeps.

// txrec is a range of octets in flight and its last transmission.
type txrec struct {
	start, end Seq
	sentAt     Time
	rexmit     bool // sent more than once
	sacked     bool // the peer holds all of it (SACK)
	lost       bool // marked lost and not sent again since
	lostN      int  // its un-SACKed octets when marked lost
}

// txlog is the records of the octets in flight, [SND.UNA, SND.MAX) in
// order, without gaps. It is kept for SACK connections only.
type txlog struct {
	r    []txrec // r[head:] are live
	head int
}

func (l *txlog) live() []txrec { return l.r[l.head:] }

func (l *txlog) empty() bool { return l.head == len(l.r) }

// index is the index (into live) of the record holding seq, or of the
// first record after it.
func (l *txlog) index(seq Seq) int {
	v := l.live()
	lo, hi := 0, len(v)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if v[m].end.LessEq(seq) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// rackState is RACK's (RFC 8985 §6.1) and the reordering window's.
type rackState struct {
	// xmitTs and endSeq are the last transmission of the most recently
	// sent segment that was delivered, rtt its round-trip time; valid
	// once there was one.
	xmitTs Time
	endSeq Seq
	rtt    time.Duration
	valid  bool
	// fack is the highest octet delivered (RACK.fack).
	fack   Seq
	minRTT time.Duration
	// reoSeen: the peer delivered a segment out of order (not a
	// retransmission) at least once, or reported a duplicate.
	reoSeen bool
	// lost is the un-SACKed octets of the records marked lost and not
	// yet sent again: the pipe leaves them out (RFC 6675 §4).
	lost int
}

// sent books a transmission of [seq, end) at now (called with SND.MAX
// before the segment moves it).
func (c *Conn) txSent(now Time, seq, end Seq) {
	if !c.sackOK || !seq.LessThan(end) {
		return
	}
	l := &c.tx
	if l.r == nil {
		if k := len(c.stack.txFree); k > 0 {
			l.r, c.stack.txFree = c.stack.txFree[k-1], c.stack.txFree[:k-1]
		}
	}
	if c.sndMax.LessEq(seq) {
		l.r = append(l.r, txrec{start: seq, end: end, sentAt: now})
		return
	}
	// A retransmission: the records it covers, cut at its edges.
	for i := c.txSplit(l.index(seq), seq); i < len(l.live()) && l.live()[i].start.LessThan(end); i++ {
		c.txSplit(i, end)
		r := &l.live()[i]
		if r.lost {
			c.rack.lost -= r.lostN
			r.lost, r.lostN = false, 0
		}
		r.sentAt, r.rexmit = now, true
	}
	if c.sndMax.LessThan(end) {
		l.r = append(l.r, txrec{start: c.sndMax, end: end, sentAt: now})
	}
}

// txSplit cuts live record i in two if seq falls inside it, and returns
// the index of the record that starts at seq: i+1 after a cut, else i.
func (c *Conn) txSplit(i int, seq Seq) int {
	l := &c.tx
	v := l.live()
	if i >= len(v) || !v[i].start.LessThan(seq) || !seq.LessThan(v[i].end) {
		return i
	}
	r := v[i]
	lo, hi := r, r
	lo.end, hi.start = seq, seq
	if r.lost {
		c.rack.lost -= r.lostN
		lo.lostN = c.sb.holeOctets(lo.start, lo.end)
		hi.lostN = c.sb.holeOctets(hi.start, hi.end)
		c.rack.lost += lo.lostN + hi.lostN
	}
	k := l.head + i
	l.r = append(l.r, txrec{})
	copy(l.r[k+2:], l.r[k+1:])
	l.r[k], l.r[k+1] = lo, hi
	return i + 1
}

// txAcked drops the records below ack, cumulatively acknowledged,
// taking each one not yet SACKed as delivered.
func (c *Conn) txAcked(now Time, ack Seq) {
	l := &c.tx
	for !l.empty() {
		r := &l.r[l.head]
		if ack.LessEq(r.start) {
			break
		}
		if !r.sacked {
			c.rackDelivered(now, r)
		}
		if r.lost {
			c.rack.lost -= r.lostN
			r.lost, r.lostN = false, 0
		}
		if ack.LessThan(r.end) {
			r.start = ack // the rest is still in flight
			break
		}
		l.head++
	}
	switch {
	case l.empty():
		// A connection with nothing in flight holds no log (see Buffer
		// memory): its array goes to the stack for the next sender.
		c.txRelease()
	case l.head >= 64 && 2*l.head >= len(l.r):
		n := copy(l.r, l.r[l.head:])
		l.r, l.head = l.r[:n], 0
	}
}

// txRelease gives the log's array to the stack (up to maxTxFree of
// them are kept).
func (c *Conn) txRelease() {
	if c.tx.r != nil && len(c.stack.txFree) < maxTxFree {
		c.stack.txFree = append(c.stack.txFree, c.tx.r[:0])
	}
	c.tx = txlog{}
}

// maxTxFree bounds the logs a stack keeps for reuse.
const maxTxFree = 64

// txSACKed takes a SACK block b the scoreboard has just added: the
// records it completes are delivered.
func (c *Conn) txSACKed(now Time, b span) {
	v := c.tx.live()
	for i := c.tx.index(b.start); i < len(v) && v[i].start.LessThan(b.end); i++ {
		r := &v[i]
		if r.sacked || c.sb.holeOctets(r.start, r.end) > 0 {
			continue
		}
		r.sacked = true
		if r.lost {
			c.rack.lost -= r.lostN
			r.lost, r.lostN = false, 0
		}
		c.rackDelivered(now, r)
	}
}

// txForgetMarks clears the lost marks (an RTO resends everything from
// SND.UNA) and, when the scoreboard was dropped, the SACKed ones.
func (c *Conn) txForgetMarks(sacked bool) {
	v := c.tx.live()
	for i := range v {
		v[i].lost, v[i].lostN = false, 0
		if sacked {
			v[i].sacked = false
		}
	}
	c.rack.lost = 0
}

// rackDelivered updates RACK with a delivered record (RFC 8985 §6.2
// steps 1-3).
func (c *Conn) rackDelivered(now Time, r *txrec) {
	rtt := now.Sub(r.sentAt)
	// A retransmission delivered may have been delivered by its
	// original (RFC 8985 §6.2 step 2 asks TSecr or the minimum RTT to
	// tell): our timestamps count milliseconds, and these paths' RTT is
	// tens of microseconds, so neither can. Taken as a sample, a late
	// original made every segment sent before the needless
	// retransmission look overdue: a cascade of them, which held two
	// daemons reordering 44% of segments to 0.02 Gbit/s of RDMA Writes
	// (3.6 before RACK). Retransmissions give no sample; a lost one is
	// still found once data sent after it is delivered.
	if r.rexmit {
		return
	}
	if c.rack.minRTT == 0 || rtt < c.rack.minRTT {
		c.rack.minRTT = max(rtt, time.Microsecond)
	}
	if r.end.LessThan(c.rack.fack) {
		c.rack.reoSeen = true // delivered below one delivered before
	}
	if !c.rack.valid || c.rack.fack.LessThan(r.end) {
		c.rack.fack = r.end
	}
	if !c.rack.valid || c.rack.xmitTs < r.sentAt || (c.rack.xmitTs == r.sentAt && c.rack.endSeq.LessThan(r.end)) {
		c.rack.xmitTs, c.rack.endSeq, c.rack.rtt, c.rack.valid = r.sentAt, r.end, rtt, true
	}
}

// reoWnd is the reordering window (RFC 8985 §6.2 step 4): none in
// recovery or with DupThresh segments SACKed, a quarter of the minimum
// RTT (at most the smoothed RTT) otherwise; but SRTT + 2 ms once the
// peer has shown reordering (a segment delivered below one delivered
// before it, or a D-SACK), as long as the probe timer would wait.
//
// The RFC's window assumes reordering shorter than a round trip. On a
// path of tens of microseconds, a segment held back until a few later
// ones have passed (a parallel path, or tc-netem's reorder) arrives
// later than that: the loss grid's reorder 25% sent a third of its
// segments twice (0.06× Linux's goodput), and two daemons reordering
// 44% of segments each way fell from 3.6-4.6 to 0.01-0.4 Gbit/s, the
// window grown per D-SACK round trip as the RFC has it never catching
// up. Linux never waits less than a timer tick (1-4 ms) for its
// reordering timer, which hides the problem there.
func (c *Conn) reoWnd() time.Duration {
	switch {
	case c.rack.reoSeen:
		return c.srtt + reoWndReordering
	case c.inRecovery || c.sb.sacked >= c.thresh()*c.mss:
		return 0
	}
	return min(c.rack.minRTT/4, c.srtt)
}

// reoWndReordering is what the reordering window adds to SRTT on a path
// shown to reorder (see reoWnd).
const reoWndReordering = 2 * time.Millisecond

// markLost marks the records in the holes below the highest SACKed octet
// that RACK (or, failing it, DupThresh) finds lost, and arms the
// reordering timer for the first one that is not lost yet but will be
// (RFC 8985 §6.2 step 5, §6.3).
func (c *Conn) markLost(now Time) {
	if !c.sackOK || c.sb.empty() || c.tx.empty() {
		return
	}
	reo := c.reoWnd()
	// RFC 6675 DupThresh (raised by reordering seen) beside RACK.
	dupLost, dupOK := c.sb.lostBelow(c.mss, c.thresh())
	var next Time
	v := c.tx.live()
	from := c.sndUna
	for _, s := range c.sb.s {
		// The hole [from, s.start).
		for i := c.tx.index(from); i < len(v) && v[i].start.LessThan(s.start); i++ {
			r := &v[i]
			if r.sacked || r.lost {
				continue
			}
			lost := dupOK && !r.rexmit && r.end.LessEq(dupLost) // RFC 6675 IsLost
			if !lost && c.rack.valid && (r.sentAt < c.rack.xmitTs || (r.sentAt == c.rack.xmitTs && r.end.LessThan(c.rack.endSeq))) {
				due := r.sentAt.Add(c.rack.rtt + reo)
				if due <= now {
					lost = true
				} else if next == 0 || due < next {
					next = due
				}
			}
			if lost {
				r.lost, r.lostN = true, c.sb.holeOctets(r.start, r.end)
				c.rack.lost += r.lostN
				if r.rexmit {
					c.Stats.LostRetransmits++
				}
			}
		}
		from = s.end
	}
	// After an RTO, going back over the data resends it all: the
	// backed-off RTO stands (RFC 6298 §5.3).
	if next != 0 && c.backoff == 0 && c.rtoKind != timerPersist && (c.rtoAt == 0 || next < c.rtoAt || c.rtoKind == timerProbe) {
		c.rtoKind, c.rtoAt = timerReo, next
		c.stack.timerChanged(c)
	}
}

// nextLost is the first range marked lost, at most max octets of its
// un-SACKed part.
func (c *Conn) nextLost(max int) (span, bool) {
	if c.rack.lost <= 0 {
		return span{}, false
	}
	v := c.tx.live()
	from := c.sndUna
	for _, s := range c.sb.s {
		for i := c.tx.index(from); i < len(v) && v[i].start.LessThan(s.start); i++ {
			if r := &v[i]; r.lost {
				if h, ok := c.sb.nextHole(r.start, r.end, max); ok {
					return h, true
				}
			}
		}
		from = s.end
	}
	return span{}, false
}

// reoFired: the reordering timer expired; what it waited for may be lost
// now (RFC 8985 §6.3).
func (c *Conn) reoFired(now Time) {
	c.markLost(now)
	c.detectLoss(now)
	if c.rtoAt == 0 {
		if c.flight() > 0 {
			c.armRetransmit(now)
		} else {
			c.rtoKind = timerRTO
		}
	}
	c.wantOutput()
}
