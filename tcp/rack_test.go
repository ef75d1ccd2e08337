package tcp_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// A receiver that gets an out-of-order segment it already holds reports
// it in a D-SACK (RFC 2883 §4.1.2), as one below RCV.NXT: without it a
// sender that resent the segment early cannot tell reordering from loss.
func TestDSACKForOutOfOrderDuplicate(t *testing.T) {
	p := established(t, tcp.Options{})
	log := recordAll(p.net)
	srv := p.server.Conn
	nxt := uint32(tcp.RcvNxtForTest(srv))
	id := p.cconn.ID()
	f := header.TCPFields{SrcPort: id.LocalPort, DstPort: id.RemotePort, Seq: nxt + 1000, Ack: uint32(tcp.RcvNxtForTest(p.cconn)),
		Flags: header.TCPFlagACK, Window: 65535}
	payload := make([]byte, 500)
	o := &header.TCPOptions{HasTimestamp: tcp.TSRecentForTest(p.cconn) != 0, TSVal: tcp.TSRecentForTest(srv) + 1}
	if !o.HasTimestamp {
		o = nil
	}
	for range 2 {
		inject(p.net, p.net.B, f, o, payload)
		p.net.Flush()
	}
	var acks []seg
	for _, s := range *log {
		if s.from == "B" && s.s.n == 0 {
			acks = append(acks, s.s)
		}
	}
	if len(acks) < 2 {
		t.Fatalf("%d ACKs for two out-of-order segments", len(acks))
	}
	last := acks[len(acks)-1]
	want := header.SACKBlock{Start: nxt + 1000, End: nxt + 1500}
	if last.ack != nxt || last.opts.NumSACK < 2 || last.opts.SACK[0] != want || last.opts.SACK[1] != want {
		t.Fatalf("ACK for the duplicate: ack %d (want %d), SACK %v, want the duplicate %v first and as held",
			last.ack, nxt, last.opts.SACK[:last.opts.NumSACK], want)
	}
	if first := acks[len(acks)-2]; first.opts.NumSACK != 1 || first.opts.SACK[0] != want {
		t.Fatalf("ACK for the first copy: SACK %v", first.opts.SACK[:first.opts.NumSACK])
	}
}

// A receiver whose window, not the sender's, limits the flight: in slow
// start the sender counts itself window-limited while cwnd is below twice
// the flight (Linux's tcp_is_cwnd_limited), so cwnd stands at about twice
// the peer's window when the peer opens it further, not at the window.
// (Growing only when the flight filled cwnd held slow start behind a
// receiver that widens its window with what it receives each round
// trip: half of Linux's goodput at 20 ms in the loss benchmark.)
func TestSlowStartGrowsPastAPeerWindowLimit(t *testing.T) {
	link := func() *sim.Link { return &sim.Link{Delay: time.Millisecond, Rate: 1e9, Queue: 4 << 20} }
	const window = 256 << 10
	n, c, recv := bulkStream(t, 5, tcp.Options{}, tcp.Options{ReceiveBuffer: window}, link(), link())
	n.RunFor(200 * time.Millisecond)
	w := c.Window()
	if recv.Corrupt != nil || c.Stats.Retransmits != 0 {
		t.Fatalf("corrupt %v, retransmits %d", recv.Corrupt, c.Stats.Retransmits)
	}
	if w.Cwnd < window*3/2 || w.Cwnd > 2*window+2*w.MSS {
		t.Fatalf("cwnd %d behind a peer window of %d, want about twice the window", w.Cwnd, window)
	}
}

// One segment lost from a full window: fast recovery with Proportional
// Rate Reduction (RFC 6937) keeps sending as the ACKs come, about seven
// segments for every ten the peer takes, until the window is down to
// ssthresh. Cutting cwnd to ssthresh at once (RFC 6675 alone) left the
// sender silent for the first third of the recovery, waiting for the
// pipe to fall below the new window, and then sending in a burst.
func TestPRRSpreadsTheReduction(t *testing.T) {
	var dataSeen int
	link := func() *sim.Link { return &sim.Link{Delay: time.Millisecond, Rate: 100e6, Queue: 64 << 20} }
	ab := link()
	ab.Drop = func(b []byte) bool {
		if len(header.TCP(b).Payload()) == 0 {
			return false
		}
		dataSeen++
		return dataSeen == 1500
	}
	p := newPair(t, 7, tcp.Options{}, ab, link(), 16<<20, 0, true)
	var start, end tcp.Time
	var sends []tcp.Time
	p.net.Tap = func(h *sim.Host, b []byte) {
		if h != p.net.A || len(header.TCP(b).Payload()) == 0 || end != 0 {
			return
		}
		in := tcp.InRecoveryForTest(p.cconn)
		switch {
		case in && start == 0:
			start = p.net.Now // the fast retransmission
		case in:
			sends = append(sends, p.net.Now)
		case start != 0:
			end = p.net.Now
		}
	}
	if !p.net.Run(time.Minute, func() bool { return p.done(true) }) {
		t.Fatalf("received %d", p.server.Recvd)
	}
	p.check(t, "transfer")
	st := p.cconn.Stats
	if start == 0 || end == 0 || st.FastRetransmits != 1 || st.RTOs != 0 {
		t.Fatalf("no single fast recovery: %+v", st)
	}
	early := 0
	for _, at := range sends {
		if at < start+(end-start)/3 {
			early++
		}
	}
	t.Logf("recovery of %v: %d segments sent, %d in its first third; %+v", time.Duration(end-start), len(sends), early, st)
	if len(sends) < 20 || early < len(sends)/5 {
		t.Fatalf("in recovery %d segments sent, %d in the first third", len(sends), early)
	}
}

// bulkStream connects A to B over links ab and ba, A sending its pattern
// for ever and B checking it; the clock has not moved yet.
func bulkStream(tb testing.TB, seed uint64, oa, ob tcp.Options, ab, ba *sim.Link) (*sim.Network, *tcp.Conn, *sim.Endpoint) {
	tb.Helper()
	sa, sb := newStack(tb, oa), newStack(tb, ob)
	n := sim.New(seed, sa, sb, ab, ba)
	recv := &sim.Endpoint{Seed: 2, PeerSeed: 1}
	send := &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: 1 << 40}
	if _, err := sb.Listen(netip.Addr{}, port, recv); err != nil {
		tb.Fatal(err)
	}
	c, err := sa.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), send)
	if err != nil {
		tb.Fatal(err)
	}
	send.Conn = c
	return n, c, recv
}
