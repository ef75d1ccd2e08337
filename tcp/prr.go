package tcp

// prrState is Proportional Rate Reduction (RFC 6937) for the sending
// rate in fast recovery, with SACK: the window is brought down to
// ssthresh in step with what the peer delivers, not cut at once. Cut at
// once (RFC 6675 alone), a sender with its window full sends nothing
// until the pipe has shrunk by the whole reduction, a third of a window
// of ACKs, then sends in a burst; and a recovery with more losses than
// the reduction allows leaves it sending one segment per round trip.
type prrState struct {
	// recoverFS is the flight at the start of recovery; delivered and
	// out count the octets the peer took and we sent since.
	recoverFS, delivered, out int
}

// prrAck sets cwnd for an ACK in fast recovery that reported delivered
// octets newly acknowledged or SACKed (RFC 6937 §3.1, with PRR-SSRB).
func (c *Conn) prrAck(delivered int) {
	if delivered <= 0 || c.prr.recoverFS <= 0 {
		return
	}
	c.prr.delivered += delivered
	pipe := c.pipe()
	ssthresh := c.win.Ssthresh
	var sndcnt int
	if pipe > ssthresh {
		// Proportional: ssthresh/RecoverFS of what was delivered.
		sndcnt = int((int64(c.prr.delivered)*int64(ssthresh)+int64(c.prr.recoverFS)-1)/int64(c.prr.recoverFS)) - c.prr.out
	} else {
		// Slow start reduction bound: back up to ssthresh, at most one
		// segment more than was delivered.
		sndcnt = min(ssthresh-pipe, max(c.prr.delivered-c.prr.out, delivered)+c.mss)
	}
	c.win.Cwnd = pipe + max(sndcnt, 0)
}
