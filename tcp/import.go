package tcp

import (
	"errors"
	"fmt"
	"time"
)

// Imported is the state of an established connection that another TCP
// ran until now — the kernel's, read with TCP_REPAIR, when the RNIC takes
// a live connection over (seed 004's stream → RDMA) — from which
// Stack.Import makes a connection of this engine that goes on where the
// other stopped. What another TCP cannot tell (TS.Recent, the SACK
// scoreboard, out-of-order data it held) is not here: the peer's next
// segment gives the first, and the peer retransmits what the others
// covered.
type Imported struct {
	ID FourTuple
	// SndUna is the oldest octet the peer has not acknowledged, SndNxt
	// the next the other TCP would have sent: it sent [SndUna, SndNxt).
	SndUna, SndNxt Seq
	// Send holds the octets from SndUna on: sent and unacknowledged,
	// then not yet sent. They go out before anything written later.
	Send []byte
	// RcvNxt is the next octet expected from the peer; Unread are the
	// octets before it that were acknowledged but never read, which the
	// connection holds first for its reader.
	RcvNxt Seq
	Unread []byte
	// The peer's window (scaled) and the segment that last updated it
	// (SND.WL1), and the largest window it offered.
	SndWnd    int
	SndWl1    Seq
	MaxSndWnd int
	// RcvWup + RcvWnd is the right edge of the window last advertised,
	// which is never taken back (RFC 9293 §3.8.6.1).
	RcvWup Seq
	RcvWnd int
	// PeerMSS is the MSS the peer offered in its SYN.
	PeerMSS int
	// WindowScale: both sides scale, the peer by SndWS and we by RcvWS.
	WindowScale  bool
	SndWS, RcvWS uint8
	SACK         bool
	// Timestamps: TSVal is the other TCP's timestamp clock now, which
	// ours continues from, so that the peer never sees TSval go back.
	Timestamps bool
	TSVal      uint32
	// SRTT and RTTVar seed the RTO (zero: no sample yet); Cwnd and
	// Ssthresh (octets) the window (zero: the initial ones).
	SRTT, RTTVar   time.Duration
	Cwnd, Ssthresh int
}

// ErrImport is wrapped by Import's refusals.
var ErrImport = errors.New("tcp: import")

// Import makes an ESTABLISHED connection from st with h as its Handler
// and reports EventEstablished to it, as a connection that had just been
// opened. The octets the other TCP had sent and not had acknowledged are
// sent again at once, from SndUna (it may have lost them: the peer drops
// what it already holds), as after a retransmission timeout but with the
// window kept; Unread is offered to h first. The other TCP may have sent
// more of Send after SndNxt was read: the peer's ACK of it is taken. A connection with the same
// addresses fails it with ErrPortInUse.
func (s *Stack) Import(now Time, st Imported, h Handler) (*Conn, error) {
	switch {
	case !st.ID.LocalAddr.IsValid() || !st.ID.RemoteAddr.IsValid() || st.ID.LocalPort == 0 || st.ID.RemotePort == 0:
		return nil, fmt.Errorf("%w: addresses %v", ErrImport, st.ID)
	case st.SndNxt.LessThan(st.SndUna) || st.SndNxt.Sub(st.SndUna) > len(st.Send):
		return nil, fmt.Errorf("%w: %d octets sent beyond SND.UNA but %d held", ErrImport, st.SndNxt.Sub(st.SndUna), len(st.Send))
	case len(st.Send) > 1<<30 || len(st.Unread) > 1<<30 || st.SndWnd < 0 || st.RcvWnd < 0 || st.RcvWnd > 1<<30:
		return nil, fmt.Errorf("%w: sizes out of range", ErrImport)
	case st.WindowScale && (st.SndWS > 14 || st.RcvWS > 14):
		return nil, fmt.Errorf("%w: window scales %d/%d beyond 14", ErrImport, st.SndWS, st.RcvWS)
	case st.PeerMSS < 64:
		return nil, fmt.Errorf("%w: peer MSS %d", ErrImport, st.PeerMSS)
	case s.conns[st.ID] != nil:
		return nil, ErrPortInUse
	}
	outer := s.enter()
	defer s.leave(outer)
	c := s.newConn(now, st.ID, h)
	c.state = StateEstablished

	// Send side: the buffer starts at SND.UNA, and SND.NXT goes back to
	// it (go-back-N) while SND.MAX stays where the other TCP was, so
	// that an ACK of anything it sent is acceptable; and of what it may
	// have sent after its state was read, up to the end of Send
	// (otherMax).
	c.iss = st.SndUna - 1
	c.sndUna, c.sndNxt, c.sndMax = st.SndUna, st.SndUna, st.SndNxt
	if end := st.SndUna.Add(len(st.Send)); st.SndNxt.LessThan(end) {
		c.otherMax, c.otherMaxValid = end, true
	}
	c.snd.start = st.SndUna
	c.snd.size = max(c.snd.size, len(st.Send))
	if c.snd.write(st.Send) != len(st.Send) {
		return nil, fmt.Errorf("%w: send buffer", ErrImport)
	}
	c.highRxt = st.SndUna
	// Late SACKs for what the other TCP sent must not cut the window
	// (RFC 6582 §4, as after a timeout).
	c.recoverSeq, c.recoverValid = st.SndNxt, true
	c.sndWnd, c.sndWl1, c.sndWl2 = st.SndWnd, st.SndWl1, st.SndUna
	c.maxSndWnd = max(st.MaxSndWnd, st.SndWnd)

	// Receive side: the unread octets are in order before RCV.NXT.
	start := st.RcvNxt - Seq(len(st.Unread))
	c.irs = start - 1
	c.rcv.size = max(c.rcv.size, st.RcvWnd+len(st.Unread))
	c.rcv.start = start
	c.rcv.put(start, st.Unread)
	c.rcv.advance(len(st.Unread))
	c.rcvAdv = c.rcv.rightEdge()
	if edge := st.RcvWup.Add(st.RcvWnd); c.rcvAdv.LessThan(edge) {
		c.rcvAdv = edge
	}
	c.lastAckSent = st.RcvNxt

	// Options in force.
	c.wsOK = st.WindowScale && !s.opts.DisableWindowScale
	if c.wsOK {
		c.sndWS, c.rcvWS = st.SndWS, st.RcvWS
	} else {
		c.sndWS, c.rcvWS = 0, 0
	}
	c.sackOK = st.SACK && !s.opts.DisableSACK
	c.tsOK = st.Timestamps && !s.opts.DisableTimestamps
	if c.tsOK {
		// Our clock goes on from the other TCP's (tsNow).
		c.tsOffset = st.TSVal - uint32(int64(now)/1e6)
		c.tsRecentUnset = true
	}
	c.peerMSS = st.PeerMSS
	c.mss = min(c.peerMSS, mssFor(s.opts.MTU, c.v6()))
	if c.tsOK {
		c.mss -= tsOptLen
	}
	c.win = Window{MSS: c.mss, Cwnd: 10 * c.mss, Ssthresh: 1 << 30}
	if st.Cwnd > 0 {
		c.win.Cwnd = max(st.Cwnd, 2*c.mss)
	}
	if st.Ssthresh > 0 {
		c.win.Ssthresh = max(st.Ssthresh, 2*c.mss)
	}
	if st.SRTT > 0 {
		c.srtt, c.rttvar = st.SRTT, max(st.RTTVar, st.SRTT/4)
		c.rto = min(max(c.srtt+max(4*c.rttvar, time.Millisecond), s.opts.RTOMin), s.opts.RTOMax)
	}
	c.quickAcks = s.opts.QuickACKs
	c.keepaliveReset(now)
	s.add(c)
	if c.sndMax != c.sndUna || len(st.Send) > 0 {
		c.armRTO(now)
		c.wantOutput()
	}
	c.event(EventEstablished)
	c.deliverBuffered()
	return c, nil
}

// Export is the state Import takes, read from c as TCP_REPAIR reads a
// kernel connection's: for tests of Import, and for a connection that
// goes on elsewhere. Like the kernel's, it leaves out TS.Recent, the
// SACK scoreboard and the out-of-order data. Only an ESTABLISHED
// connection with no FIN queued can be exported (as the daemon takes
// over only such kernel connections).
func (c *Conn) Export(now Time) (Imported, error) {
	if c.state != StateEstablished || c.finQueued {
		return Imported{}, fmt.Errorf("%w: export in %v (FIN queued %v)", ErrImport, c.state, c.finQueued)
	}
	st := Imported{
		ID:     c.id,
		SndUna: c.sndUna, SndNxt: c.sndMax,
		Send:   make([]byte, c.snd.end().Sub(c.sndUna)),
		RcvNxt: c.rcvNxt(), Unread: make([]byte, c.rcv.n),
		SndWnd: c.sndWnd, SndWl1: c.sndWl1, MaxSndWnd: c.maxSndWnd,
		RcvWup: c.rcvNxt(), RcvWnd: max(c.rcvAdv.Sub(c.rcvNxt()), 0),
		PeerMSS:     c.peerMSS,
		WindowScale: c.wsOK, SndWS: c.sndWS, RcvWS: c.rcvWS,
		SACK:       c.sackOK,
		Timestamps: c.tsOK, TSVal: c.tsNow(now),
		SRTT: c.srtt, RTTVar: c.rttvar,
		Cwnd: c.win.Cwnd, Ssthresh: c.win.Ssthresh,
	}
	c.snd.read(st.Send, c.sndUna)
	if c.rcv.n > 0 {
		copy(st.Unread, c.rcv.peek())
		if k := len(c.rcv.peek()); k < c.rcv.n {
			copy(st.Unread[k:], c.rcv.r.b[:c.rcv.n-k]) // the ring wrapped
		}
	}
	return st, nil
}
