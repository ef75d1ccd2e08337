package tcp_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

func plainLink() *sim.Link { return &sim.Link{Delay: 5 * time.Millisecond} }

// seg decodes a captured segment for assertions.
type seg struct {
	flags    uint8
	seq, ack uint32
	n        int
	wnd      uint16
	opts     header.TCPOptions
}

func decode(b []byte) seg {
	t := header.TCP(b)
	s := seg{flags: t.Flags(), seq: t.Seq(), ack: t.Ack(), n: len(t.Payload()), wnd: t.Window()}
	header.ParseTCPOptions(t.Options(), &s.opts)
	return s
}

// record collects what each host sends, with the send time.
type sent struct {
	at   tcp.Time
	from string
	s    seg
}

func recordAll(n *sim.Network) *[]sent {
	var log []sent
	n.Tap = func(h *sim.Host, b []byte) {
		from := "A"
		if h == n.B {
			from = "B"
		}
		log = append(log, sent{n.Now, from, decode(b)})
	}
	return &log
}

// inject delivers a hand-built segment to host to, from the other host.
func inject(n *sim.Network, to *sim.Host, f header.TCPFields, o *header.TCPOptions, payload []byte) {
	b := make([]byte, 60+len(payload))
	optLen := 0
	if o != nil {
		optLen = header.EncodeTCPOptions(b[20:], o)
	}
	f.OptionsLen = optLen
	header.TCP(b).Encode(&f)
	copy(b[20+optLen:], payload)
	b = b[:20+optLen+len(payload)]
	src, dst := n.A.Addr, n.B.Addr
	if to == n.A {
		src, dst = dst, src
	}
	header.TCP(b).SetChecksum(src, dst)
	to.Stack.Input(n.Now, src, dst, b)
}

// established returns a pair with the handshake done and some data moved.
func established(t *testing.T, o tcp.Options) *pair {
	p := newPair(t, 1, o, plainLink(), plainLink(), 0, 0, false)
	if !p.net.Run(time.Second, func() bool { return p.server.Established && p.cconn.State() == tcp.StateEstablished }) {
		t.Fatal("no handshake")
	}
	return p
}

func TestHandshakeNegotiatesOptions(t *testing.T) {
	for _, tc := range []struct {
		name           string
		client, server tcp.Options
		sack, ts, ws   bool
		wantMSS        int
	}{
		{"all", tcp.Options{}, tcp.Options{}, true, true, true, 1448},
		{"server without SACK", tcp.Options{}, tcp.Options{DisableSACK: true}, false, true, true, 1448},
		{"client without timestamps", tcp.Options{DisableTimestamps: true}, tcp.Options{}, true, false, true, 1460},
		{"server without window scaling", tcp.Options{}, tcp.Options{DisableWindowScale: true}, true, true, false, 1448},
		{"smaller server MTU", tcp.Options{}, tcp.Options{MTU: 1280}, true, true, true, 1228},
	} {
		a, b := newStack(t, tc.client), newStack(t, tc.server)
		n := sim.New(1, a, b, plainLink(), plainLink())
		log := recordAll(n)
		srv := &sim.Endpoint{}
		if _, err := b.Listen(netip.Addr{}, port, srv); err != nil {
			t.Fatal(err)
		}
		c, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), &sim.Endpoint{})
		if err != nil {
			t.Fatal(err)
		}
		if !n.Run(time.Second, func() bool { return srv.Established && c.State() == tcp.StateEstablished }) {
			t.Fatalf("%s: no handshake", tc.name)
		}
		syn, synack := (*log)[0].s, (*log)[1].s
		if syn.flags != header.TCPFlagSYN || synack.flags != header.TCPFlagSYN|header.TCPFlagACK || synack.ack != syn.seq+1 {
			t.Fatalf("%s: handshake %+v %+v", tc.name, syn, synack)
		}
		// RFC 7323 §2.2: the window in a SYN is never scaled.
		if syn.wnd != 65535 {
			t.Errorf("%s: SYN window %d", tc.name, syn.wnd)
		}
		// RFC 7323 §1.3 and RFC 2018 §2: an option is used only when
		// both sides offered it; the SYN-ACK only echoes what the SYN
		// had.
		if synack.opts.SACKPermitted != tc.sack || synack.opts.HasTimestamp != tc.ts || synack.opts.HasWindowScale != tc.ws {
			t.Errorf("%s: SYN-ACK offers sack=%v ts=%v ws=%v", tc.name, synack.opts.SACKPermitted, synack.opts.HasTimestamp, synack.opts.HasWindowScale)
		}
		if got := c.MSS(); got != tc.wantMSS {
			t.Errorf("%s: client MSS %d, want %d", tc.name, got, tc.wantMSS)
		}
		// The third segment carries timestamps only if negotiated.
		third := (*log)[2].s
		if third.opts.HasTimestamp != tc.ts || third.flags != header.TCPFlagACK {
			t.Errorf("%s: third segment %+v", tc.name, third)
		}
	}
}

func TestSimultaneousOpen(t *testing.T) {
	a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
	n := sim.New(1, a, b, plainLink(), plainLink())
	log := recordAll(n)
	ea := &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: 10000, CloseWhenDone: true}
	eb := &sim.Endpoint{Seed: 2, PeerSeed: 1, Total: 20000, CloseWhenDone: true}
	ca, err := a.Connect(n.Now, n.A.Addr, 5000, netip.AddrPortFrom(n.B.Addr, 6000), ea)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Connect(n.Now, n.B.Addr, 6000, netip.AddrPortFrom(n.A.Addr, 5000), eb)
	if err != nil {
		t.Fatal(err)
	}
	ea.Conn, eb.Conn = ca, cb
	if !n.Run(time.Minute, func() bool { return ea.Recvd == 20000 && eb.Recvd == 10000 && ea.Closed && eb.Closed }) {
		t.Fatalf("simultaneous open: %v %v, recvd %d %d", ca.State(), cb.State(), ea.Recvd, eb.Recvd)
	}
	// RFC 9293 figure 8: SYN, SYN crossing, then SYN-ACKs both ways.
	if (*log)[0].s.flags != header.TCPFlagSYN || (*log)[1].s.flags != header.TCPFlagSYN ||
		(*log)[2].s.flags != header.TCPFlagSYN|header.TCPFlagACK || (*log)[3].s.flags != header.TCPFlagSYN|header.TCPFlagACK {
		t.Errorf("handshake: %+v", (*log)[:4])
	}
	if ea.Corrupt != nil || eb.Corrupt != nil || ea.Err != nil || eb.Err != nil {
		t.Fatalf("corrupt %v %v err %v %v", ea.Corrupt, eb.Corrupt, ea.Err, eb.Err)
	}
}

func TestSimultaneousClose(t *testing.T) {
	p := established(t, tcp.Options{TimeWait: time.Second})
	p.cconn.Close()
	p.server.Conn.Close()
	p.net.Run(3*time.Millisecond, func() bool { return false })
	// Both FINs cross: both go through CLOSING to TIME-WAIT (figure 13).
	if !p.net.Run(20*time.Millisecond, func() bool {
		return p.cconn.State() == tcp.StateTimeWait && p.server.Conn.State() == tcp.StateTimeWait
	}) {
		t.Fatalf("states %v %v, want TIME-WAIT on both", p.cconn.State(), p.server.Conn.State())
	}
	if !p.net.Run(2*time.Second, func() bool { return p.client.Closed && p.server.Closed }) {
		t.Fatal("TIME-WAIT did not end")
	}
	if p.client.Err != nil || p.server.Err != nil {
		t.Fatalf("errors %v %v", p.client.Err, p.server.Err)
	}
}

func TestClosePaths(t *testing.T) {
	// Active close by the client: client FIN-WAIT-1, FIN-WAIT-2, then
	// TIME-WAIT when the server closes; server CLOSE-WAIT, LAST-ACK.
	p := established(t, tcp.Options{TimeWait: time.Second})
	p.cconn.Close()
	if !p.net.Run(time.Second, func() bool {
		return p.cconn.State() == tcp.StateFinWait2 && p.server.Conn.State() == tcp.StateCloseWait
	}) {
		t.Fatalf("half close: %v %v", p.cconn.State(), p.server.Conn.State())
	}
	if !p.server.PeerClosed || p.client.PeerClosed {
		t.Fatal("EventPeerClosed not where expected")
	}
	// Half-closed: the server can still send.
	p.server.Total = 5000
	p.server.Pump()
	if !p.net.Run(time.Second, func() bool { return p.client.Recvd == 5000 }) {
		t.Fatal("no data after half close")
	}
	p.server.Conn.Close()
	if !p.net.Run(time.Second, func() bool { return p.cconn.State() == tcp.StateTimeWait && p.server.Closed }) {
		t.Fatalf("close: %v %v", p.cconn.State(), p.server.Conn.State())
	}
	// TIME-WAIT: a retransmitted FIN is acknowledged again and restarts
	// the 2*MSL timer (RFC 9293 §3.10.7.4).
	srv := p.server.Conn
	log := recordAll(p.net)
	p.net.RunFor(500 * time.Millisecond)
	inject(p.net, p.net.A, header.TCPFields{
		SrcPort: port, DstPort: p.cconn.ID().LocalPort, Seq: srvFinSeq(srv), Ack: 0,
		Flags: header.TCPFlagFIN | header.TCPFlagACK, Window: 1000,
	}, nil, nil)
	p.net.Flush()
	if len(*log) != 1 || (*log)[0].s.flags != header.TCPFlagACK {
		t.Fatalf("retransmitted FIN in TIME-WAIT answered with %+v", *log)
	}
	p.net.RunFor(700 * time.Millisecond)
	t.Logf("client state %v", p.cconn.State())
	if p.client.Closed {
		t.Fatal("TIME-WAIT not restarted by the retransmitted FIN")
	}
	p.net.RunFor(time.Second)
	if !p.client.Closed || p.client.Err != nil {
		t.Fatalf("TIME-WAIT did not end cleanly: %v", p.client.Err)
	}
}

// srvFinSeq is the sequence number of the server's FIN as the client saw
// it: RCV.NXT - 1 on the client.
func srvFinSeq(srv *tcp.Conn) uint32 { return uint32(tcp.FINSeqForTest(srv)) }

func TestResets(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
		n := sim.New(1, a, b, plainLink(), plainLink())
		e := &sim.Endpoint{}
		c, _ := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, 9), e)
		if !n.Run(time.Second, func() bool { return e.Closed }) || !errors.Is(c.Err(), tcp.ErrRefused) {
			t.Fatalf("connect to a closed port: %v", c.Err())
		}
	})
	t.Run("abort", func(t *testing.T) {
		p := established(t, tcp.Options{})
		p.cconn.Abort()
		if !p.net.Run(time.Second, func() bool { return p.server.Closed }) || !errors.Is(p.server.Err, tcp.ErrReset) || !errors.Is(p.client.Err, tcp.ErrAborted) {
			t.Fatalf("abort: server %v client %v", p.server.Err, p.client.Err)
		}
	})
	// RFC 5961 §3.2: a RST in the window but not at RCV.NXT draws a
	// challenge ACK and the connection survives; one outside the window
	// is dropped silently; only an exact one resets.
	t.Run("blind reset", func(t *testing.T) {
		p := established(t, tcp.Options{})
		srv := p.server.Conn
		log := recordAll(p.net)
		nxt := tcp.RcvNxtForTest(srv)
		f := header.TCPFields{SrcPort: p.cconn.ID().LocalPort, DstPort: port, Flags: header.TCPFlagRST, Window: 100}
		f.Seq = uint32(nxt) + 1000
		inject(p.net, p.net.B, f, nil, nil)
		p.net.Flush()
		if srv.State() != tcp.StateEstablished || len(*log) != 1 || (*log)[0].s.flags != header.TCPFlagACK || srv.Stats.ChallengeACKs != 1 {
			t.Fatalf("in-window RST: state %v, sent %+v", srv.State(), *log)
		}
		f.Seq = uint32(nxt) + 1<<30
		inject(p.net, p.net.B, f, nil, nil)
		p.net.Flush()
		if srv.State() != tcp.StateEstablished || len(*log) != 1 {
			t.Fatalf("out-of-window RST: state %v, sent %+v", srv.State(), *log)
		}
		f.Seq = uint32(nxt)
		inject(p.net, p.net.B, f, nil, nil)
		if srv.State() != tcp.StateClosed || !errors.Is(srv.Err(), tcp.ErrReset) {
			t.Fatalf("exact RST: state %v err %v", srv.State(), srv.Err())
		}
	})
	// RFC 5961 §4.2: a SYN on an established connection draws a
	// challenge ACK, never a reset.
	t.Run("SYN on an established connection", func(t *testing.T) {
		p := established(t, tcp.Options{})
		srv := p.server.Conn
		log := recordAll(p.net)
		inject(p.net, p.net.B, header.TCPFields{SrcPort: p.cconn.ID().LocalPort, DstPort: port, Seq: uint32(tcp.RcvNxtForTest(srv)) + 5, Flags: header.TCPFlagSYN, Window: 100}, nil, nil)
		p.net.Flush()
		if srv.State() != tcp.StateEstablished || len(*log) != 1 || (*log)[0].s.flags != header.TCPFlagACK {
			t.Fatalf("SYN: state %v, sent %+v", srv.State(), *log)
		}
	})
	// RFC 5961 §5.2: an ACK for data never sent is answered with an ACK
	// and dropped; it must not advance anything.
	t.Run("ACK of unsent data", func(t *testing.T) {
		p := established(t, tcp.Options{})
		srv := p.server.Conn
		log := recordAll(p.net)
		inject(p.net, p.net.B, header.TCPFields{SrcPort: p.cconn.ID().LocalPort, DstPort: port, Seq: uint32(tcp.RcvNxtForTest(srv)),
			Ack: uint32(tcp.SndNxtForTest(srv)) + 100000, Flags: header.TCPFlagACK, Window: 100}, nil, []byte("x"))
		p.net.Flush()
		if srv.State() != tcp.StateEstablished || len(*log) != 1 || p.server.Recvd != 0 {
			t.Fatalf("bad ACK: state %v, recvd %d, sent %+v", srv.State(), p.server.Recvd, *log)
		}
	})
	// RFC 9293 §3.10.7.1: a segment to no connection gets a RST: with
	// SEQ = SEG.ACK if it had an ACK.
	t.Run("no connection", func(t *testing.T) {
		p := established(t, tcp.Options{})
		log := recordAll(p.net)
		inject(p.net, p.net.B, header.TCPFields{SrcPort: 1234, DstPort: port, Seq: 77, Ack: 999, Flags: header.TCPFlagACK, Window: 1}, nil, nil)
		inject(p.net, p.net.B, header.TCPFields{SrcPort: 1234, DstPort: 4321, Seq: 77, Flags: header.TCPFlagSYN, Window: 1}, nil, nil)
		inject(p.net, p.net.B, header.TCPFields{SrcPort: 1234, DstPort: 4321, Seq: 77, Flags: header.TCPFlagRST, Window: 1}, nil, nil)
		p.net.Flush()
		if len(*log) != 2 {
			t.Fatalf("sent %+v, want two RSTs", *log)
		}
		if r := (*log)[0].s; r.flags != header.TCPFlagRST || r.seq != 999 {
			t.Errorf("RST for an ACK: %+v", r)
		}
		if r := (*log)[1].s; r.flags != header.TCPFlagRST|header.TCPFlagACK || r.seq != 0 || r.ack != 78 {
			t.Errorf("RST for a SYN: %+v", r)
		}
	})
}

func TestZeroWindowProbing(t *testing.T) {
	p := newPair(t, 1, tcp.Options{ReceiveBuffer: 64 << 10}, plainLink(), plainLink(), 1<<20, 0, true)
	p.server.Hold = true
	log := recordAll(p.net)
	p.net.RunFor(10 * time.Second)
	// The receiver took nothing: exactly its buffer arrived, and the
	// sender probes with growing intervals (RFC 9293 §3.8.6.1).
	if got := tcp.BufferedForTest(p.server.Conn); got != 64<<10 {
		t.Fatalf("receiver holds %d octets, want its whole buffer", got)
	}
	var probes []tcp.Time
	for _, s := range *log {
		if s.from == "A" && s.s.n == 1 {
			probes = append(probes, s.at)
		}
	}
	if len(probes) < 4 {
		t.Fatalf("%d window probes in 10 s", len(probes))
	}
	for i := 2; i < len(probes); i++ {
		if probes[i].Sub(probes[i-1]) < probes[i-1].Sub(probes[i-2]) {
			t.Fatalf("probe intervals shrink: %v", probes)
		}
	}
	p.server.Release()
	if !p.net.Run(time.Minute, func() bool { return p.server.Recvd == 1<<20 && p.client.Closed && p.server.Closed }) {
		t.Fatalf("after the window opened: %d received", p.server.Recvd)
	}
	p.check(t, "zero window")
}

func TestRTOBackoffAndTimeout(t *testing.T) {
	p := established(t, tcp.Options{Retries: 5, RTOMin: 200 * time.Millisecond})
	// Cut the link from the client.
	p.net.AB.Drop = func([]byte) bool { return true }
	log := recordAll(p.net)
	p.client.Total = 1000
	p.client.Pump()
	if !p.net.Run(5*time.Minute, func() bool { return p.client.Closed }) {
		t.Fatal("connection never timed out")
	}
	if !errors.Is(p.client.Err, tcp.ErrTimedOut) {
		t.Fatalf("ended with %v", p.client.Err)
	}
	var at []tcp.Time
	for _, s := range *log {
		if s.from == "A" && s.s.n > 0 {
			at = append(at, s.at)
		}
	}
	// The original and 5 retransmissions, each interval twice the last
	// (RFC 6298 §5.5).
	if len(at) != 6 {
		t.Fatalf("%d transmissions, want 6", len(at))
	}
	for i := 2; i < len(at); i++ {
		d0, d1 := at[i-1].Sub(at[i-2]), at[i].Sub(at[i-1])
		if d1 < 2*d0-time.Millisecond || d1 > 2*d0+time.Millisecond {
			t.Fatalf("retransmission intervals %v then %v: not doubling", d0, d1)
		}
	}
	// RFC 6298 §2.1: before any measurement the first RTO is 1 s; here
	// the handshake gave a sample, so it is max(RTOMin, SRTT+4*RTTVAR).
	if first := at[1].Sub(at[0]); first < 200*time.Millisecond || first > time.Second {
		t.Fatalf("first RTO %v", first)
	}
}

func TestSynRetriesTimeout(t *testing.T) {
	a, b := newStack(t, tcp.Options{SynRetries: 3}), newStack(t, tcp.Options{})
	n := sim.New(1, a, b, &sim.Link{Delay: time.Millisecond, Drop: func([]byte) bool { return true }}, plainLink())
	log := recordAll(n)
	e := &sim.Endpoint{}
	c, _ := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), e)
	if !n.Run(time.Minute, func() bool { return e.Closed }) || !errors.Is(c.Err(), tcp.ErrTimedOut) {
		t.Fatalf("SYN never answered: %v", c.Err())
	}
	// 1 s, 2 s, 4 s: the initial RTO is 1 s (RFC 6298 §2.1).
	var at []tcp.Time
	for _, s := range *log {
		if s.s.flags == header.TCPFlagSYN {
			at = append(at, s.at)
		}
	}
	if len(at) != 4 || at[1].Sub(at[0]) != time.Second || at[3].Sub(at[2]) != 4*time.Second {
		t.Fatalf("SYNs at %v", at)
	}
}

// SACK recovery: three segments lost in one window are all repaired by
// fast retransmit driven by SACK, with no retransmission timeout and no
// needless retransmission (RFC 6675).
func TestSACKRecovery(t *testing.T) {
	for _, cc := range tcp.CongestionControls() {
		p := newPair(t, 1, tcp.Options{CongestionControl: cc}, plainLink(), plainLink(), 0, 0, false)
		if !p.net.Run(time.Second, func() bool { return p.server.Established }) {
			t.Fatal("no handshake")
		}
		dropped := map[uint32]bool{}
		count := 0
		p.net.AB.Drop = func(b []byte) bool {
			s := decode(b)
			if s.n == 0 {
				return false
			}
			count++
			if (count == 3 || count == 5 || count == 8) && !dropped[s.seq] {
				dropped[s.seq] = true
				return true
			}
			return false
		}
		p.client.Total = 200 << 10
		p.client.Pump()
		if !p.net.Run(time.Minute, func() bool { return p.server.Recvd == 200<<10 }) {
			t.Fatalf("%s: transfer stuck at %d", cc, p.server.Recvd)
		}
		p.check(t, "SACK recovery")
		st := p.cconn.Stats
		if st.RTOs != 0 || st.Retransmits != 3 || st.FastRetransmits != 1 {
			t.Fatalf("%s: %d RTOs, %d retransmissions, %d recoveries; want 0, 3, 1", cc, st.RTOs, st.Retransmits, st.FastRetransmits)
		}
	}
}

// Without SACK, NewReno's partial ACKs repair several losses in a window,
// one per round trip (RFC 6582).
func TestNewRenoWithoutSACK(t *testing.T) {
	p := newPair(t, 1, tcp.Options{DisableSACK: true, CongestionControl: "newreno"}, plainLink(), plainLink(), 0, 0, false)
	if !p.net.Run(time.Second, func() bool { return p.server.Established }) {
		t.Fatal("no handshake")
	}
	count := 0
	p.net.AB.Drop = func(b []byte) bool {
		if decode(b).n == 0 {
			return false
		}
		count++
		return count == 3 || count == 6
	}
	p.client.Total = 200 << 10
	p.client.Pump()
	if !p.net.Run(time.Minute, func() bool { return p.server.Recvd == 200<<10 }) {
		t.Fatalf("transfer stuck at %d", p.server.Recvd)
	}
	p.check(t, "NewReno")
	if st := p.cconn.Stats; st.RTOs != 0 || st.Retransmits != 2 || st.FastRetransmits != 1 {
		t.Fatalf("%d RTOs, %d retransmissions, %d recoveries; want 0, 2, 1", st.RTOs, st.Retransmits, st.FastRetransmits)
	}
}

// PAWS (RFC 7323 §5): an old duplicate whose timestamp is older than
// TS.Recent is dropped even though its sequence numbers look fine.
func TestPAWS(t *testing.T) {
	p := established(t, tcp.Options{})
	p.client.Total = 10000
	p.client.Pump()
	if !p.net.Run(time.Second, func() bool { return p.server.Recvd == 10000 }) {
		t.Fatal("no data")
	}
	srv := p.server.Conn
	var o header.TCPOptions
	o.HasTimestamp = true
	o.TSVal = tcp.TSRecentForTest(srv) - 1000
	payload := make([]byte, 100)
	sim.FillPattern(99, 0, payload) // wrong data: must not be delivered
	inject(p.net, p.net.B, header.TCPFields{SrcPort: p.cconn.ID().LocalPort, DstPort: port, Seq: uint32(tcp.RcvNxtForTest(srv)),
		Ack: uint32(tcp.SndNxtForTest(srv)), Flags: header.TCPFlagACK, Window: 1000}, &o, payload)
	if srv.Stats.PAWSDrops != 1 || p.server.Recvd != 10000 {
		t.Fatalf("PAWS drops %d, received %d", srv.Stats.PAWSDrops, p.server.Recvd)
	}
	// The same segment with a current timestamp is data.
	o.TSVal = tcp.TSRecentForTest(srv) + 1
	inject(p.net, p.net.B, header.TCPFields{SrcPort: p.cconn.ID().LocalPort, DstPort: port, Seq: uint32(tcp.RcvNxtForTest(srv)),
		Ack: uint32(tcp.SndNxtForTest(srv)), Flags: header.TCPFlagACK, Window: 1000}, &o, payload)
	if p.server.Recvd != 10100 {
		t.Fatalf("fresh segment not taken: %d", p.server.Recvd)
	}
}

// Sequence numbers wrap inside the transfer, in both directions, under
// loss and reordering.
func TestSequenceWrap(t *testing.T) {
	for _, isn := range []uint32{0xffffffff - 5000, 0x7fffffff - 3000, 0xfffffff0} {
		a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
		a.SetISNForTest(isn)
		b.SetISNForTest(isn - 100000)
		lossy := func() *sim.Link { return &sim.Link{Delay: 2 * time.Millisecond, Loss: 0.02, Reorder: 0.02} }
		n := sim.New(7, a, b, lossy(), lossy())
		srv := &sim.Endpoint{Seed: 2, PeerSeed: 1, Total: 500000, CloseWhenDone: true}
		cli := &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: 500000, CloseWhenDone: true}
		if _, err := b.Listen(netip.Addr{}, port, srv); err != nil {
			t.Fatal(err)
		}
		c, _ := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), cli)
		cli.Conn = c
		if !n.Run(10*time.Minute, func() bool { return cli.Closed && srv.Closed }) {
			t.Fatalf("ISN %#x: recvd %d/%d", isn, cli.Recvd, srv.Recvd)
		}
		if cli.Corrupt != nil || srv.Corrupt != nil || cli.Recvd != 500000 || srv.Recvd != 500000 || cli.Err != nil || srv.Err != nil {
			t.Fatalf("ISN %#x: corrupt %v %v, recvd %d %d, err %v %v", isn, cli.Corrupt, srv.Corrupt, cli.Recvd, srv.Recvd, cli.Err, srv.Err)
		}
	}
}

// When the SYN queue is full, SYN cookies carry the handshake; the
// connections they make work, with window scaling and SACK recovered
// from the timestamp.
func TestSYNCookies(t *testing.T) {
	o := tcp.Options{SynBacklog: 1}
	a, b := newStack(t, o), newStack(t, o)
	n := sim.New(1, a, b, plainLink(), plainLink())
	var srvs []*sim.Endpoint
	l, err := b.Listen(netip.Addr{}, port, nil)
	if err != nil {
		t.Fatal(err)
	}
	var clis []*sim.Endpoint
	for i := 0; i < 5; i++ {
		e := &sim.Endpoint{Seed: uint64(10 + i), Total: 300000, CloseWhenDone: true}
		c, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), e)
		if err != nil {
			t.Fatal(err)
		}
		e.Conn = c
		clis = append(clis, e)
	}
	if !n.Run(time.Second, func() bool { return l.Pending() == 5 }) {
		t.Fatalf("%d connections established", l.Pending())
	}
	for c := l.Accept(); c != nil; c = l.Accept() {
		var seed uint64
		for _, ce := range clis {
			if ce.Conn.ID().LocalPort == c.ID().RemotePort {
				seed = ce.Seed
			}
		}
		e := &sim.Endpoint{PeerSeed: seed, Conn: c, CloseWhenDone: true}
		c.SetHandler(e)
		srvs = append(srvs, e)
		e.Pump()
		e.Event(c, tcp.EventReadable)
	}
	// Accept order follows the clients' order (one segment each).
	if !n.Run(time.Minute, func() bool {
		for _, e := range srvs {
			if e.Recvd != 300000 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("cookie connections did not carry their data")
	}
	for _, e := range srvs {
		if e.Corrupt != nil {
			t.Fatal(e.Corrupt)
		}
	}
	st := b.Stats
	if st.SYNCookiesSent != 4 || st.SYNCookiesValid != 4 {
		t.Fatalf("cookies sent %d valid %d, want 4 and 4", st.SYNCookiesSent, st.SYNCookiesValid)
	}
	if c := srvs[1].Conn; !tcp.SACKForTest(c) || tcp.SndWSForTest(c) != 7 {
		t.Fatalf("cookie connection lost SACK (%v) or the peer's window scale (%d)", tcp.SACKForTest(c), tcp.SndWSForTest(c))
	}
	// A forged ACK to the listener is not a connection.
	inject(n, n.B, header.TCPFields{SrcPort: 999, DstPort: port, Seq: 1, Ack: 12345, Flags: header.TCPFlagACK, Window: 1}, nil, nil)
	if b.Stats.SYNCookiesFailed != 1 || b.Conns() != 5 {
		t.Fatalf("forged cookie: failed %d conns %d", b.Stats.SYNCookiesFailed, b.Conns())
	}
}

func TestKeepalive(t *testing.T) {
	o := tcp.Options{KeepAlive: true, KeepIdle: 10 * time.Second, KeepInterval: time.Second, KeepCount: 3}
	p := established(t, o)
	log := recordAll(p.net)
	// The peer answers: the connection lives on.
	p.net.RunFor(35 * time.Second)
	probes := 0
	for _, s := range *log {
		if s.from == "A" && s.s.n == 0 && s.s.seq == uint32(tcp.SndNxtForTest(p.cconn))-1 {
			probes++
		}
	}
	if p.cconn.State() != tcp.StateEstablished || probes < 3 {
		t.Fatalf("with an answering peer: %v after %d probes", p.cconn.State(), probes)
	}
	// The peer goes silent: after KeepCount unanswered probes, timeout.
	p.net.BA.Drop = func([]byte) bool { return true }
	if !p.net.Run(time.Minute, func() bool { return p.client.Closed }) || !errors.Is(p.client.Err, tcp.ErrTimedOut) {
		t.Fatalf("silent peer: %v %v", p.cconn.State(), p.client.Err)
	}
}

func TestDelayedACK(t *testing.T) {
	p := established(t, tcp.Options{QuickACKs: 1})
	log := recordAll(p.net)
	// One small segment after quick-ACK mode ended: its ACK waits for the
	// delayed-ACK timer; two full segments are acknowledged at once.
	p.client.Total = 10
	p.client.Pump()
	p.net.RunFor(100 * time.Millisecond)
	*log = nil
	p.client.Total = 20
	p.client.Pump()
	p.net.RunFor(100 * time.Millisecond)
	var dataAt, ackAt tcp.Time
	for _, s := range *log {
		if s.from == "A" && s.s.n > 0 {
			dataAt = s.at
		}
		if s.from == "B" && s.s.n == 0 && dataAt != 0 && ackAt == 0 {
			ackAt = s.at
		}
	}
	if d := ackAt.Sub(dataAt); d < 44*time.Millisecond || d > 46*time.Millisecond {
		t.Fatalf("ACK after %v, want the 40 ms delay plus 5 ms of link", d)
	}
	*log = nil
	p.client.Total = 20 + 2*1448
	p.client.Pump()
	p.net.RunFor(100 * time.Millisecond)
	var acks []tcp.Time
	for _, s := range *log {
		if s.from == "B" {
			acks = append(acks, s.at)
		}
	}
	if len(acks) != 1 || acks[0].Sub((*log)[0].at) > 6*time.Millisecond {
		t.Fatalf("two full segments: ACKs %v", acks)
	}
}

// filler produces its stream in place in the send buffer (as MPA builds
// FPDUs there), Total octets, then closes.
type filler struct {
	sim.Endpoint
	filled uint64
	calls  int
}

// Event records the end only: the data comes from Fill, never Write.
func (f *filler) Event(c *tcp.Conn, ev tcp.Event) {
	if ev == tcp.EventClosed {
		f.Closed, f.Err = true, c.Err()
	}
}

func (f *filler) Fill(c *tcp.Conn, dst []byte) int {
	f.calls++
	n := min(uint64(len(dst)), f.Total-f.filled)
	sim.FillPattern(f.Seed, f.filled, dst[:n])
	f.filled += n
	if f.filled == f.Total && f.CloseWhenDone {
		f.CloseWhenDone = false
		c.Close()
	}
	return int(n)
}

// The transmitter pulls from a Filler when the window allows, and
// retransmissions under loss re-read what it built.
func TestFillerBuildsInPlace(t *testing.T) {
	a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
	lossy := &sim.Link{Delay: 3 * time.Millisecond, Loss: 0.03, Reorder: 0.02}
	n := sim.New(3, a, b, lossy, plainLink())
	srv := &sim.Endpoint{PeerSeed: 5, CloseWhenDone: true}
	if _, err := b.Listen(netip.Addr{}, port, srv); err != nil {
		t.Fatal(err)
	}
	f := &filler{Endpoint: sim.Endpoint{Seed: 5, Total: 3 << 20, CloseWhenDone: true}}
	c, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), f)
	if err != nil {
		t.Fatal(err)
	}
	if !n.Run(10*time.Minute, func() bool { return srv.Closed && f.Closed }) {
		t.Fatalf("received %d of %d", srv.Recvd, f.Total)
	}
	if srv.Corrupt != nil || srv.Recvd != f.Total || f.Sent != 0 {
		t.Fatalf("corrupt %v, received %d, written %d", srv.Corrupt, srv.Recvd, f.Sent)
	}
	if c.Stats.Retransmits == 0 || f.calls < 10 {
		t.Fatalf("%d retransmissions, %d Fill calls: the test did not exercise what it should", c.Stats.Retransmits, f.calls)
	}
}

// A new SYN may take over a 4-tuple still in TIME-WAIT when it is beyond
// the old connection (RFC 9293 §3.10.7.4 note, RFC 6191).
func TestTimeWaitReuse(t *testing.T) {
	a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
	n := sim.New(1, a, b, plainLink(), plainLink())
	srv := &sim.Endpoint{Seed: 2, PeerSeed: 1, Total: 1000, CloseWhenDone: true}
	if _, err := b.Listen(netip.Addr{}, port, srv); err != nil {
		t.Fatal(err)
	}
	// The server closes first, so the server's side lingers in TIME-WAIT.
	cli := &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: 1000}
	c, _ := a.Connect(n.Now, n.A.Addr, 4000, netip.AddrPortFrom(n.B.Addr, port), cli)
	cli.Conn = c
	n.Run(time.Second, func() bool { return cli.PeerClosed })
	c.Close()
	if !n.Run(time.Second, func() bool { return cli.Closed && srv.Conn.State() == tcp.StateTimeWait }) {
		t.Fatalf("states %v %v", c.State(), srv.Conn.State())
	}
	// Same 4-tuple again, at once.
	old := srv.Conn
	cli2 := &sim.Endpoint{Seed: 3, PeerSeed: 4, Total: 5000}
	c2, err := a.Connect(n.Now.Add(time.Second), n.A.Addr, 4000, netip.AddrPortFrom(n.B.Addr, port), cli2)
	if err != nil {
		t.Fatal(err)
	}
	cli2.Conn = c2
	if !n.Run(time.Second, func() bool { return cli2.Established && srv.Conn != old && srv.Recvd == 1000+5000 }) {
		t.Fatalf("new connection over TIME-WAIT: %v, server received %d", c2.State(), srv.Recvd)
	}
	if old.State() != tcp.StateClosed {
		t.Fatalf("the TIME-WAIT connection is %v", old.State())
	}
}

func TestIPv6(t *testing.T) {
	a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
	n := sim.New(1, a, b, &sim.Link{Delay: time.Millisecond, Loss: 0.01}, plainLink())
	n.A.Addr, n.B.Addr = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	srv := &sim.Endpoint{Seed: 2, PeerSeed: 1, Total: 100000, CloseWhenDone: true}
	if _, err := b.Listen(netip.Addr{}, port, srv); err != nil {
		t.Fatal(err)
	}
	cli := &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: 200000, CloseWhenDone: true}
	c, _ := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), cli)
	cli.Conn = c
	if !n.Run(time.Minute, func() bool { return cli.Closed && srv.Closed }) || cli.Corrupt != nil || srv.Corrupt != nil || srv.Recvd != 200000 {
		t.Fatalf("IPv6 transfer: %d/%d, %v %v", srv.Recvd, cli.Recvd, cli.Corrupt, srv.Corrupt)
	}
	if c.MSS() != 1500-60-12 {
		t.Fatalf("IPv6 MSS %d", c.MSS())
	}
}
