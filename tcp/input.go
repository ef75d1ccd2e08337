package tcp

import (
	"time"

	"github.com/softrnic/softrnic/header"
)

// Segment is a received TCP segment, parsed. It lives on the caller's stack;
// Payload aliases the receive frame.
type Segment struct {
	SrcPort, DstPort uint16
	Seq, Ack         Seq
	Flags            uint8
	Window           uint16
	Opts             header.TCPOptions
	Payload          []byte
}

func (s *Segment) has(f uint8) bool { return s.Flags&f != 0 }

// seqLen is the sequence space the segment occupies (RFC 9293 §3.4).
func (s *Segment) seqLen() int {
	n := len(s.Payload)
	if s.has(header.TCPFlagSYN) {
		n++
	}
	if s.has(header.TCPFlagFIN) {
		n++
	}
	return n
}

// pawsIdle is how old TS.Recent may get before PAWS stops trusting it
// (RFC 7323 §5.5: 24 days).
const pawsIdle = 24 * 24 * time.Hour

// input processes a segment for an existing connection (RFC 9293 §3.10.7).
func (c *Conn) input(now Time, seg *Segment) {
	c.Stats.SegmentsIn++
	switch c.state {
	case StateClosed, StateListen:
		return
	case StateSynSent:
		c.inputSynSent(now, seg)
		return
	}
	rst := seg.has(header.TCPFlagRST)

	// RFC 7323 §5.3 PAWS: a segment older than TS.Recent is a duplicate.
	// A pure ACK that acknowledges nothing new is let through, as
	// Linux's tcp_disordered_ack does: ACKs reordered among themselves
	// are common and harmless (the window update rule discards stale
	// windows).
	if c.tsOK && seg.Opts.HasTimestamp && !rst && !c.tsRecentUnset && int32(seg.Opts.TSVal-c.tsRecent) < 0 &&
		now.Sub(c.tsRecentAt) < pawsIdle && !c.disorderedAck(seg) {
		c.Stats.PAWSDrops++
		c.sendAck()
		return
	}

	// A retransmitted SYN in SYN-RECEIVED: our SYN-ACK was lost.
	if c.state == StateSynRcvd && seg.Flags&(header.TCPFlagSYN|header.TCPFlagACK|header.TCPFlagRST) == header.TCPFlagSYN && seg.Seq == c.irs {
		c.sndNxt = c.iss
		c.wantOutput()
		return
	}
	// First: is the segment acceptable (§3.10.7.4)?
	if !c.acceptable(seg) {
		c.Stats.Dropped++
		if !rst {
			c.noteDuplicate(seg)
			if c.state == StateTimeWait && seg.has(header.TCPFlagFIN) {
				c.twAt = now.Add(c.stack.opts.TimeWait) // a retransmitted FIN
				c.stack.timerChanged(c)
			}
			c.sendAck()
		}
		return
	}
	syn := seg.has(header.TCPFlagSYN)
	if !rst && !syn {
		c.noteDuplicate(seg)
	}
	c.trim(seg)

	// Second: RST (RFC 5961 §3.2): only an exact RCV.NXT resets; any
	// other in-window RST gets a challenge ACK.
	if rst {
		// RFC 1337: a RST must not cut TIME-WAIT short (the
		// "assassination" hazard); the timer runs out as it would.
		if c.state == StateTimeWait {
			return
		}
		if seg.Seq != c.rcvNxt() {
			c.challengeAck(now)
			return
		}
		switch c.state {
		case StateSynRcvd:
			if c.listener != nil {
				c.terminate(ErrReset) // back to LISTEN: the listener forgets it
			} else {
				c.terminate(ErrRefused)
			}
		case StateClosing, StateLastAck:
			c.terminate(nil)
		default:
			c.terminate(ErrReset)
		}
		return
	}

	// Fourth: SYN in a synchronized state (RFC 5961 §4.2): challenge ACK
	// and drop, wherever the SYN lies (trimming may have cut it off; its
	// data is not taken either, as Linux does).
	if syn {
		c.challengeAck(now)
		return
	}

	// Fifth: ACK.
	if !seg.has(header.TCPFlagACK) {
		return
	}
	if c.state == StateSynRcvd {
		if !(c.sndUna.LessThan(seg.Ack) && seg.Ack.LessEq(c.sndMax)) {
			c.stack.queueRST(c.id, seg.Ack, 0, false)
			return
		}
		c.established(now, seg, true)
		if c.state == StateClosed {
			return // the accept queue was full: aborted
		}
	}
	// A zero-window probe sends the octet at SND.UNA without moving
	// SND.NXT: a peer that took it acknowledges one past SND.MAX.
	if c.rtoKind == timerPersist && c.sndMax == c.sndUna && seg.Ack == c.sndUna.Add(1) && c.snd.end().Sub(c.sndUna) > 0 {
		c.sndNxt, c.sndMax = seg.Ack, seg.Ack
	}
	// What the other TCP of an imported connection sent after its
	// state was read: the peer acknowledges octets we hold but never
	// sent. They were sent (by it), up to the end of what it held.
	if c.otherMaxValid {
		if c.sndMax.LessThan(seg.Ack) && seg.Ack.LessEq(c.otherMax) {
			c.sndMax = seg.Ack
			c.sndNxt = maxSeq(c.sndNxt, seg.Ack)
			c.recoverSeq = maxSeq(c.recoverSeq, seg.Ack)
		}
		if !c.sndMax.LessThan(c.otherMax) {
			c.otherMaxValid = false
		}
	}
	// RFC 5961 §5.2: the ACK must lie in [SND.UNA - MAX.SND.WND, SND.NXT].
	if c.sndMax.LessThan(seg.Ack) {
		c.sendAck()
		return
	}
	if seg.Ack.LessThan(c.sndUna.Add(-max(c.maxSndWnd, 1))) {
		c.challengeAck(now)
		return
	}
	c.probes = 0
	c.processAck(now, seg)
	if c.state == StateClosed {
		return
	}
	if c.finQueued && c.finSentNow() && c.sndUna == c.finSeqNum().Add(1) {
		switch c.state {
		case StateFinWait1:
			c.state = StateFinWait2
			c.twAt = now.Add(c.stack.opts.FinTimeout) // see onTimer
			c.stack.timerChanged(c)
		case StateClosing:
			c.enterTimeWait(now)
		case StateLastAck:
			c.terminate(nil)
			return
		}
	}
	if c.state == StateTimeWait {
		return
	}

	// Seventh: payload.
	if len(seg.Payload) > 0 {
		switch c.state {
		case StateEstablished, StateFinWait1, StateFinWait2:
			c.receiveData(now, seg.Seq, seg.Payload, seg.has(header.TCPFlagPSH))
		}
	}
	// Eighth: FIN.
	if seg.has(header.TCPFlagFIN) {
		c.receiveFIN(now, seg.Seq.Add(len(seg.Payload)))
	}
	c.keepaliveReset(now)
}

// disorderedAck: a pure ACK at RCV.NXT acknowledging nothing new.
func (c *Conn) disorderedAck(seg *Segment) bool {
	return len(seg.Payload) == 0 && seg.Flags&(header.TCPFlagSYN|header.TCPFlagFIN) == 0 &&
		seg.has(header.TCPFlagACK) && seg.Seq == c.rcvNxt() && seg.Ack.LessEq(c.sndUna)
}

// acceptable is the RFC 9293 §3.10.7.4 segment acceptability test.
func (c *Conn) acceptable(seg *Segment) bool {
	n := seg.seqLen()
	nxt := c.rcvNxt()
	wnd := c.rcv.window()
	if c.finRcvd {
		wnd = 0
	}
	switch {
	case n == 0 && wnd == 0:
		return seg.Seq == nxt
	case n == 0:
		return seg.Seq.InWindow(nxt, uint32(wnd))
	case wnd == 0:
		return false
	default:
		return seg.Seq.InWindow(nxt, uint32(wnd)) || seg.Seq.Add(n-1).InWindow(nxt, uint32(wnd))
	}
}

// trim cuts what lies outside the receive window off an acceptable segment.
func (c *Conn) trim(seg *Segment) {
	nxt := c.rcvNxt()
	if seg.Seq.LessThan(nxt) {
		d := nxt.Sub(seg.Seq)
		if seg.has(header.TCPFlagSYN) {
			seg.Flags &^= header.TCPFlagSYN
			d--
			seg.Seq++
		}
		d = min(d, len(seg.Payload))
		seg.Payload = seg.Payload[d:]
		seg.Seq = seg.Seq.Add(d)
	}
	right := nxt.Add(c.rcv.window())
	if end := seg.Seq.Add(len(seg.Payload)); right.LessThan(end) {
		seg.Payload = seg.Payload[:max(right.Sub(seg.Seq), 0)]
		seg.Flags &^= header.TCPFlagFIN
	}
}

// sendAck queues an immediate ACK.
func (c *Conn) sendAck() {
	c.ackNow = true
	c.wantOutput()
}

// challengeAck sends a challenge ACK, rate-limited (RFC 5961 §7).
func (c *Conn) challengeAck(now Time) {
	if c.stack.challengeAllowed(now) {
		c.Stats.ChallengeACKs++
		c.sendAck()
	}
}

// inputSynSent handles a segment in SYN-SENT (RFC 9293 §3.10.7.3).
func (c *Conn) inputSynSent(now Time, seg *Segment) {
	ackOK := false
	if seg.has(header.TCPFlagACK) {
		if seg.Ack.LessEq(c.iss) || c.sndMax.LessThan(seg.Ack) {
			if !seg.has(header.TCPFlagRST) {
				c.stack.queueRST(c.id, seg.Ack, 0, false)
			}
			return
		}
		ackOK = true
	}
	if seg.has(header.TCPFlagRST) {
		if ackOK {
			c.terminate(ErrRefused)
		}
		return
	}
	if !seg.has(header.TCPFlagSYN) {
		return
	}
	c.irs = seg.Seq
	c.rcv.start = seg.Seq + 1
	c.rcvAdv = c.rcv.start
	c.negotiate(now, &seg.Opts)
	if ackOK {
		c.established(now, seg, false)
		c.processAck(now, seg)
		c.sendAck()
		return
	}
	// Simultaneous open (§3.5, figure 8): answer with SYN-ACK.
	c.state = StateSynRcvd
	c.sndNxt = c.iss
	c.wantOutput()
}

// negotiate applies the options of the peer's SYN (RFC 9293 §3.7.1,
// RFC 7323 §1.3, RFC 2018 §2).
func (c *Conn) negotiate(now Time, o *header.TCPOptions) {
	opts := &c.stack.opts
	c.peerMSS = 536 // RFC 9293 §3.7.1 default
	if o.HasMSS && o.MSS > 0 {
		c.peerMSS = max(int(o.MSS), 64)
	}
	c.wsOK = o.HasWindowScale && !opts.DisableWindowScale
	if c.wsOK {
		c.sndWS = min(o.WindowScale, 14) // RFC 7323 §2.3
	} else {
		c.sndWS, c.rcvWS = 0, 0
	}
	c.sackOK = o.SACKPermitted && !opts.DisableSACK
	c.tsOK = o.HasTimestamp && !opts.DisableTimestamps
	if c.tsOK {
		c.tsRecent, c.tsRecentAt = o.TSVal, now
	}
	c.mss = min(c.peerMSS, mssFor(opts.MTU, c.v6()))
	if c.tsOK {
		c.mss -= tsOptLen
	}
	c.win.MSS = c.mss
	// RFC 6928 initial window of ten segments, as Linux.
	c.win.Cwnd = 10 * c.mss
	c.win.Ssthresh = 1 << 30
}

// established moves to ESTABLISHED. ackScaled says the segment's window is
// scaled (it is not a SYN).
func (c *Conn) established(now Time, seg *Segment, ackScaled bool) {
	c.state = StateEstablished
	w := int(seg.Window)
	if ackScaled {
		w <<= c.sndWS
	}
	c.sndWnd, c.maxSndWnd = w, w
	c.sndWl1, c.sndWl2 = seg.Seq, seg.Ack
	c.quickAcks = c.stack.opts.QuickACKs
	c.keepaliveReset(now)
	if c.listener != nil {
		c.listener.established(c)
		if c.state == StateClosed {
			return
		}
	}
	c.event(EventEstablished)
}

// processAck handles the acknowledgment, window and SACK fields of an
// acceptable segment (RFC 9293 §3.10.7.4 fifth, RFC 5681, RFC 6675).
func (c *Conn) processAck(now Time, seg *Segment) {
	ack := seg.Ack
	unaBefore, sackedBefore := c.sndUna, c.sb.sacked
	// Window update, with SND.WL1/WL2 guarding against old segments.
	wnd := int(seg.Window) << c.sndWS
	if seg.has(header.TCPFlagSYN) {
		wnd = int(seg.Window)
	}
	windowChanged := false
	if c.sndWl1.LessThan(seg.Seq) || (c.sndWl1 == seg.Seq && c.sndWl2.LessEq(ack)) {
		windowChanged = wnd != c.sndWnd
		c.sndWnd = wnd
		c.sndWl1, c.sndWl2 = seg.Seq, ack
		c.maxSndWnd = max(c.maxSndWnd, wnd)
		if wnd > 0 && c.rtoKind == timerPersist {
			c.rtoKind, c.rtoAt, c.backoff = timerRTO, 0, 0
			c.stack.timerChanged(c)
		}
		if windowChanged {
			c.wantOutput()
		}
	}
	// SACK blocks (RFC 2018 §4): only ranges above SND.UNA and not
	// beyond what was sent count; D-SACKs below SND.UNA are ignored.
	newSACK := false
	if c.sackOK {
		// The highest SACKed before this ACK: blocks in one ACK come
		// most recent first, so a lower one reported with a higher one
		// (its own ACK lost) was not overtaken by it.
		priorHigh, hadSACK := Seq(0), !c.sb.empty()
		if hadSACK {
			priorHigh = c.sb.highest()
		}
		for i := 0; i < seg.Opts.NumSACK; i++ {
			b := sackSpan(seg.Opts.SACK[i])
			c.Stats.SACKBlocksIn++
			if i == 0 && b.start.LessThan(b.end) && c.isDSACK(b, ack, &seg.Opts) {
				c.onDSACK(b)
				if c.tlpRxt && c.tlpSpan.contains(b) {
					c.tlpRxt = false // the probe was not needed
				}
				continue
			}
			if !b.start.LessThan(b.end) || !ack.LessThan(b.end) || c.sndMax.LessThan(b.end) {
				continue
			}
			b.start = maxSeq(b.start, ack)
			// Data never retransmitted arriving below what the peer
			// already holds was overtaken, not lost: reordering as
			// deep as the gap (Linux's tcp_check_sack_reordering).
			reordered := hadSACK && b.end.LessThan(priorHigh) && !b.start.LessThan(c.highRxt)
			if c.sb.add(b) {
				newSACK = true
				c.txSACKed(now, b)
				if reordered {
					c.sawReordering(priorHigh.Sub(b.end))
				}
			}
		}
	}
	if c.tsOK && seg.Opts.HasTimestamp && (c.tsRecentUnset || int32(seg.Opts.TSVal-c.tsRecent) >= 0) && seg.Seq.LessEq(c.lastAckSent) {
		// RFC 7323 §4.3: TS.Recent from the segment that covers the
		// last ACK sent.
		c.tsRecent, c.tsRecentAt, c.tsRecentUnset = seg.Opts.TSVal, now, false
	}

	acked := ack.Sub(c.sndUna)
	if acked > 0 {
		flightBefore := c.flight()
		c.rttFromAck(now, seg, ack)
		c.backoff, c.probeRounds = 0, 0
		// The hole at SND.UNA filled by its original transmission, with
		// data above it SACKed and no recovery or timeout since it
		// was sent: it was overtaken, not lost.
		if c.sackOK && !c.sb.empty() && !c.sndUna.LessThan(c.highRxt) &&
			!c.beforeRecoveryPoint() && ack.LessThan(c.sb.highest()) {
			c.sawReordering(c.sb.highest().Sub(ack))
		}
		c.txAcked(now, ack)
		c.sndUna = ack
		c.snd.release(minSeq(ack, c.snd.end()))
		c.sb.release(ack)
		if c.sndNxt.LessThan(ack) {
			c.sndNxt = ack
		}
		if c.highRxt.LessThan(ack) {
			c.highRxt = ack
		}
		if c.tlpValid && !ack.LessThan(c.tlpHigh) {
			// The probe's episode is over (RFC 8985 §7.4.2). A
			// retransmitted probe the peer did not report as a
			// duplicate repaired a loss: reduce the window for it.
			c.tlpValid = false
			if c.tlpRxt {
				c.tlpRxt = false
				c.Stats.ProbeRepairs++
				c.cc.OnLoss(now, flightBefore)
			}
		}
		dataAcked := acked
		if c.finQueued && c.sndUna == c.finSeqNum().Add(1) {
			dataAcked--
		}
		if c.inRecovery {
			if c.recoverSeq.LessEq(ack) {
				// RFC 6675 §5: recovery point reached. The window
				// is ssthresh, as Linux leaves it: min(ssthresh,
				// FlightSize+SMSS) is one segment when this ACK
				// covers everything, and a lone segment waits out
				// the peer's delayed ACK (40 ms on Linux) before
				// the window can grow.
				c.inRecovery = false
				c.win.Cwnd = c.win.Ssthresh
			} else if !c.sackOK {
				// RFC 6582 §3.2 step 5: a partial ACK without SACK
				// retransmits the next unacknowledged segment. With
				// SACK, the scoreboard says what is lost: a partial
				// ACK with nothing SACKed above it is what a
				// reordered segment arriving late looks like, and
				// resending the segment at SND.UNA on every such ACK
				// resent half the window for nothing. (A real loss
				// there is found by the probe timer.)
				c.retransmitUna = true
			}
		} else {
			c.cc.OnAck(now, dataAcked, c.cwndLimited(flightBefore), c.srtt)
		}
		c.dupAcks = 0
		// RFC 6298 §5.2-5.3.
		if c.flight() == 0 {
			if c.rtoKind != timerPersist {
				c.rtoKind, c.rtoAt = timerRTO, 0
				c.stack.timerChanged(c)
			}
		} else {
			c.armRetransmit(now)
		}
		if c.writeShort && c.snd.free() > 0 && c.h != nil {
			c.writeShort = false
			c.event(EventWritable)
		}
		c.wantOutput()
	} else if acked == 0 && c.flight() > 0 && ((c.sackOK && newSACK) ||
		(len(seg.Payload) == 0 && !seg.has(header.TCPFlagSYN|header.TCPFlagFIN) && !windowChanged)) {
		// A duplicate ACK: with SACK, one that SACKs new data whatever
		// its window or payload (RFC 6675 §2); without, RFC 5681 §2.
		c.dupAcks++
		c.Stats.DupAcksIn++
		// In recovery the pipe shrank; before it, Limited Transmit may
		// send (RFC 3042).
		c.wantOutput()
	}
	if newSACK && !c.inRecovery && c.rtoAt != 0 && c.rtoKind == timerRTO {
		// New SACKs under the RTO: the probe timer may come first
		// and find the hole below them lost (see probeFired). Where it
		// may not, the RTO stands: only new data acknowledged restarts
		// it (RFC 6298 §5.3).
		c.armProbe(now)
	}
	if newSACK && c.inRecovery {
		c.wantOutput()
	}
	if acked > 0 || newSACK {
		c.markLost(now)
	}
	c.detectLoss(now)
	if c.inRecovery && c.sackOK {
		c.prrAck(c.sndUna.Sub(unaBefore) + c.sb.sacked - sackedBefore)
	}
}

// cwndLimited: the window, not the application or the peer's window,
// held the flight back, so it may grow (RFC 7661 §4.1's test). In slow
// start, as Linux's tcp_is_cwnd_limited counts it: while cwnd is below
// twice the flight. A peer whose receive window grows with what it
// receives each round trip (Linux's autotuning) keeps a sender's flight
// at its window; growing cwnd only when the flight fills it held slow
// start to the receiver's pace after the window, not before it, and a
// 20 ms path to half Linux's goodput after three seconds.
func (c *Conn) cwndLimited(flight int) bool {
	if c.win.Cwnd < c.win.Ssthresh {
		return c.win.Cwnd < 2*flight
	}
	return flight+c.mss > c.win.Cwnd
}

// detectLoss enters fast recovery on DupThresh duplicate ACKs or when SACK
// shows the first unacknowledged segment lost (RFC 6675 §5, RFC 5681
// §3.2), at most once per window of data (RFC 6582 §3.2 step 1).
func (c *Conn) detectLoss(now Time) {
	if c.inRecovery || c.flight() == 0 || !c.state.synchronized() {
		return
	}
	// With SACK, markLost has marked what RACK or DupThresh finds lost.
	lost := c.rack.lost > 0 || c.dupAcks >= c.thresh()
	if !lost || c.beforeRecoveryPoint() {
		return
	}
	c.enterRecovery(now)
}

// enterRecovery starts fast recovery with the segment at SND.UNA.
func (c *Conn) enterRecovery(now Time) {
	c.inRecovery, c.recoverValid = true, true
	c.tlpValid, c.tlpRxt, c.sendTLP = false, false, false // recovery takes over
	c.probeRounds = 0
	c.recoverSeq = c.sndMax
	c.highRxt = c.sndUna
	c.undoValid, c.undoRxt = true, 0
	c.undoStart, c.undoEnd = c.sndUna, c.sndUna
	c.priorCwnd, c.priorThresh = c.win.Cwnd, c.win.Ssthresh
	c.prr = prrState{recoverFS: c.flight()}
	c.cc.OnLoss(now, c.flight())
	c.Stats.FastRetransmits++
	c.retransmitUna = true
	c.quickAcks = 0
	c.wantOutput()
}

// sawReordering raises the duplicate threshold to cover a segment that
// was overtaken by gap octets.
func (c *Conn) sawReordering(gap int) {
	degree := (gap+c.mss-1)/c.mss + 1
	c.rack.reoSeen = true
	if degree > c.thresh() {
		c.reordering = min(degree, maxReordering)
		c.Stats.Reorderings++
	}
}

// noteDuplicate remembers the part of a data segment below RCV.NXT, which
// the peer sent twice, for a D-SACK block in the next ACK (RFC 2883 §4).
func (c *Conn) noteDuplicate(seg *Segment) {
	nxt := c.rcvNxt()
	if !c.sackOK || len(seg.Payload) == 0 || !seg.Seq.LessThan(nxt) {
		return
	}
	end := minSeq(seg.Seq.Add(len(seg.Payload)), nxt)
	c.dsack, c.dsackValid = span{seg.Seq, end}, true
}

// sackSpan is a SACK block as a span.
func sackSpan(b header.SACKBlock) span { return span{Seq(b.Start), Seq(b.End)} }

// isDSACK reports whether the first SACK block b of an ACK reports a
// duplicate (RFC 2883 §4): below the cumulative ACK, or inside the second
// block.
func (c *Conn) isDSACK(b span, ack Seq, o *header.TCPOptions) bool {
	if b.end.LessEq(ack) {
		return true
	}
	if o.NumSACK > 1 {
		return sackSpan(o.SACK[1]).contains(b)
	}
	return false
}

// onDSACK takes a duplicate report. When the peer has reported every
// segment retransmitted in the last fast recovery as a duplicate, the
// originals had arrived: the segments were reordered, not lost. The window
// goes back to what it was before the recovery, and the duplicate
// threshold rises so that reordering as deep does not trigger it again.
func (c *Conn) onDSACK(b span) {
	c.Stats.DSACKsIn++
	c.rack.reoSeen = true // an original arrived after all
	if !c.undoValid || !(span{c.undoStart, c.undoEnd}).contains(b) {
		return
	}
	c.undoRxt--
	if c.undoRxt > 0 {
		return
	}
	c.undoValid = false
	c.Stats.SpuriousRecoveries++
	c.win.Cwnd = max(c.win.Cwnd, c.priorCwnd)
	c.win.Ssthresh = max(c.win.Ssthresh, c.priorThresh)
	c.inRecovery = false
	// The recovery point guarded against a second reduction for the
	// same window's losses; there were none, so a loss found now starts
	// a recovery at once (Linux returns to Open on undo too).
	c.recoverValid = false
	c.reordering = min(c.thresh()+2, maxReordering)
	c.wantOutput()
}

// rttFromAck takes a round-trip sample from an ACK of new data: from the
// echoed timestamp (RFC 7323 §4.1), else from the one timed segment,
// never from a retransmission (Karn).
func (c *Conn) rttFromAck(now Time, seg *Segment, ack Seq) {
	if c.tsOK && seg.Opts.HasTimestamp && seg.Opts.TSEcr != 0 {
		ms := int32(c.tsNow(now) - seg.Opts.TSEcr)
		if ms >= 0 && c.backoff == 0 {
			c.rtoSample(time.Duration(ms) * time.Millisecond)
		}
		return
	}
	if c.rttTiming && c.rttSeq.LessThan(ack) {
		c.rttTiming = false
		if c.backoff == 0 {
			c.rtoSample(now.Sub(c.rttAt))
		}
	}
}

// receiveData takes in-window payload at seq (RFC 9293 §3.10.7.4 seventh).
func (c *Conn) receiveData(now Time, seq Seq, p []byte, psh bool) {
	nxt := c.rcvNxt()
	c.Stats.OctetsIn += uint64(len(p))
	if seq != nxt {
		// Out of order: hold it and ACK at once with SACK (RFC 5681
		// §4.2, RFC 2018).
		c.Stats.OutOfOrder++
		added, ok := c.rcv.addOOOCount(seq, p)
		switch {
		case !ok:
			c.Stats.Dropped++
		case added == 0 && c.sackOK:
			// Held already, out of order: a duplicate too, which the
			// sender learns from a D-SACK (RFC 2883 §4.1.2), as
			// Linux reports it; without it a sender that resent
			// it early cannot tell reordering from loss.
			c.dsack, c.dsackValid = span{seq, seq.Add(len(p))}, true
		}
		c.dupAcksOwed = min(c.dupAcksOwed+1, 64)
		c.sendAck()
		return
	}
	hadHoles := len(c.rcv.ooo) > 0
	if c.rcv.n == 0 && c.h != nil {
		k := c.handlerReceive(p)
		c.rcv.skip(k)
		p = p[k:]
	}
	wasEmpty := c.rcv.n == 0
	c.rcv.put(c.rcvNxt(), p)
	c.rcv.advance(len(p))
	c.deliverBuffered()
	if hadHoles {
		c.sendAck() // a hole filled: ACK at once (RFC 5681 §4.2)
	}
	// Duplicate ACKs owed for out-of-order segments earlier in this
	// batch would now carry the new cumulative ACK: not duplicates any
	// more, and after our FIN-ACK they reach a peer that has closed and
	// answers each with a RST. The one ACK above says it all.
	c.dupAcksOwed = 0
	if wasEmpty && c.rcv.n > 0 && c.h != nil {
		c.event(EventReadable)
	}
	if c.finPending && c.finSeq == c.rcvNxt() {
		c.receiveFIN(now, c.finSeq)
	}
	// ACK at least every second full segment (RFC 5681 §4.2), at once
	// in quick-ACK mode, otherwise within the delayed-ACK time.
	c.unacked++
	switch {
	case c.quickAcks > 0:
		c.quickAcks--
		c.sendAck()
	case c.unacked >= 2:
		c.sendAck()
	case c.delackAt == 0:
		c.delackAt = now.Add(c.stack.opts.DelayedACK)
		c.stack.timerChanged(c)
	}
}

// deliverBuffered offers held in-order octets to the Handler, if there is
// one (a connection without one is read with Read).
func (c *Conn) deliverBuffered() {
	if c.h == nil {
		return
	}
	took := false
	for c.rcv.n > 0 {
		b := c.rcv.peek()
		k := c.handlerReceive(b)
		c.rcv.consume(k)
		took = took || k > 0
		if k < len(b) {
			break
		}
	}
	if took {
		c.windowOpened()
	}
}

// receiveFIN handles the peer's FIN at sequence number at (§3.10.7.4 eighth).
func (c *Conn) receiveFIN(now Time, at Seq) {
	if c.finRcvd {
		return
	}
	if at != c.rcvNxt() {
		c.finPending, c.finSeq = true, at // after a hole: wait for it
		c.sendAck()
		return
	}
	c.finRcvd, c.finPending = true, false
	c.sendAck()
	switch c.state {
	case StateSynRcvd, StateEstablished:
		c.state = StateCloseWait
	case StateFinWait1:
		if c.sndUna == c.finSeqNum().Add(1) {
			c.enterTimeWait(now)
		} else {
			c.state = StateClosing // simultaneous close (§3.6, figure 13)
		}
	case StateFinWait2:
		c.enterTimeWait(now)
	}
	c.event(EventPeerClosed)
}

// enterTimeWait starts TIME-WAIT (2*MSL).
func (c *Conn) enterTimeWait(now Time) {
	c.state = StateTimeWait
	c.rtoAt, c.keepAt, c.delackAt = 0, 0, 0
	c.rtoKind = timerRTO
	c.twAt = now.Add(c.stack.opts.TimeWait)
	c.stack.timerChanged(c)
}
