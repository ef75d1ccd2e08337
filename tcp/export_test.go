package tcp

// SetISNForTest makes the stack's new connections start at isn.
func (s *Stack) SetISNForTest(isn uint32) {
	s.isnOverride = func(FourTuple) Seq { return Seq(isn) }
}

// Accessors for tests of the engine's state.
func FINSeqForTest(c *Conn) Seq      { return c.finSeqNum() }
func RcvNxtForTest(c *Conn) Seq      { return c.rcvNxt() }
func SndNxtForTest(c *Conn) Seq      { return c.sndNxt }
func BufferedForTest(c *Conn) int    { return c.rcv.n }
func TSRecentForTest(c *Conn) uint32 { return c.tsRecent }
func SACKForTest(c *Conn) bool       { return c.sackOK }
func SndWSForTest(c *Conn) uint8     { return c.sndWS }
func IssForTest(c *Conn) Seq         { return c.iss }
func IrsForTest(c *Conn) Seq         { return c.irs }

func InRecoveryForTest(c *Conn) bool { return c.inRecovery }
