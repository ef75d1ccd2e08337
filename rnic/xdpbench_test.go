package rnic

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/tcp"
)

// benchSide is a device with one poller, pinned to cpu: one host per CPU,
// as softrnic-bench runs them.
func benchSide(b *testing.B, h topology.Host, cpu int) *xdpSide {
	return newXDPSide(b, h, XDPOptions{Mode: bpf.ModeNative, Pollers: 1, CPUs: []int{min(cpu, runtime.NumCPU()-1)}})
}

// benchConnect connects qa (on A) to qb, accepted on srv (B).
func benchConnect(b *testing.B, tp *topology.Pair, srv *xdpSide, qa, qb *QP) {
	addr := net.JoinHostPort(tp.B.Addr.Addr().String(), "4791")
	ln, err := srv.dev.Listen(addr, ListenOptions{})
	must(b, err)
	defer ln.Close()
	connectVia(b, tp.A, ln, addr, qa, qb)
}

// BenchmarkXDPWrite streams 64 KiB RDMA Writes between two devices on the
// accelerated datapath (one poller each), 32
// outstanding, without the daemon: the engine's own bandwidth.
func BenchmarkXDPWrite(b *testing.B) {
	tp := topology.NewTest(b, topology.Options{})
	a, bb := benchSide(b, tp.A, 0), benchSide(b, tp.B, 1)
	qa, scq, _ := a.qp(b, 0, 256)
	qb, _, _ := bb.qp(b, 0, 256)
	benchConnect(b, tp, bb, qa, qb)
	const size = 64 << 10
	src := a.mr(b, size, 0, 1)
	dst := bb.mr(b, size, qp.LocalWrite|qp.RemoteWrite, 0)
	wr := &qp.SendWR{Op: qp.OpWrite, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: src.STag, Addr: src.Base, Length: size}},
		RemoteSTag: dst.STag, RemoteTO: dst.Base}
	out := make([]completion.Completion, 64)
	b.SetBytes(size)
	b.ResetTimer()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < 32 {
			if err := qa.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		n := scq.Poll(out)
		for _, c := range out[:n] {
			if c.Status != completion.Success {
				b.Fatalf("%+v", c)
			}
		}
		done += n
		if n == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	b.StopTimer()
	time.Sleep(150 * time.Millisecond)
	ec := qa.conn.(*engineConn)
	_ = ec.poller().Do(func(*tcp.Stack, tcp.Time) {
		b.Logf("sender conn: %+v srtt %v win %+v", ec.conn.Stats, ec.conn.SRTT(), ec.conn.Window())
	})
	for _, s := range []*xdpSide{a, bb} {
		st := s.dev.Pollers()[0].Stats()
		b.Logf("%+v", st)
	}
}

// BenchmarkXDPSendLatency: ping-pong of 8-byte Sends between two devices
// on the accelerated datapath, completions busy-polled by two goroutines
// (as perftest does): the engine's round trip without the daemon. Run it
// with GOMAXPROCS above the CPU count: the pinned pollers hold their Ps.
func BenchmarkXDPSendLatency(b *testing.B) {
	tp := topology.NewTest(b, topology.Options{})
	a, bb := benchSide(b, tp.A, 0), benchSide(b, tp.B, 1)
	type end struct {
		q   *QP
		rcq *completion.CQ
		mr  *MR
	}
	mk := func(s *xdpSide) *end {
		q, _, rcq := s.qp(b, 0, 64)
		return &end{q, rcq, s.mr(b, 64, qp.LocalWrite, 0)}
	}
	ea, eb := mk(a), mk(bb)
	recvWR := func(e *end) *qp.RecvWR {
		return &qp.RecvWR{ID: 1, SGL: []qp.SGE{{LKey: e.mr.STag, Addr: e.mr.Base, Length: 8}}}
	}
	sendWR := func(e *end) *qp.SendWR {
		return &qp.SendWR{Op: qp.OpSend, Flags: qp.Inline, SGL: []qp.SGE{{LKey: e.mr.STag, Addr: e.mr.Base, Length: 8}}}
	}
	for _, e := range []*end{ea, eb} {
		for i := 0; i < 32; i++ {
			must(b, e.q.PostRecv(recvWR(e)))
		}
	}
	benchConnect(b, tp, bb, ea.q, eb.q)
	send := func(e *end) { must(b, e.q.PostSend(sendWR(e))) }
	recv := func(e *end) {
		out := make([]completion.Completion, 1)
		deadline := time.Now().Add(5 * time.Second)
		for e.rcq.Poll(out) == 0 {
			if time.Now().After(deadline) {
				b.Fatal("no receive")
			}
		}
		must(b, e.q.PostRecv(recvWR(e)))
	}
	stop, echoed := make(chan struct{}), make(chan struct{})
	go func() { // B echoes; b.Fatal belongs to the benchmark's goroutine
		defer close(echoed)
		out := make([]completion.Completion, 1)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if eb.rcq.Poll(out) == 1 {
				if err := eb.q.PostRecv(recvWR(eb)); err != nil {
					b.Error(err)
					return
				}
				if err := eb.q.PostSend(sendWR(eb)); err != nil {
					b.Error(err)
					return
				}
			}
		}
	}()
	defer func() { close(stop); <-echoed }()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		send(ea)
		recv(ea)
	}
}
