package tcp

// Regressions from a review of the engine: each test failed before its fix.

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/header"
)

var (
	rvLocal  = netip.MustParseAddr("10.0.0.1")
	rvRemote = netip.MustParseAddr("10.0.0.2")
)

type rvHandler struct {
	events []Event
	got    int
}

func (h *rvHandler) Receive(c *Conn, b []byte) int { h.got += len(b); return len(b) }
func (h *rvHandler) Event(c *Conn, ev Event)       { h.events = append(h.events, ev) }

type rvSeg struct {
	flags    uint8
	seq, ack Seq
	n        int
	wnd      uint16
	opts     header.TCPOptions
}

func rvDrain(s *Stack, now Time) []rvSeg {
	var out []rvSeg
	b := make([]byte, 70000)
	for {
		n, _, _ := s.Output(now, b)
		if n == 0 {
			return out
		}
		t := header.TCP(b[:n])
		r := rvSeg{flags: t.Flags(), seq: Seq(t.Seq()), ack: Seq(t.Ack()), n: len(t.Payload()), wnd: t.Window()}
		header.ParseTCPOptions(t.Options(), &r.opts)
		out = append(out, r)
	}
}

func rvIn(s *Stack, now Time, lport, rport uint16, seq, ack Seq, flags uint8, wnd uint16, payload []byte, o *header.TCPOptions) {
	seg := Segment{SrcPort: rport, DstPort: lport, Seq: seq, Ack: ack, Flags: flags, Window: wnd, Payload: payload}
	if o != nil {
		seg.Opts = *o
	}
	s.InputSegment(now, rvRemote, rvLocal, &seg)
}

func rvStack(t *testing.T, o Options) *Stack {
	o.Secret = [16]byte{1, 2, 3}
	s, err := NewStack(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Active open to a hand-driven peer, no options.
func rvClient(t *testing.T, o Options, peerWnd uint16) (*Stack, *Conn, *rvHandler, Seq) {
	s := rvStack(t, o)
	h := &rvHandler{}
	c, err := s.Connect(0, rvLocal, 40000, netip.AddrPortFrom(rvRemote, 80), h)
	if err != nil {
		t.Fatal(err)
	}
	out := rvDrain(s, 0)
	if len(out) != 1 || out[0].flags != header.TCPFlagSYN {
		t.Fatalf("syn: %+v", out)
	}
	irs := Seq(5000)
	rvIn(s, 1, 40000, 80, irs, out[0].seq+1, header.TCPFlagSYN|header.TCPFlagACK, peerWnd, nil, &header.TCPOptions{MSS: 1000, HasMSS: true})
	rvDrain(s, 1)
	if c.State() != StateEstablished {
		t.Fatal("not established")
	}
	return s, c, h, irs + 1
}

func TestProbeOctetTakenByThePeer(t *testing.T) {
	s, c, _, pseq := rvClient(t, Options{}, 1000)
	data := make([]byte, 3000)
	c.Write(data)
	out := rvDrain(s, 2)
	if len(out) != 1 || out[0].n != 1000 {
		t.Fatalf("first flight %+v", out)
	}
	una := out[0].seq + 1000
	// Peer ACKs all with a zero window.
	rvIn(s, 3, 40000, 80, pseq, una, header.TCPFlagACK, 0, nil, nil)
	rvDrain(s, 3)
	// Persist timer fires: probe.
	now := Time(3)
	var probe rvSeg
	for i := 0; i < 10; i++ {
		nt, ok := s.NextTimer()
		if !ok {
			t.Fatal("no persist timer")
		}
		now = nt
		s.Advance(now)
		o := rvDrain(s, now)
		if len(o) > 0 {
			probe = o[0]
			break
		}
	}
	t.Logf("probe %+v sndMax=%d sndUna=%d", probe, c.sndMax, c.sndUna)
	// The peer's window has opened meanwhile (its update was lost): it takes the probe octet.
	rvIn(s, now+1, 40000, 80, pseq, probe.seq+Seq(probe.n), header.TCPFlagACK, 10000, nil, nil)
	o := rvDrain(s, now+1)
	t.Logf("after probe ACK: %+v sndUna=%d sndWnd=%d", o, c.sndUna, c.sndWnd)
	sentData := false
	for _, x := range o {
		if x.n > 0 {
			sentData = true
		}
	}
	if !sentData {
		t.Errorf("ACK of the probe octet (beyond SND.MAX) discarded; window update lost; nothing sent")
	}
}

func TestCookieAfterCount256(t *testing.T) {
	s := rvStack(t, Options{})
	id := FourTuple{LocalAddr: rvLocal, RemoteAddr: rvRemote, LocalPort: 80, RemotePort: 40000}
	for _, now := range []Time{Time(10 * time.Second), Time(255 * 64 * time.Second), Time(256*64*time.Second + time.Second), Time(5 * time.Hour)} {
		ck := s.makeCookie(now, id, 12345, 2)
		idx, ok := s.checkCookie(now+1, id, 12345, ck)
		if !ok || idx != 2 {
			t.Errorf("cookie made and checked at %v rejected (idx=%d ok=%v)", time.Duration(now), idx, ok)
		}
	}
}

func TestRetransmittedSYNGetsSYNACK(t *testing.T) {
	s := rvStack(t, Options{})
	h := &rvHandler{}
	if _, err := s.Listen(netip.Addr{}, 80, h); err != nil {
		t.Fatal(err)
	}
	rvIn(s, 0, 80, 40000, 1000, 0, header.TCPFlagSYN, 65535, nil, nil)
	o := rvDrain(s, 0)
	t.Logf("first: %+v", o)
	rvIn(s, 10, 80, 40000, 1000, 0, header.TCPFlagSYN, 65535, nil, nil)
	o = rvDrain(s, 10)
	t.Logf("on duplicate SYN: %+v", o)
	if len(o) == 0 || o[0].flags != header.TCPFlagSYN|header.TCPFlagACK {
		t.Errorf("duplicate SYN in SYN-RECEIVED not answered with a SYN-ACK (the SynRcvd branch in input is dead)")
	}
}

func TestAcceptOverflowNoEventsAfterClosed(t *testing.T) {
	s := rvStack(t, Options{AcceptBacklog: 1})
	h := &rvHandler{}
	s.Listen(netip.Addr{}, 80, h)
	for i, port := range []uint16{40000, 40001} {
		rvIn(s, 0, 80, port, 1000, 0, header.TCPFlagSYN, 65535, nil, nil)
		o := rvDrain(s, 0)
		rvIn(s, 1, 80, port, 1001, o[0].seq+1, header.TCPFlagACK|header.TCPFlagFIN, 65535, []byte("x"), nil)
		rvDrain(s, 1)
		t.Logf("conn %d events %v", i, h.events)
	}
	// The second SYN finds the accept queue full and is answered with a
	// cookie: what the test exercises, so say so if that changes.
	if s.Stats.SYNCookiesSent != 1 {
		t.Errorf("SYN cookies sent %d, want 1: the test no longer reaches the full accept queue", s.Stats.SYNCookiesSent)
	}
	noEventsAfterClosed(t, h.events)
}

// noEventsAfterClosed fails when a Handler was told anything after
// EventClosed.
func noEventsAfterClosed(t *testing.T, ev []Event) {
	t.Helper()
	for i, e := range ev {
		if e == EventClosed && i != len(ev)-1 {
			t.Errorf("events after EventClosed: %v", ev)
		}
	}
}

func TestHandshakeACKAfterSYNACKTimeout(t *testing.T) {
	s := rvStack(t, Options{})
	h := &rvHandler{}
	s.Listen(netip.Addr{}, 80, h)
	rvIn(s, 0, 80, 40000, 1000, 0, header.TCPFlagSYN, 65535, nil, nil)
	o := rvDrain(s, 0)
	nt, _ := s.NextTimer()
	s.Advance(nt) // RTO: SND.NXT back to ISS, SYN-ACK not yet re-sent
	rvIn(s, nt, 80, 40000, 1001, o[0].seq+1, header.TCPFlagACK, 65535, nil, nil)
	c := s.Lookup(FourTuple{LocalAddr: rvLocal, RemoteAddr: rvRemote, LocalPort: 80, RemotePort: 40000})
	if c == nil {
		t.Fatalf("valid handshake ACK after SYN-ACK RTO: no connection, ctl=%d", len(s.ctl))
	}
	if c.State() != StateEstablished {
		t.Errorf("valid handshake ACK rejected after SYN-ACK RTO (state %v), ctl=%d", c.State(), len(s.ctl))
	}
}

func TestAcceptOverflowAfterHandshake(t *testing.T) {
	s := rvStack(t, Options{AcceptBacklog: 1})
	h := &rvHandler{}
	s.Listen(netip.Addr{}, 80, h)
	var isn []Seq
	for _, port := range []uint16{40000, 40001} {
		rvIn(s, 0, 80, port, 1000, 0, header.TCPFlagSYN, 65535, nil, nil)
		o := rvDrain(s, 0)
		isn = append(isn, o[0].seq)
	}
	for i, port := range []uint16{40000, 40001} {
		rvIn(s, 1, 80, port, 1001, isn[i]+1, header.TCPFlagACK|header.TCPFlagFIN, 65535, []byte("x"), nil)
		rvDrain(s, 1)
	}
	t.Logf("events %v conns=%d", h.events, s.Conns())
	noEventsAfterClosed(t, h.events)
}

// A peer that closes its window while data is in flight and then keeps
// answering probes with a zero window must not be timed out: the data is
// waiting for room, not lost.
func TestZeroWindowWithDataInFlightDoesNotTimeOut(t *testing.T) {
	s, c, _, pseq := rvClient(t, Options{Retries: 5}, 4000)
	c.Write(make([]byte, 3000))
	out := rvDrain(s, 2)
	if len(out) == 0 {
		t.Fatal("nothing sent")
	}
	first := out[0].seq
	// The peer takes 500 octets and closes its window: 2500 in flight.
	rvIn(s, 3, 40000, 80, pseq, first+500, header.TCPFlagACK, 0, nil, nil)
	rvDrain(s, 3)
	now := Time(3)
	for i := 0; i < 40; i++ {
		nt, ok := s.NextTimer()
		if !ok {
			t.Fatalf("round %d: no timer", i)
		}
		now = nt
		s.Advance(now)
		rvDrain(s, now)
		if c.State() != StateEstablished {
			t.Fatalf("round %d: %v (%v): timed out while the peer answered", i, c.State(), c.Err())
		}
		rvIn(s, now, 40000, 80, pseq, first+500, header.TCPFlagACK, 0, nil, nil)
		rvDrain(s, now)
	}
	// The window opens: the rest goes.
	rvIn(s, now+1, 40000, 80, pseq, first+500, header.TCPFlagACK, 10000, nil, nil)
	o := rvDrain(s, now+1)
	n := 0
	for _, x := range o {
		n += x.n
	}
	if n != 2500 {
		t.Fatalf("after the window opened %d octets went out, want 2500", n)
	}
}

// Out-of-order segments and the one that fills their hole arrive in one
// batch: one ACK goes out, not one per out-of-order segment all carrying
// the same new cumulative ACK. After the peer's FIN those extra ACKs
// reached a kernel that had closed, and it answered each with a RST
// (TestKernelPeerImpaired/engine-server/reorder in CI).
func TestHoleFilledInBatchOneACK(t *testing.T) {
	s, c, h, pseq := rvClient(t, Options{}, 10000)
	una := c.sndNxt
	p := make([]byte, 1000)
	for i := 1; i <= 3; i++ {
		rvIn(s, 2, 40000, 80, pseq+Seq(i*1000), una, header.TCPFlagACK, 10000, p, nil)
	}
	rvIn(s, 2, 40000, 80, pseq, una, header.TCPFlagACK, 10000, p, nil)
	rvIn(s, 2, 40000, 80, pseq+4000, una, header.TCPFlagACK|header.TCPFlagFIN, 10000, nil, nil)
	out := rvDrain(s, 2)
	if len(out) != 1 || out[0].ack != pseq+4001 {
		t.Fatalf("want one ACK of %d, got %+v", pseq+4001, out)
	}
	if h.got != 4000 {
		t.Fatalf("received %d", h.got)
	}
}

// A window with many holes: every out-of-order segment is held, not only
// those of the first 32 ranges (the rest were dropped and sent again).
func TestManyHolesHeld(t *testing.T) {
	s, c, h, pseq := rvClient(t, Options{}, 10000)
	una := c.sndNxt
	p := make([]byte, 500)
	const holes = 200
	for k := 1; k <= holes; k++ {
		rvIn(s, 2, 40000, 80, pseq+Seq(2*k*len(p)), una, header.TCPFlagACK, 10000, p, nil)
	}
	if c.Stats.Dropped != 0 || c.Stats.OutOfOrder != holes {
		t.Fatalf("stats %+v", c.Stats)
	}
	// The holes: [0, 1000), then 500 octets after each segment.
	total := (2*holes + 1) * len(p)
	rvIn(s, 3, 40000, 80, pseq, una, header.TCPFlagACK, 10000, p, nil)
	for off := len(p); off < total; off += 2 * len(p) {
		rvIn(s, 3, 40000, 80, pseq+Seq(off), una, header.TCPFlagACK, 10000, p, nil)
	}
	if h.got != total || c.rcvNxt() != pseq+Seq(total) {
		t.Fatalf("delivered %d of %d", h.got, total)
	}
}

// unitFiller produces data in whole units, as MPA produces whole FPDUs: it
// writes nothing into space shorter than a unit.
type unitFiller struct {
	rvHandler
	unit, made int
	wide       bool // a dst had capacity beyond its length
}

func (f *unitFiller) Fill(c *Conn, dst []byte) int {
	if cap(dst) != len(dst) {
		// Room past len(dst) is not the filler's: MPA's Transmit fills
		// to the capacity, and in the send ring that ran into octets
		// not yet acknowledged.
		f.wide = true
	}
	n := len(dst) / f.unit * f.unit
	for i := range dst[:n] {
		dst[i] = byte(f.made + i)
	}
	f.made += n
	return n
}

// The free space before the send ring's end is shorter than a unit, with
// more free after the wrap: the filler still gets room, through a scratch
// buffer, instead of the connection waiting until everything in flight is
// acknowledged and the ring starts over (which waited out the peer's
// delayed ACK for the last segment).
func TestFillAcrossRingWrap(t *testing.T) {
	s := rvStack(t, Options{SendBuffer: 10500})
	f := &unitFiller{unit: 1000}
	c, err := s.Connect(0, rvLocal, 40000, netip.AddrPortFrom(rvRemote, 80), f)
	if err != nil {
		t.Fatal(err)
	}
	syn := rvDrain(s, 0)
	pseq := Seq(5000)
	rvIn(s, 1, 40000, 80, pseq, syn[0].seq+1, header.TCPFlagSYN|header.TCPFlagACK, 60000, nil, &header.TCPOptions{MSS: 1000, HasMSS: true})
	first := rvDrain(s, 1)
	sent := 0
	for _, x := range first {
		sent += x.n
	}
	if sent != 10000 {
		t.Fatalf("first flight %d octets", sent)
	}
	una := syn[0].seq + 1
	// Half is acknowledged: 5500 free, 500 of them before the ring's end.
	rvIn(s, 2, 40000, 80, pseq+1, una+5000, header.TCPFlagACK, 60000, nil, nil)
	more := rvDrain(s, 2)
	n := 0
	for _, x := range more {
		n += x.n
	}
	if n != 5000 {
		t.Fatalf("after the ACK of 5000: %d octets sent, want 5000 (ring %d held of %d)", n, c.snd.n, c.snd.size)
	}
	if f.wide {
		t.Error("Fill was given capacity beyond the room it may use")
	}
	// What crossed the wrap reads back as the filler wrote it.
	got := make([]byte, 5000)
	c.snd.read(got, una+10000)
	for i, b := range got {
		if b != byte(10000+i) {
			t.Fatalf("octet %d: %d, want %d", 10000+i, b, byte(10000+i))
		}
	}
}

// The peer's window has room for less than a segment, the connection sent
// that much (nothing was in flight), and the peer's ACK of it is lost: the
// retransmission timer must send it again. Sender SWS avoidance, which
// holds back a short segment of new data while octets are in flight,
// held back the retransmission as well (flight counts to SND.MAX, and the
// RTO had moved SND.NXT back to SND.UNA): the connection sent nothing
// more, every RTO, for as long as the peer kept it (xdpnet/TestTakeOver
// in CI: a small receive buffer, a lost window update, nine RTOs and the
// peer's keepalives answered but no data).
func TestRTORetransmitsShortSegment(t *testing.T) {
	s, c, _, pseq := rvClient(t, Options{}, 10000)
	c.Write(make([]byte, 20000))
	out := rvDrain(s, 2)
	sent := 0
	for _, x := range out {
		sent += x.n
	}
	if sent == 0 {
		t.Fatal("nothing sent")
	}
	first := out[0].seq
	// The peer takes everything and offers 300 octets more.
	rvIn(s, 3, 40000, 80, pseq, first+Seq(sent), header.TCPFlagACK, 300, nil, nil)
	out = rvDrain(s, 3)
	if len(out) != 1 || out[0].n != 300 || out[0].seq != first+Seq(sent) {
		t.Fatalf("into a 300-octet window with nothing in flight: %+v, want one segment of 300 at %d", out, first+Seq(sent))
	}
	short := out[0]
	// Its ACK is lost: the RTO sends it again.
	nt, ok := s.NextTimer()
	if !ok {
		t.Fatal("no retransmission timer")
	}
	s.Advance(nt)
	out = rvDrain(s, nt)
	if len(out) != 1 || out[0].seq != short.seq || out[0].n != 300 {
		t.Fatalf("at the RTO (%+v): %+v, want the 300 octets at %d again", c.Stats, out, short.seq)
	}
}

// The kernel went on sending after its state was read for a takeover (an
// ACK from its backlog, TCP small queues' tasklet): the peer acknowledges
// octets past SND.MAX as imported. They are octets the connection holds
// (up to the end of Send), so the ACK is taken; past them it is not. Before,
// every segment of the peer's was dropped for acknowledging what "was never
// sent", its data with it, and the connection hung (xdpnet/TestTakeOver:
// the kernel's last 3788 octets sent 10 ms into the handover, A's ACKs of
// them answered with bare ACKs for two minutes).
func TestImportTakesAnACKOfWhatTheKernelSentLate(t *testing.T) {
	for _, tc := range []struct {
		name string
		ack  Seq
		una  Seq // SND.UNA after it
	}{
		{"within what the kernel held", 1020, 1020},
		{"past it", 1021, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := rvStack(t, Options{})
			id := FourTuple{LocalAddr: rvLocal, RemoteAddr: rvRemote, LocalPort: 40000, RemotePort: 80}
			h := &rvHandler{}
			// 20 octets held, 10 of them sent as read; the peer's window
			// holds only those 10.
			st := Imported{ID: id, SndUna: 1000, SndNxt: 1010, Send: make([]byte, 20), RcvNxt: 5000,
				SndWnd: 10, SndWl1: 4999, MaxSndWnd: 1000, PeerMSS: 1000, RcvWnd: 65535, RcvWup: 5000}
			c, err := s.Import(0, st, h)
			if err != nil {
				t.Fatal(err)
			}
			rvDrain(s, 1)
			if c.sndMax != 1010 {
				t.Fatalf("SND.MAX %d after the import, want 1010 (the peer's window)", c.sndMax)
			}
			// The peer holds 1000..1020 (the kernel sent 1010..1020 late),
			// and the peer's data comes with its ACK.
			rvIn(s, 2, 40000, 80, 5000, tc.ack, header.TCPFlagACK, 1000, []byte("abcd"), nil)
			rvDrain(s, 2)
			if c.sndUna != tc.una {
				t.Fatalf("SND.UNA %d after the peer's ACK of %d, want %d", c.sndUna, tc.ack, tc.una)
			}
			want := 4
			if tc.una == 1000 {
				want = 0 // an unacceptable ACK: the segment is dropped
			}
			if h.got != want {
				t.Fatalf("%d octets of the peer's taken, want %d", h.got, want)
			}
		})
	}
}
