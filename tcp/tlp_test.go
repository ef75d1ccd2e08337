package tcp

// Loss detection by timer: tail loss probes (RFC 8985 §7), the probe timer
// finding a hole with too few segments SACKed above it, and the window
// after recovery. Each test failed before the change it covers: the
// engine sender waited out 200 ms RTOs where the kernel peer had lost one
// ACK (TestKernelPeerImpaired/*/loss1 ran at 5 MB/s against 150 for Linux).

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/header"
)

const tlpRTT = Time(100 * time.Microsecond)

// tlpClient is an established connection with SACK to a hand-driven peer
// (MSS 1000, window 64000), whose RTT was measured at 100 us.
func tlpClient(t *testing.T) (*Stack, *Conn, Seq) {
	t.Helper()
	s := rvStack(t, Options{})
	c, err := s.Connect(0, rvLocal, 40000, netip.AddrPortFrom(rvRemote, 80), &rvHandler{})
	if err != nil {
		t.Fatal(err)
	}
	out := rvDrain(s, 0)
	if len(out) != 1 {
		t.Fatalf("syn: %+v", out)
	}
	irs := Seq(5000)
	rvIn(s, tlpRTT, 40000, 80, irs, out[0].seq+1, header.TCPFlagSYN|header.TCPFlagACK, 64000, nil,
		&header.TCPOptions{MSS: 1000, HasMSS: true, SACKPermitted: true})
	rvDrain(s, tlpRTT)
	if c.State() != StateEstablished || !c.sackOK || c.srtt == 0 {
		t.Fatalf("state %v sack %v srtt %v", c.State(), c.sackOK, c.srtt)
	}
	return s, c, irs + 1
}

// tlpFlight writes n octets on a tlpClient connection and takes the first
// flight, at most the initial window of ten segments.
func tlpFlight(t *testing.T, n int) (s *Stack, c *Conn, pseq Seq, flight []rvSeg, now Time) {
	t.Helper()
	s, c, pseq = tlpClient(t)
	c.Write(make([]byte, n))
	now = 2 * tlpRTT
	flight = rvDrain(s, now)
	if want := min((n+999)/1000, 10); len(flight) != want {
		t.Fatalf("first flight: %d segments, want %d", len(flight), want)
	}
	return s, c, pseq, flight, now
}

// tlpAck delivers a pure ACK from the peer with the given SACK blocks.
func tlpAck(s *Stack, now Time, pseq, ack Seq, blocks ...span) {
	var o header.TCPOptions
	for i, b := range blocks {
		o.SACK[i] = header.SACKBlock{Start: uint32(b.start), End: uint32(b.end)}
		o.NumSACK = i + 1
	}
	rvIn(s, now, 40000, 80, pseq, ack, header.TCPFlagACK, 64000, nil, &o)
}

// fire advances to the connection's next timer and returns when it was
// and what went out.
func fire(t *testing.T, s *Stack) (Time, []rvSeg) {
	t.Helper()
	at, ok := s.NextTimer()
	if !ok {
		t.Fatal("no timer armed")
	}
	s.Advance(at)
	return at, rvDrain(s, at)
}

// The ACK for a whole flight is lost and the window is full: the probe
// timer fires after about two RTTs, not the RTO, and sends two segments
// of new data beyond the window, whose ACK covers everything.
func TestLossProbeAfterLostACK(t *testing.T) {
	s, c, pseq, flight, now := tlpFlight(t, 40000)
	una := flight[0].seq
	// The peer ACKs the first half; the ACK for the rest is lost.
	now += tlpRTT
	tlpAck(s, now, pseq, una+5000)
	more := rvDrain(s, now)
	sent := flight[len(flight)-1].seq + 1000
	if len(more) > 0 {
		sent = more[len(more)-1].seq + Seq(more[len(more)-1].n)
	}
	at, probe := fire(t, s)
	if d := time.Duration(at - now); d > 5*time.Millisecond {
		t.Fatalf("first timer %v after the last ACK, want a probe within 5 ms", d)
	}
	if len(probe) != 2 || probe[0].seq != sent || probe[0].n != 1000 || probe[1].seq != sent+1000 {
		t.Fatalf("probe %+v, want two new segments from %d", probe, sent)
	}
	if c.Stats.LossProbes != 1 || c.Stats.RTOs != 0 {
		t.Fatalf("stats %+v", c.Stats)
	}
	cwnd := c.win.Cwnd
	tlpAck(s, at+tlpRTT, pseq, sent+2000)
	if c.tlpValid || c.Stats.ProbeRepairs != 0 || c.win.Cwnd < cwnd {
		t.Fatalf("after the probe's ACK: tlpValid %v, stats %+v, cwnd %d (was %d)", c.tlpValid, c.Stats, c.win.Cwnd, cwnd)
	}
}

// Nothing new to send: the probe is the last segment again. An ACK that
// covers it without reporting it a duplicate says the original was lost,
// and the window is reduced for that loss; a D-SACK of it says the probe
// was not needed, and the window stays.
func TestLossProbeRetransmitsLastSegment(t *testing.T) {
	for _, dsack := range []bool{false, true} {
		t.Run(fmt.Sprintf("dsack=%v", dsack), func(t *testing.T) {
			s, c, pseq, flight, now := tlpFlight(t, 4000)
			una, end := flight[0].seq, flight[3].seq+1000
			now += tlpRTT
			tlpAck(s, now, pseq, una+1000)
			at, probe := fire(t, s)
			if d := time.Duration(at - now); d > 5*time.Millisecond {
				t.Fatalf("probe %v after the last ACK", d)
			}
			if len(probe) != 1 || probe[0].seq != end-1000 || probe[0].n != 1000 {
				t.Fatalf("probe %+v, want the last segment, %d", probe, end-1000)
			}
			cwnd := c.win.Cwnd
			if dsack {
				tlpAck(s, at+tlpRTT, pseq, end, span{end - 1000, end})
			} else {
				tlpAck(s, at+tlpRTT, pseq, end)
			}
			if c.tlpValid {
				t.Fatal("probe still outstanding")
			}
			if dsack && (c.Stats.ProbeRepairs != 0 || c.win.Cwnd < cwnd) {
				t.Fatalf("unneeded probe: repairs %d, cwnd %d (was %d)", c.Stats.ProbeRepairs, c.win.Cwnd, cwnd)
			}
			if !dsack && (c.Stats.ProbeRepairs != 1 || c.win.Cwnd >= cwnd) {
				t.Fatalf("repairing probe: repairs %d, cwnd %d (was %d)", c.Stats.ProbeRepairs, c.win.Cwnd, cwnd)
			}
		})
	}
}

// A small flight whose first segment is lost: two segments SACKed above
// it are below DupThresh, and before RACK and the probe timer the RTO
// (200 ms) was the only way out. RACK's reordering timer (a quarter of
// the minimum RTT here) finds the hole lost and fast recovery
// retransmits it.
func TestProbeTimerStartsRecovery(t *testing.T) {
	s, c, pseq, flight, now := tlpFlight(t, 3000)
	una := flight[0].seq
	now += tlpRTT
	tlpAck(s, now, pseq, una, span{una + 1000, una + 2000})
	tlpAck(s, now, pseq, una, span{una + 1000, una + 3000})
	if c.inRecovery {
		t.Fatal("recovery on two duplicate ACKs")
	}
	at, out := fire(t, s)
	if d := time.Duration(at - now); d > 5*time.Millisecond {
		t.Fatalf("timer %v after the last ACK", d)
	}
	if d := at - now; d > tlpRTT/2 {
		t.Fatalf("timer %v after the last ACK, want RACK's reordering window", time.Duration(d))
	}
	if !c.inRecovery || c.Stats.FastRetransmits != 1 || len(out) != 1 || out[0].seq != una || out[0].n != 1000 {
		t.Fatalf("recovery %v, stats %+v, sent %+v", c.inRecovery, c.Stats, out)
	}
}

// With a lost ACK, the peer's next one reports an old block after a new
// higher one. That is not reordering: the duplicate threshold stays.
func TestSACKBlocksOfOneACKNotReordering(t *testing.T) {
	s, c, pseq, flight, now := tlpFlight(t, 10000)
	now += tlpRTT
	una := flight[0].seq + 1000
	tlpAck(s, now, pseq, una)
	rvDrain(s, now)
	tlpAck(s, now, pseq, una, span{una + 1000, una + 2000})
	// The ACK that reported una+3000..4000 was lost; the next reports
	// the newest block first, then the older ones.
	tlpAck(s, now, pseq, una, span{una + 8000, una + 9000}, span{una + 3000, una + 4000}, span{una + 1000, una + 2000})
	if c.reordering != 0 || c.Stats.Reorderings != 0 {
		t.Fatalf("reordering %d, stats %+v", c.reordering, c.Stats)
	}
}

// Recovery ends with an ACK of everything in flight: the window is
// ssthresh, not one segment (which would wait out the peer's delayed ACK).
func TestRecoveryExitWindow(t *testing.T) {
	s, c, pseq, flight, now := tlpFlight(t, 10000)
	una, end := flight[0].seq, flight[len(flight)-1].seq+1000
	now += tlpRTT
	for k := Seq(2); k <= 5; k++ {
		tlpAck(s, now, pseq, una, span{una + 1000, una + k*1000})
	}
	if !c.inRecovery {
		t.Fatal("no recovery")
	}
	rvDrain(s, now)
	now += tlpRTT
	tlpAck(s, now, pseq, end)
	if c.inRecovery || c.win.Cwnd != c.win.Ssthresh || c.win.Cwnd < 2*c.mss {
		t.Fatalf("after recovery: in %v, cwnd %d, ssthresh %d", c.inRecovery, c.win.Cwnd, c.win.Ssthresh)
	}
}

// After an RTO the sender goes back over unacknowledged data; SACKs for
// those retransmissions below data SACKed earlier are not reordering
// (they were counted as such, and the raised duplicate threshold then
// turned every later loss in a small window into another RTO).
func TestGoBackAfterRTONotReordering(t *testing.T) {
	s, c, pseq, flight, now := tlpFlight(t, 10000)
	una := flight[0].seq
	now += tlpRTT
	tlpAck(s, now, pseq, una, span{una + 9000, una + 10000})
	// The probe timer starts recovery; its retransmissions are lost,
	// and the RTO follows.
	var out []rvSeg
	for i := 0; i <= maxProbeRounds+1 && c.Stats.RTOs == 0; i++ {
		now, out = fire(t, s)
	}
	if c.Stats.RTOs != 1 || len(out) != 1 || out[0].seq != una {
		t.Fatalf("stats %+v, sent %+v", c.Stats, out)
	}
	now += tlpRTT
	tlpAck(s, now, pseq, una+1000, span{una + 9000, una + 10000})
	out = rvDrain(s, now)
	if len(out) != 2 || out[1].seq != una+2000 {
		t.Fatalf("after the RTO's ACK: %+v", out)
	}
	// The first of them is lost, the second arrives.
	now += tlpRTT
	tlpAck(s, now, pseq, una+1000, span{una + 2000, una + 3000}, span{una + 9000, una + 10000})
	if c.reordering != 0 || c.Stats.Reorderings != 0 {
		t.Fatalf("reordering %d, stats %+v", c.reordering, c.Stats)
	}
}

// In fast recovery, a retransmission that is lost again is sent again
// when the probe timer finds no progress, a few times, before the RTO.
func TestProbeTimerInRecovery(t *testing.T) {
	s, c, pseq, flight, now := tlpFlight(t, 10000)
	c.reordering = 10 // a peer seen to reorder deeply
	c.rack.reoSeen = true
	una := flight[0].seq
	now += tlpRTT
	for k := Seq(2); k <= 10; k++ {
		tlpAck(s, now, pseq, una, span{una + 1000, una + k*1000})
	}
	if c.inRecovery {
		t.Fatal("recovery below the raised threshold")
	}
	last := now
	for round := 1; round <= maxProbeRounds+1; round++ {
		at, out := fire(t, s)
		if len(out) != 1 || out[0].seq != una || out[0].n != 1000 || !c.inRecovery {
			t.Fatalf("round %d: recovery %v, sent %+v", round, c.inRecovery, out)
		}
		if d := time.Duration(at - last); d > 10*time.Millisecond {
			t.Fatalf("round %d: %v after the last", round, d)
		}
		last = at
	}
	st := c.Stats
	if st.RTOs != 0 || st.FastRetransmits != 1 || st.LostRetransmits != maxProbeRounds {
		t.Fatalf("stats %+v", st)
	}
	// Rounds exhausted: the RTO is next.
	at, _ := fire(t, s)
	if c.Stats.RTOs != 1 || time.Duration(at-last) < s.opts.RTOMin {
		t.Fatalf("after %d rounds: RTOs %d at %v", maxProbeRounds, c.Stats.RTOs, time.Duration(at-last))
	}
}

// After an RTO the retransmission timer backs off, and only an ACK of new
// data restarts it (RFC 6298 §5.3): an ACK that only SACKs does not push
// the backed-off RTO later.
func TestSACKOnlyACKKeepsTheRTO(t *testing.T) {
	s, c, pseq, flight, _ := tlpFlight(t, 40000)
	una := flight[0].seq
	var at Time
	for c.Stats.RTOs == 0 {
		at, _ = fire(t, s)
	}
	rto := c.rtoAt
	if c.rtoKind != timerRTO || c.backoff == 0 {
		t.Fatalf("after the RTO: timer %v, backoff %d", c.rtoKind, c.backoff)
	}
	tlpAck(s, at+Time(time.Millisecond), pseq, una, span{una + 3000, una + 4000})
	if c.rtoAt != rto {
		t.Fatalf("a SACK-only ACK moved the RTO by %v", time.Duration(c.rtoAt-rto))
	}
}
