package tcp

import "fmt"

// Busy reports whether the connection has octets (or its FIN) it has not
// seen acknowledged: sent and outstanding, or queued and not yet sent.
func (c *Conn) Busy() bool {
	return c.state.synchronized() && c.state != StateTimeWait && (c.flight() > 0 || c.snd.n > 0)
}

// Progress returns what moves while the connection makes progress: the
// oldest unacknowledged sequence number and the octets received. A caller
// that sees neither change while Busy (or while its own protocol waits for
// the peer) has a stalled connection.
func (c *Conn) Progress() (una Seq, in uint64) { return c.sndUna, c.Stats.OctetsIn }

// Diag describes the connection's state for a stall report: sequence
// numbers relative to the initial ones, windows, timers relative to now,
// recovery state and the counters.
func (c *Conn) Diag(now Time) string {
	timer := func(at Time) string {
		if at == 0 {
			return "off"
		}
		return at.Sub(now).String()
	}
	s := &c.Stats
	return fmt.Sprintf("%v %v una=%d nxt=%d max=%d flight=%d queued=%d fin=%v sndwnd=%d cwnd=%d ssthresh=%d "+
		"rcvnxt=%d rcvbuf=%d rcvwnd=%d ooo=%d srtt=%v rto=%v backoff=%d rto-timer=%s(%d) persist-probes=%d "+
		"recovery=%v sacked=%d lost=%d tlp=%v/%v probe-rounds=%d "+
		"segs=%d/%d octets=%d/%d rxt=%d fast=%d rtos=%d tlps=%d losstimeouts=%d ooo-in=%d dropped=%d",
		c.id, c.state, c.sndUna.Sub(c.iss), c.sndNxt.Sub(c.iss), c.sndMax.Sub(c.iss), c.flight(), c.snd.n, c.finQueued,
		c.sndWnd, c.win.Cwnd, c.win.Ssthresh,
		c.rcv.start.Add(c.rcv.n).Sub(c.irs), c.rcv.n, c.rcv.window(), len(c.rcv.ooo),
		c.srtt, c.rto, c.backoff, timer(c.rtoAt), c.rtoKind, c.probes,
		c.inRecovery, c.sb.sacked, c.rack.lost, c.tlpValid, c.sendTLP, c.probeRounds,
		s.SegmentsIn, s.SegmentsOut, s.OctetsIn, s.OctetsOut, s.Retransmits, s.FastRetransmits, s.RTOs,
		s.LossProbes, s.LossTimeouts, s.OutOfOrder, s.Dropped)
}
