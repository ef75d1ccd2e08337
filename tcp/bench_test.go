package tcp_test

import (
	"net/netip"
	"runtime"
	"testing"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/tcp"
)

// wire joins two stacks directly: every segment one outputs is input to
// the other at once, with no copy and no loss.
type wire struct {
	a, b     *tcp.Stack
	now      tcp.Time
	buf      []byte
	segments int
}

var addrA, addrB = netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")

// pump runs one round: everything A has to send, then everything B has.
// (A bulk sender always has more, so rounds are counted, not run to
// quiescence.)
func (w *wire) pump() {
	for _, s := range []*tcp.Stack{w.a, w.b} {
		for i := 0; i < 10000; i++ {
			n, src, dst := s.Output(w.now, w.buf)
			if n == 0 {
				break
			}
			w.segments++
			peer := w.b
			if s == w.b {
				peer = w.a
			}
			peer.Input(w.now, src, dst, w.buf[:n])
		}
	}
}

// bulk is a Handler that fills the send buffer in place with whatever is
// there (a Filler) and takes everything it receives.
type bulk struct{ got int }

func (h *bulk) Receive(c *tcp.Conn, b []byte) int { h.got += len(b); return len(b) }
func (h *bulk) Event(c *tcp.Conn, ev tcp.Event)   {}
func (h *bulk) Fill(c *tcp.Conn, dst []byte) int  { return len(dst) }

// idle is a Handler with nothing to send.
type idle struct{}

func (idle) Receive(c *tcp.Conn, b []byte) int { return len(b) }
func (idle) Event(c *tcp.Conn, ev tcp.Event)   {}

// BenchmarkEngineSegments is the engine alone: full-sized segments from one
// stack to another and the ACKs back, through Output, Input, checksums,
// options, ACK and window processing; no I/O, no copy between stacks.
// segments/s counts data segments and ACKs, per core.
func BenchmarkEngineSegments(b *testing.B) {
	o := tcp.Options{Secret: secret}
	sa, _ := tcp.NewStack(o)
	sb, _ := tcp.NewStack(o)
	w := &wire{a: sa, b: sb, now: 1e9, buf: make([]byte, 65536)}
	recv := &bulk{}
	if _, err := sb.Listen(netip.Addr{}, port, recv); err != nil {
		b.Fatal(err)
	}
	send := &bulk{}
	if _, err := sa.Connect(w.now, addrA, 0, netip.AddrPortFrom(addrB, port), send); err != nil {
		b.Fatal(err)
	}
	w.pump()
	// Warm up: let the window open, and the send rings grow with it to
	// the size the stream keeps (they start small: see tcp's Buffer
	// memory), so that what is measured is the steady state.
	for i := 0; i < 1000; i++ {
		w.now += 10000
		w.pump()
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, seg0 := recv.got, w.segments
	for i := 0; i < b.N; i++ {
		w.now += 1000
		w.pump()
	}
	b.StopTimer()
	segs := w.segments - seg0
	b.ReportMetric(float64(segs)/b.Elapsed().Seconds(), "segments/s")
	b.ReportMetric(float64(recv.got-start)*8/b.Elapsed().Seconds()/1e9, "Gbit/s")
	b.ReportMetric(float64(segs)/float64(b.N), "segments/op")
}

// BenchmarkIdleConnectionState measures the memory an established, idle
// connection holds: both ends of N connections, divided by 2N.
func BenchmarkIdleConnectionState(b *testing.B) {
	const n = 5000
	for i := 0; i < b.N; i++ {
		o := tcp.Options{Secret: secret}
		sa, _ := tcp.NewStack(o)
		sb, _ := tcp.NewStack(o)
		w := &wire{a: sa, b: sb, now: 1e9, buf: make([]byte, 65536)}
		l, _ := sb.Listen(netip.Addr{}, port, nil)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		h := &idle{}
		for j := 0; j < n; j++ {
			if _, err := sa.Connect(w.now, addrA, 0, netip.AddrPortFrom(addrB, port), h); err != nil {
				b.Fatal(err)
			}
			w.pump()
			w.pump()
			if c := l.Accept(); c == nil {
				b.Fatal("no connection")
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if sa.Conns() != n || sb.Conns() != n {
			b.Fatalf("%d/%d connections", sa.Conns(), sb.Conns())
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(2*n), "bytes/conn")
		runtime.KeepAlive(l)
	}
}

// TestEngineSteadyStateAllocations: moving data allocates nothing per
// segment once the connection runs: its send rings come from the pool as
// it drains and fills again (see tcp's Buffer memory).
func TestEngineSteadyStateAllocations(t *testing.T) {
	o := tcp.Options{Secret: secret}
	sa, _ := tcp.NewStack(o)
	sb, _ := tcp.NewStack(o)
	w := &wire{a: sa, b: sb, now: 1e9, buf: make([]byte, 65536)}
	recv := &bulk{}
	sb.Listen(netip.Addr{}, port, recv)
	sa.Connect(w.now, addrA, 0, netip.AddrPortFrom(addrB, port), &bulk{})
	for i := 0; i < 300; i++ {
		w.now += 10000
		w.pump()
	}
	seg0 := w.segments
	allocs := testing.AllocsPerRun(200, func() {
		w.now += 1000
		w.pump()
	})
	if w.segments-seg0 < 1000 {
		t.Fatalf("only %d segments moved", w.segments-seg0)
	}
	// Each direction drains its ring once a round here and takes one
	// again: under the race detector sync.Pool drops a quarter of what
	// is put in it, on purpose, and those two may be allocated. Nothing
	// is per segment either way.
	limit := 0.0
	if testenv.Race {
		limit = 2
	}
	if allocs > limit {
		t.Fatalf("%.1f allocations per round of %d segments, want at most %.0f", allocs, (w.segments-seg0)/200, limit)
	}
}
