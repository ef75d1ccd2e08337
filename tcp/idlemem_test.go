package tcp_test

import (
	"bytes"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/tcp"
)

// keeper is a Handler that takes nothing it is given: what arrives waits
// in the receive buffer for Read.
type keeper struct{}

func (keeper) Receive(c *tcp.Conn, b []byte) int { return 0 }
func (keeper) Event(c *tcp.Conn, ev tcp.Event)   {}

// heapInUse is the heap held by live objects after collections that
// empty sync.Pools (the buffer pool among them).
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// Issue 16: a connection that has moved data, in order and out of order,
// both ways, and is idle again holds no send or receive buffer, no
// out-of-order or SACK list: about the memory of a fresh one (1.2 KB,
// BenchmarkIdleConnectionState). Closing the connections gives even that
// back. Three rounds, so that what a round leaves would show as growth.
func TestIdleConnectionsHoldNoBuffers(t *testing.T) {
	const n, msg, rounds = 200, 20000, 4
	// Generous for the Conn (about 1 KiB) and its share of the tables,
	// and far below any buffer: the smallest ring is 4 KiB.
	const perConn = 2 << 10
	o := tcp.Options{Secret: secret}
	sa, _ := tcp.NewStack(o)
	sb, _ := tcp.NewStack(o)
	w := &wire{a: sa, b: sb, now: 1e9, buf: make([]byte, 65536)}
	l, err := sb.Listen(netip.Addr{}, port, keeper{})
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("softrnic"), msg/8)
	got := make([]byte, msg)
	base := heapInUse()
	var lefts [rounds]int64
	for round := range rounds {
		conns := make([]*tcp.Conn, 0, 2*n)
		for range n {
			c, err := sa.Connect(w.now, addrA, 0, netip.AddrPortFrom(addrB, port), keeper{})
			if err != nil {
				t.Fatal(err)
			}
			w.pump()
			w.pump()
			s := l.Accept()
			if s == nil {
				t.Fatal("no connection")
			}
			conns = append(conns, c, s)
		}
		for i := 0; i < len(conns); i += 2 {
			c, s := conns[i], conns[i+1]
			// A's first flight reaches B last segment first: all but one
			// arrive out of order, then the hole fills.
			if k, _ := c.Write(payload); k != msg {
				t.Fatalf("wrote %d", k)
			}
			w.reversed()
			if k, _ := s.Write(payload); k != msg {
				t.Fatalf("wrote %d", k)
			}
			for range 20 {
				w.now += 1e6
				w.pump()
				s.Read(got)
				c.Read(got)
			}
			if c.Unacked() != 0 || s.Unacked() != 0 || c.Buffered() != 0 || s.Buffered() != 0 {
				t.Fatalf("round %d: unacknowledged %d/%d, unread %d/%d", round, c.Unacked(), s.Unacked(), c.Buffered(), s.Buffered())
			}
			if s.Stats.OutOfOrder == 0 {
				t.Fatalf("round %d: nothing arrived out of order", round)
			}
		}
		w.now += tcp.Time(time.Second) // delayed ACKs
		w.pump()
		idle := float64(heapInUse()-base) / float64(len(conns))
		for _, c := range conns {
			c.Close()
		}
		for range 5 {
			w.pump()
		}
		w.now += tcp.Time(2 * time.Minute) // TIME-WAIT
		sa.Advance(w.now)
		sb.Advance(w.now)
		w.pump()
		if sa.Conns()+sb.Conns() != 0 {
			t.Fatalf("round %d: %d+%d connections left", round, sa.Conns(), sb.Conns())
		}
		conns = nil
		left := heapInUse() - base
		t.Logf("round %d: %.0f B per idle connection; %d B left after closing", round, idle, left)
		if idle > perConn {
			t.Errorf("round %d: %.0f B per idle connection after traffic, want at most %d", round, idle, perConn)
		}
		// What stays is the stacks' own (their timer heap and output
		// queue at their high water, 20 KB here): nothing per
		// connection, and not the connection table of the peak, which
		// forget makes again at its new size.
		if limit := int64(2 * n * 128); left > limit {
			t.Errorf("round %d: %d B held after every connection closed, want at most %d", round, left, limit)
		}
		lefts[round] = left
	}
	// Churn adds nothing.
	if grew := lefts[rounds-1] - lefts[0]; grew > 16<<10 {
		t.Errorf("what closed connections leave grew by %d B over %d rounds: %v", grew, rounds, lefts)
	}
}

// reversed delivers what A has to send to B in reverse order.
func (w *wire) reversed() {
	var segs [][]byte
	var src, dst netip.Addr
	for {
		n, s, d := w.a.Output(w.now, w.buf)
		if n == 0 {
			break
		}
		segs = append(segs, append([]byte(nil), w.buf[:n]...))
		src, dst = s, d
	}
	for i := len(segs) - 1; i >= 0; i-- {
		w.segments++
		w.b.Input(w.now, src, dst, segs[i])
	}
}
