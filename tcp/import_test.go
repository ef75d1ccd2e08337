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

// importRun is one handover: B's connection is exported in the middle of
// a lossy transfer both ways, with octets queued in every place (B's
// unread receive data, its sent-unacknowledged and unsent data, A's data
// in flight), dropped from B's stack without a word, and imported into a
// new stack, the way the daemon takes a kernel connection over.
type importRun struct {
	n        *sim.Network
	srv, cli *sim.Endpoint
	old, new *tcp.Conn
	// tsBefore is the last TSval B sent before the handover; tsBack
	// counts B's segments after it with an older one.
	tsBefore uint32
	tsBack   int
	handed   bool
}

func runImport(t *testing.T, seed uint64, link func() *sim.Link, up, down uint64, o tcp.Options) *importRun {
	t.Helper()
	a, b := newStack(t, o), newStack(t, o)
	r := &importRun{n: sim.New(seed, a, b, link(), link())}
	n := r.n
	n.Tap = func(from *sim.Host, seg []byte) {
		h := header.TCP(seg)
		if from != n.B {
			return
		}
		var opts header.TCPOptions
		if !header.ParseTCPOptions(h.Options(), &opts) || !opts.HasTimestamp {
			return
		}
		if !r.handed {
			r.tsBefore = opts.TSVal
		} else if int32(opts.TSVal-r.tsBefore) < 0 {
			r.tsBack++
		}
	}
	r.srv = &sim.Endpoint{Seed: 2, PeerSeed: 1, Total: down, CloseWhenDone: true}
	l, err := b.Listen(netip.Addr{}, 6000, r.srv)
	if err != nil {
		t.Fatal(err)
	}
	r.cli = &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: up, CloseWhenDone: true}
	c, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, 6000), r.cli)
	if err != nil {
		t.Fatal(err)
	}
	r.cli.Conn = c
	if !n.Run(10*time.Second, func() bool { return r.srv.Recvd > up/4 && r.cli.Recvd > down/4 }) {
		t.Fatalf("transfer did not start: %d %d", r.srv.Recvd, r.cli.Recvd)
	}
	// B stops reading for a while: unread octets pile up in its buffer.
	r.srv.Hold = true
	n.RunFor(20 * time.Millisecond)
	r.old = b.Lookup(tcp.FourTuple{LocalAddr: n.B.Addr, RemoteAddr: n.A.Addr, LocalPort: 6000, RemotePort: c.ID().LocalPort})
	if r.old == nil {
		t.Fatal("server connection not found")
	}
	l.Accept()
	st, err := r.old.Export(n.Now)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Unread) == 0 || len(st.Send) == 0 || st.SndNxt == st.SndUna {
		t.Fatalf("handover with nothing queued: unread %d, send %d, in flight %d", len(st.Unread), len(st.Send), st.SndNxt.Sub(st.SndUna))
	}
	t.Logf("handover: %d unread, %d queued to send of which %d in flight, SND.UNA %d RCV.NXT %d",
		len(st.Unread), len(st.Send), st.SndNxt.Sub(st.SndUna), st.SndUna, st.RcvNxt)
	// The old stack forgets it without a segment, as a socket closed in
	// repair mode; the new one goes on after a pause (the handover).
	if err := b.Detach(r.old); err != nil {
		t.Fatal(err)
	}
	// Segments that reach B meanwhile are lost (the daemon queues them
	// for the engine; losing them is the harder case).
	n.B.Unplugged = true
	n.RunFor(2 * time.Millisecond)
	b2 := newStack(t, o)
	n.B.Stack, n.B.Unplugged = b2, false
	r.srv.Hold = false
	r.handed = true
	if r.new, err = b2.Import(n.Now, st, r.srv); err != nil {
		t.Fatal(err)
	}
	if !n.Run(2*time.Minute, func() bool { return r.srv.Recvd == up && r.cli.Recvd == down && r.srv.Closed && r.cli.Closed }) {
		t.Fatalf("after the handover: recvd %d/%d and %d/%d, closed %v %v (%v, %v)", r.srv.Recvd, up, r.cli.Recvd, down, r.srv.Closed, r.cli.Closed, r.srv.Err, r.cli.Err)
	}
	if r.srv.Corrupt != nil || r.cli.Corrupt != nil || r.srv.Err != nil || r.cli.Err != nil {
		t.Fatalf("corrupt %v %v, errors %v %v", r.srv.Corrupt, r.cli.Corrupt, r.srv.Err, r.cli.Err)
	}
	// Neither connection saw a reset (their Errs), and the new stack
	// met no segment it did not know. (A may reset late duplicates
	// that reach it after its connection ended: that is the link.)
	if b2.Stats.RSTsSent != 0 || b2.Stats.NoSocket != 0 {
		t.Fatalf("the importing stack reset or did not know segments: %+v", b2.Stats)
	}
	return r
}

// TestImportContinuesAConnection: a connection imported in the middle of
// a lossy, reordering transfer both ways goes on octet for octet, with
// octets queued in every place at the handover, and closes cleanly; the
// imported side's timestamps never go back, and it sends what the old
// one had in flight again at once rather than after a timeout.
func TestImportContinuesAConnection(t *testing.T) {
	// Send buffers small enough that neither side has written all its
	// stream (and queued its FIN) by the handover.
	o := tcp.Options{TimeWait: time.Second, SendBuffer: 256 << 10}
	for seed := uint64(1); seed <= 6; seed++ {
		lossy := func() *sim.Link {
			return &sim.Link{Delay: time.Millisecond, Jitter: 200 * time.Microsecond, Loss: 0.02, Reorder: 0.01, Duplicate: 0.01}
		}
		r := runImport(t, seed, lossy, 3<<20, 2<<20, o)
		if r.tsBack != 0 {
			t.Errorf("seed %d: %d segments after the handover went back in TSval", seed, r.tsBack)
		}
		if r.new.Stats.Retransmits == 0 {
			t.Errorf("seed %d: nothing sent again after the handover", seed)
		}
	}
	// On a clean link, what was in flight goes again at once: no RTO.
	r := runImport(t, 9, func() *sim.Link { return &sim.Link{Delay: time.Millisecond} }, 1<<20, 1<<20, o)
	if r.new.Stats.RTOs != 0 {
		t.Errorf("clean link: %d RTOs after the handover", r.new.Stats.RTOs)
	}
	// Without timestamps, SACK or window scaling.
	runImport(t, 11, func() *sim.Link { return &sim.Link{Delay: time.Millisecond, Loss: 0.01} }, 1<<20, 1<<20,
		tcp.Options{TimeWait: time.Second, SendBuffer: 256 << 10, DisableTimestamps: true, DisableSACK: true, DisableWindowScale: true})
}

// TestImportRefuses: state that cannot be a connection is refused with
// ErrImport, and a connection that exists with ErrPortInUse.
func TestImportRefuses(t *testing.T) {
	s := newStack(t, tcp.Options{})
	id := tcp.FourTuple{LocalAddr: netip.MustParseAddr("192.0.2.2"), RemoteAddr: netip.MustParseAddr("192.0.2.1"), LocalPort: 6000, RemotePort: 40000}
	good := tcp.Imported{ID: id, SndUna: 1000, SndNxt: 1010, Send: make([]byte, 20), RcvNxt: 5000, SndWnd: 65535, PeerMSS: 1460, RcvWnd: 65535, RcvWup: 5000}
	now := tcp.Time(time.Second)
	for name, mod := range map[string]func(*tcp.Imported){
		"no addresses":           func(st *tcp.Imported) { st.ID = tcp.FourTuple{} },
		"sent beyond the buffer": func(st *tcp.Imported) { st.SndNxt = 1100 },
		"SND.NXT below SND.UNA":  func(st *tcp.Imported) { st.SndNxt = 900 },
		"window scale 15":        func(st *tcp.Imported) { st.WindowScale, st.SndWS = true, 15 },
		"no MSS":                 func(st *tcp.Imported) { st.PeerMSS = 0 },
		"negative window":        func(st *tcp.Imported) { st.SndWnd = -1 },
	} {
		st := good
		mod(&st)
		if _, err := s.Import(now, st, nil); !errors.Is(err, tcp.ErrImport) {
			t.Errorf("%s: %v, want ErrImport", name, err)
		}
	}
	if s.Conns() != 0 {
		t.Fatalf("%d connections after refusals", s.Conns())
	}
	c, err := s.Import(now, good, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.State() != tcp.StateEstablished || c.Unacked() != 20 {
		t.Fatalf("state %v, %d unacknowledged", c.State(), c.Unacked())
	}
	if _, err := s.Import(now, good, nil); !errors.Is(err, tcp.ErrPortInUse) {
		t.Fatalf("second import: %v, want ErrPortInUse", err)
	}
}
