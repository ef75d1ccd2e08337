package tcp_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// A receiver reports a segment it got twice in a D-SACK: the first SACK
// block of its next ACK, below the cumulative ACK (RFC 2883).
func TestDSACKForDuplicates(t *testing.T) {
	ab := plainLink()
	ab.Duplicate = 0.05
	p := newPair(t, 4, tcp.Options{}, ab, plainLink(), 1<<20, 0, true)
	log := recordAll(p.net)
	if !p.net.Run(time.Minute, func() bool { return p.server.Recvd == 1<<20 }) {
		t.Fatalf("received %d", p.server.Recvd)
	}
	dsacks := 0
	for _, s := range *log {
		if s.from == "B" && s.s.opts.NumSACK > 0 && int32(s.s.opts.SACK[0].End-s.s.ack) <= 0 {
			dsacks++
		}
	}
	st := p.cconn.Stats
	if dsacks == 0 || st.DSACKsIn == 0 {
		t.Fatalf("D-SACKs sent %d, received %d (duplicated %d)", dsacks, st.DSACKsIn, ab.Stats.Duplicated)
	}
	// Duplicates the network made are no reason to undo anything.
	if st.SpuriousRecoveries != 0 || st.Retransmits != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Reordering without loss: every fast recovery is spurious. The D-SACKs of
// the needless retransmissions give the window back, and the duplicate
// threshold rises; far fewer recoveries follow than segments reordered,
// and every octet arrives intact.
func TestReorderingUndoesRecovery(t *testing.T) {
	link := func() *sim.Link {
		// A queue longer than the send buffer: nothing is dropped.
		return &sim.Link{Delay: 500 * time.Microsecond, Rate: 1e9, Queue: 8 << 20, Reorder: 0.005, ReorderDelay: 300 * time.Microsecond}
	}
	ab := link()
	p := newPair(t, 9, tcp.Options{}, ab, link(), 16<<20, 0, true)
	if !p.net.Run(time.Minute, func() bool { return p.done(true) }) {
		t.Fatalf("received %d", p.server.Recvd)
	}
	if p.client.Corrupt != nil || p.server.Corrupt != nil {
		t.Fatal("corrupt data")
	}
	st := p.cconn.Stats
	t.Logf("reordered %d segments, dropped %d: %+v", ab.Stats.Reordered, ab.Stats.QueueDrops, st)
	if st.SpuriousRecoveries == 0 || st.DSACKsIn == 0 {
		t.Fatalf("no recovery undone: %+v", st)
	}
	if st.FastRetransmits >= ab.Stats.Reordered {
		t.Fatalf("%d fast recoveries for %d reordered segments", st.FastRetransmits, ab.Stats.Reordered)
	}
	// A spurious recovery resends the segment it thought lost, not the
	// rest of the window: the late original makes every ACK until the
	// recovery point a partial ACK with nothing SACKed, which with SACK
	// in use is no sign of loss (resending at each: 506 for 68).
	if ab.Stats.QueueDrops != 0 || st.Retransmits > 2*ab.Stats.Reordered {
		t.Fatalf("%d retransmissions for %d reordered segments (%d dropped)", st.Retransmits, ab.Stats.Reordered, ab.Stats.QueueDrops)
	}
}

// A connection without a Handler (read with Read) whose receive gap is
// filled by a retransmission: filling the gap used to call the missing
// Handler.
func TestNilHandlerGapFilled(t *testing.T) {
	a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
	dropped := false
	ab := plainLink()
	ab.Drop = func(seg []byte) bool {
		if !dropped && len(header.TCP(seg).Payload()) > 0 {
			dropped = true
			return true
		}
		return false
	}
	n := sim.New(3, a, b, ab, plainLink())
	l, err := b.Listen(netip.Addr{}, 7000, nil)
	if err != nil {
		t.Fatal(err)
	}
	cli := &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: 64 << 10}
	c, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, 7000), cli)
	if err != nil {
		t.Fatal(err)
	}
	cli.Conn = c
	var srv *tcp.Conn
	if !n.Run(10*time.Second, func() bool {
		if srv == nil {
			srv = l.Accept()
		}
		return srv != nil && srv.Buffered() == 64<<10
	}) {
		t.Fatalf("server buffered %v, dropped %v", srv, dropped)
	}
	if !dropped {
		t.Fatal("no segment was dropped")
	}
	got := make([]byte, 64<<10)
	if k := srv.Read(got); k != len(got) {
		t.Fatalf("read %d", k)
	}
}
