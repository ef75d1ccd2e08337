package tcp

import (
	"github.com/softrnic/softrnic/header"
)

// MaxHeader is the largest TCP header Output writes: 20 octets and 40 of
// options. Output buffers need room for MaxHeader plus the MSS.
const MaxHeader = 60

// tsOptLen is the space timestamps take in every segment (RFC 7323 §3.2,
// NOP NOP TS as Linux lays them out).
const tsOptLen = 12

// output writes the connection's next segment into b and returns its
// length, or 0 when it has nothing to send now.
func (c *Conn) output(now Time, b []byte) int {
	switch c.state {
	case StateClosed, StateListen:
		return 0
	case StateSynSent, StateSynRcvd:
		if c.sndNxt == c.iss {
			return c.sendSYN(now, b)
		}
		if c.state == StateSynSent {
			return 0
		}
	}
	if c.state.synchronized() && c.state != StateTimeWait {
		if n := c.sendData(now, b); n > 0 {
			return n
		}
		if c.sendProbe {
			c.sendProbe = false
			return c.sendProbeSegment(now, b)
		}
	}
	if c.ackNow || c.dupAcksOwed > 0 {
		// SEQ = SND.MAX, not SND.NXT: after an RTO, SND.NXT is back at
		// SND.UNA, below what the peer has received, and a pure ACK
		// there is an unacceptable segment that Linux drops unread
		// (BSD's tcp_output does the same).
		return c.build(now, b, c.sndMax, header.TCPFlagACK, 0, nil)
	}
	return 0
}

// sendSYN sends the SYN (active open) or SYN-ACK (passive open) with the
// options we offer (RFC 9293 §3.7.1, RFC 7323, RFC 2018).
func (c *Conn) sendSYN(now Time, b []byte) int {
	flags := uint8(header.TCPFlagSYN)
	if c.state == StateSynRcvd {
		flags |= header.TCPFlagACK
	}
	if c.sndMax != c.iss {
		c.Stats.Retransmits++
	}
	n := c.build(now, b, c.iss, flags, 0, nil)
	c.sndNxt = c.iss + 1
	c.sndMax = maxSeq(c.sndMax, c.sndNxt)
	if c.rtoAt == 0 {
		c.armRTO(now)
	}
	if !c.tsOK && !c.rttTiming && c.backoff == 0 {
		c.rttTiming, c.rttSeq, c.rttAt = true, c.iss, now
	}
	return n
}

// finSeq is the sequence number of our FIN: right after the data.
func (c *Conn) finSeqNum() Seq { return c.snd.end() }

// finSentNow: the FIN has been sent (and not rolled back by an RTO).
func (c *Conn) finSentNow() bool { return c.finQueued && c.sndNxt == c.finSeqNum().Add(1) }

// sendData sends retransmissions, new data or the FIN, as loss recovery,
// the congestion window and the peer's window allow.
func (c *Conn) sendData(now Time, b []byte) int {
	if c.state != StateEstablished && c.state != StateCloseWait &&
		c.state != StateFinWait1 && c.state != StateClosing && c.state != StateLastAck {
		return 0
	}
	// The options of every segment sent here, filled once: they give
	// the room left for payload, and build writes them as they are.
	var o header.TCPOptions
	c.fillOptions(&o, now, false)
	optLen := header.TCPOptionsLen(&o)
	maxPayload := min(c.peerMSS, mssFor(c.stack.opts.MTU, c.v6())) - optLen
	maxPayload = min(maxPayload, len(b)-20-optLen)

	if c.retransmitUna {
		c.retransmitUna = false
		if n := min(c.snd.end().Sub(c.sndUna), maxPayload); n > 0 || c.finSentNow() {
			c.retransmitted(c.sndUna.Add(n))
			fin := c.finQueued && c.sndUna.Add(n) == c.finSeqNum() && c.finSentNow()
			return c.sendSegment(now, b, c.sndUna, n, fin, &o)
		}
	}
	// The pipe (RFC 6675), once: nothing below changes it before a
	// segment goes.
	var pipe int
	if c.inRecovery {
		pipe = c.pipe()
	}
	// RFC 6675 §5 (NextSeg rule 1): retransmit the first range marked
	// lost (by RACK or DupThresh: markLost).
	if c.inRecovery && pipe+c.mss <= c.win.Cwnd {
		if h, ok := c.nextLost(maxPayload); ok {
			c.retransmitted(h.end)
			return c.sendSegment(now, b, h.start, h.len(), false, &o)
		}
	}

	if c.sendTLP {
		c.sendTLP = false
		if n := c.sendLossProbe(now, b, &o, maxPayload); n > 0 {
			return n
		}
	}

	unsent := c.snd.end().Sub(c.sndNxt)
	wnd := min(c.win.Cwnd, c.sndWnd)
	var usable int
	if c.inRecovery {
		// NextSeg rule 2: new data as the pipe allows.
		usable = min(c.win.Cwnd-pipe, c.sndUna.Add(c.sndWnd).Sub(c.sndNxt))
	} else {
		usable = c.sndUna.Add(wnd).Sub(c.sndNxt)
		// RFC 3042 Limited Transmit (RFC 5681 §3.2): on the first two
		// duplicate ACKs, new data up to cwnd plus that many segments,
		// as the peer's window allows; cwnd itself stays.
		if k := min(c.dupAcks, c.thresh()-1); k > 0 && c.sndNxt == c.sndMax {
			usable = max(usable, min(c.sndUna.Add(c.win.Cwnd+k*c.mss).Sub(c.sndNxt),
				c.sndUna.Add(c.sndWnd).Sub(c.sndNxt)))
		}
	}
	// After an RTO, going back over data the peer has SACKed would
	// resend it for nothing (RFC 6675 §5.1): skip those ranges.
	if c.sndNxt.LessThan(c.sndMax) && !c.sb.empty() {
		c.skipSacked()
		unsent = c.snd.end().Sub(c.sndNxt)
	}
	want := usable
	if c.sndWnd == 0 && c.flight() == 0 && unsent == 0 {
		// The window is shut and the data is still the Filler's: take a
		// segment's worth into the buffer, or nothing would arm the
		// persist timer and the window would never be probed (RFC 9293
		// §3.8.6.1): a peer that never reopens it, or whose update is
		// lost, would hold the connection for ever.
		want = min(maxPayload, c.snd.free())
	}
	unsent = c.fill(unsent, want)
	if unsent > 0 {
		n := min(unsent, maxPayload, usable)
		if n <= 0 {
			if c.sndWnd == 0 && c.flight() == 0 && c.rtoAt == 0 {
				c.armPersist(now) // RFC 9293 §3.8.6.1
			}
			return 0
		}
		// Sender SWS avoidance (RFC 9293 §3.8.6.2.1), without Nagle:
		// a full segment, everything queued, half the largest window
		// the peer offered, or nothing in flight to wait for. It
		// holds back new data only: octets below SND.MAX went out
		// once already, and after an RTO (SND.NXT back at SND.UNA,
		// while flight still counts to SND.MAX) holding them back
		// would wait for an ACK that was lost, at every RTO, for ever.
		if n < maxPayload && n < unsent && n < c.maxSndWnd/2 && c.flight() > 0 && c.sndNxt == c.sndMax {
			return 0
		}
		if c.sndNxt.LessThan(c.sndMax) {
			// Stop at the next SACKed range.
			if h, ok := c.sb.nextHole(c.sndNxt, c.sndMax, n); ok && h.start == c.sndNxt {
				n = h.len()
			}
		}
		fin := c.finQueued && c.sndNxt.Add(n) == c.finSeqNum()
		return c.sendSegment(now, b, c.sndNxt, n, fin, &o)
	}
	if c.finQueued && c.sndNxt == c.finSeqNum() {
		return c.sendSegment(now, b, c.sndNxt, 0, true, &o)
	}
	return 0
}

// fill asks a Filler handler for data until want octets are unsent, and
// returns how many are.
func (c *Conn) fill(unsent, want int) int {
	f, ok := c.h.(Filler)
	if !ok || c.finQueued {
		return unsent
	}
	// A stream that drained its ring after a busy period takes one of
	// the size that period needed for the producer to fill in place, as
	// it was before it drained; if the producer has nothing, the ring
	// goes back, and with it that size (sendBuf.next), so that an idle
	// connection does not take one at each turn.
	again := c.snd.n == 0 && c.snd.next > 0 && unsent < want
	if again {
		c.snd.grow(1)
	}
	unsent = c.fillFrom(f, unsent, want)
	if again && c.snd.n == 0 {
		c.snd.drop()
	}
	return unsent
}

// fillFrom is fill's loop: the producer fills the ring's free space in
// place, or scratch space the ring then takes.
func (c *Conn) fillFrom(f Filler, unsent, want int) int {
	for unsent < want && c.snd.free() > 0 {
		room := want - unsent
		t := c.snd.tail()
		if len(t) > 0 {
			m := min(len(t), room)
			k := c.handlerFill(f, t[:m:m]) // past m: unacknowledged octets, or past want
			if k > 0 {
				c.snd.added(k)
				unsent += k
				continue
			}
			if len(t) >= room || c.snd.free() <= len(t) {
				break
			}
		}
		// There is no ring (an idle connection holds none, and the
		// producer may have nothing: a ring taken for it would be held
		// for nothing), or it is full, or the free space before its end
		// is too short for the producer's next whole unit (an FPDU)
		// while more is free past the wrap or past the ring's size. The
		// producer fills scratch space, and the ring takes what it gave,
		// growing for it. (Without the last case, nothing more was sent
		// until every octet in flight was acknowledged and the ring
		// started over, which took the peer's delayed ACK for the last
		// segment: 40 ms stalls that held an xdp Write stream to a
		// quarter of its rate.)
		s := c.stack.fillScratch(min(room, c.snd.free()))
		k := c.handlerFill(f, s[:len(s):len(s)])
		if k <= 0 {
			break
		}
		c.snd.write(s[:k])
		unsent += k
	}
	return unsent
}

// sendLossProbe sends the tail loss probe (RFC 8985 §7.3): new data,
// beyond the congestion window, when there is some and the peer's window
// has room; else the last segment sent again. Either draws an ACK, with
// SACK blocks, that shows what the peer is missing. New data goes as two
// full segments where it can (this is called again for the second): when
// what was lost is the peer's ACK, one in-order segment is all it has
// received since, and Linux holds the ACK for it up to its delayed-ACK
// time (40 ms or more); two it acknowledges at once.
func (c *Conn) sendLossProbe(now Time, b []byte, o *header.TCPOptions, maxPayload int) int {
	second := c.tlpValid
	if c.flight() == 0 {
		return 0
	}
	if !second {
		c.Stats.LossProbes++
	}
	if room := min(maxPayload, c.sndUna.Add(c.sndWnd).Sub(c.sndNxt)); c.sndNxt == c.sndMax && room > 0 {
		if unsent := c.fill(c.snd.end().Sub(c.sndNxt), room); unsent > 0 {
			n := min(unsent, room)
			fin := c.finQueued && c.sndNxt.Add(n) == c.finSeqNum()
			k := c.sendSegment(now, b, c.sndNxt, n, fin, o)
			c.tlpValid, c.tlpRxt, c.tlpHigh = true, false, c.sndMax
			c.sendTLP = !second && n == maxPayload
			return k
		}
	}
	if second {
		return 0
	}
	end, fin := c.sndMax, c.finSentNow()
	if fin {
		end = c.finSeqNum()
	}
	start := c.sndUna
	if end.Sub(start) > maxPayload {
		start = end.Add(-maxPayload)
	}
	c.Stats.Retransmits++
	k := c.sendSegment(now, b, start, end.Sub(start), fin, o)
	c.tlpValid, c.tlpRxt, c.tlpHigh = true, true, c.sndMax
	c.tlpSpan = span{start, end}
	return k
}

// retransmitted books a retransmission of the octets up to end: HighRxt,
// the count, and the undo bookkeeping (noteRetransmit). (Whether it is
// lost again is RACK's to find: markLost.)
func (c *Conn) retransmitted(end Seq) {
	c.highRxt = maxSeq(c.highRxt, end)
	c.Stats.Retransmits++
	c.noteRetransmit(end)
}

// noteRetransmit counts a retransmission, ending at end, in the current
// fast recovery, which a D-SACK may later show unneeded (see onDSACK).
func (c *Conn) noteRetransmit(end Seq) {
	if c.undoValid && c.inRecovery {
		c.undoRxt++
		c.undoEnd = maxSeq(c.undoEnd, end)
	} else {
		c.undoValid = false // retransmitted outside a recovery: no undo
	}
}

// skipSacked moves SND.NXT over SACKed octets while retransmitting.
func (c *Conn) skipSacked() {
	for _, r := range c.sb.s {
		if c.sndNxt.LessThan(r.start) {
			return
		}
		if c.sndNxt.LessThan(r.end) {
			c.sndNxt = minSeq(r.end, c.sndMax)
		}
	}
}

// sendSegment sends n octets from seq (and the FIN after them), advancing
// SND.NXT when it sends beyond it, with the options o.
func (c *Conn) sendSegment(now Time, b []byte, seq Seq, n int, fin bool, o *header.TCPOptions) int {
	flags := uint8(header.TCPFlagACK)
	if fin {
		flags |= header.TCPFlagFIN
	}
	if n > 0 && seq.Add(n) == c.snd.end() {
		flags |= header.TCPFlagPSH
	}
	retrans := seq.LessThan(c.sndMax)
	end := seq.Add(n)
	if fin {
		end = end.Add(1)
	}
	if retrans && seq == c.sndNxt {
		// Going back over sent data after an RTO: these are
		// retransmissions too, and their SACKs are no sign of
		// reordering (see processAck).
		c.Stats.Retransmits++
		c.highRxt = maxSeq(c.highRxt, end)
	}
	// A lone segment in flight is covered by the RTO (its ACK may be
	// delayed); once a second one follows, a loss probe may come first.
	lone := c.flight() <= c.mss
	hdr := c.build(now, b, seq, flags, n, o)
	if n > 0 {
		c.txSent(now, seq, seq.Add(n))
		if c.inRecovery {
			c.prr.out += n
		}
		c.snd.read(b[hdr-n:hdr], seq)
		c.Stats.OctetsOut += uint64(n)
		// The checksum covers the payload: fill it before summing.
		header.TCP(b[:hdr]).SetChecksum(c.id.LocalAddr, c.id.RemoteAddr)
	}
	if c.sndNxt.LessThan(end) {
		c.sndNxt = end
	}
	if c.sndMax.LessThan(c.sndNxt) {
		c.sndMax = c.sndNxt
	}
	if !retrans {
		c.lastSentAt = now
	}
	if c.rtoAt == 0 || c.rtoKind == timerPersist || (lone && !retrans && c.rtoKind != timerProbe && c.flight() > c.mss) {
		c.armRetransmit(now)
	}
	if !c.tsOK && !c.rttTiming && !retrans && n > 0 {
		c.rttTiming, c.rttSeq, c.rttAt = true, seq, now
	}
	if fin && c.state == StateEstablished {
		c.state = StateFinWait1
	} else if fin && c.state == StateCloseWait {
		c.state = StateLastAck
	}
	return hdr
}

// sendProbeSegment sends a zero-window probe (one octet past the window,
// RFC 9293 §3.8.6.1) or a keepalive (SND.UNA-1, no data, §3.8.4).
func (c *Conn) sendProbeSegment(now Time, b []byte) int {
	if c.sndWnd == 0 && c.snd.end().Sub(c.sndUna) > 0 {
		hdr := c.build(now, b, c.sndUna, header.TCPFlagACK, 1, nil)
		c.snd.read(b[hdr-1:hdr], c.sndUna)
		header.TCP(b[:hdr]).SetChecksum(c.id.LocalAddr, c.id.RemoteAddr)
		return hdr
	}
	return c.build(now, b, c.sndUna-1, header.TCPFlagACK, 0, nil)
}

func (c *Conn) v6() bool { return c.id.LocalAddr.Is6() && !c.id.LocalAddr.Is4In6() }

// tsNow is our timestamp clock: milliseconds plus a per-connection offset
// (RFC 7323 §5.4).
func (c *Conn) tsNow(now Time) uint32 { return uint32(int64(now)/1e6) + c.tsOffset }

func (c *Conn) fillOptions(o *header.TCPOptions, now Time, syn bool) {
	if syn {
		o.MSS, o.HasMSS = uint16(mssFor(c.stack.opts.MTU, c.v6())), true
		if c.state == StateSynSent || c.wsOK {
			if !c.stack.opts.DisableWindowScale {
				o.WindowScale, o.HasWindowScale = c.rcvWS, true
			}
		}
		if (c.state == StateSynSent && !c.stack.opts.DisableSACK) || c.sackOK {
			o.SACKPermitted = true
		}
		if (c.state == StateSynSent && !c.stack.opts.DisableTimestamps) || c.tsOK {
			o.HasTimestamp = true
			o.TSVal, o.TSEcr = c.tsNow(now), c.tsRecent
		}
		return
	}
	if c.tsOK {
		o.HasTimestamp = true
		o.TSVal, o.TSEcr = c.tsNow(now), c.tsRecent
	}
	if c.sackOK && (len(c.rcv.ooo) > 0 || c.dsackValid) {
		var blocks [header.MaxSACKBlocks]span
		k := 0
		if c.dsackValid {
			blocks[0], k = c.dsack, 1 // a D-SACK goes first (RFC 2883 §4)
		}
		n := k + c.rcv.sackBlocks(blocks[k:])
		for i := 0; i < n; i++ {
			o.SACK[i] = header.SACKBlock{Start: uint32(blocks[i].start), End: uint32(blocks[i].end)}
		}
		o.NumSACK = n
	}
}

// advertise returns the window to put in a segment, unscaled, moving the
// advertised right edge forward only by useful amounts (receiver SWS
// avoidance, RFC 9293 §3.8.6.2.2) and never back (§3.8.6.1).
func (c *Conn) advertise() int {
	edge := c.rcv.rightEdge()
	grow := edge.Sub(c.rcvAdv)
	if c.rcvAdv.LessThan(edge) && (grow >= min(c.rcv.size/2, c.mss) || c.rcvAdv.LessEq(c.rcvNxt())) {
		c.rcvAdv = edge
	}
	return max(c.rcvAdv.Sub(c.rcvNxt()), 0)
}

// rcvNxt is RCV.NXT: after the octets received in order, and the FIN.
func (c *Conn) rcvNxt() Seq {
	n := c.rcv.start.Add(c.rcv.n)
	if c.finRcvd {
		n++
	}
	return n
}

// build writes a segment header (and options) for payload octets that the
// caller copies in after it, and returns the segment's total length. For
// n == 0 the checksum is final; otherwise the caller sets it after copying
// the payload. o is the options when the caller has filled them (nil: now).
func (c *Conn) build(now Time, b []byte, seq Seq, flags uint8, n int, o *header.TCPOptions) int {
	syn := flags&header.TCPFlagSYN != 0
	if o == nil {
		o = new(header.TCPOptions)
		c.fillOptions(o, now, syn)
	}
	optLen := header.EncodeTCPOptions(b[20:], o)
	var ack Seq
	if flags&header.TCPFlagACK != 0 {
		ack = c.rcvNxt()
	}
	wnd := c.advertise()
	if syn {
		wnd = min(wnd, 65535) // RFC 7323 §2.2: SYN windows are never scaled
	} else {
		wnd = min(wnd>>c.rcvWS, 65535)
	}
	t := header.TCP(b)
	t.Encode(&header.TCPFields{
		SrcPort: c.id.LocalPort, DstPort: c.id.RemotePort,
		Seq: uint32(seq), Ack: uint32(ack), Flags: flags, Window: uint16(wnd),
		OptionsLen: optLen,
	})
	total := 20 + optLen + n
	if n == 0 {
		header.TCP(b[:total]).SetChecksum(c.id.LocalAddr, c.id.RemoteAddr)
	}
	if flags&header.TCPFlagACK != 0 {
		if n == 0 && c.dupAcksOwed > 0 {
			c.dupAcksOwed--
		}
		c.ackNow = false
		c.dsackValid = false // reported once
		c.unacked = 0
		c.delackAt = 0
		c.lastAckSent = ack
	}
	c.Stats.SegmentsOut++
	return total
}
