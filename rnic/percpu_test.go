package rnic

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/tcp"
)

// xdpSide is one host of the accelerated datapath in a test namespace.
type xdpSide struct {
	dev *Device
	pd  *PD
}

// newXDPSide opens a device on the accelerated datapath of h with o (its
// interface and address filled in from h).
func newXDPSide(t testing.TB, h topology.Host, o XDPOptions) *xdpSide {
	t.Helper()
	o.Interface, o.Addr, o.Pin = h.Link, h.Addr.Addr(), true
	var d *Device
	if err := h.Do(func() error {
		var err error
		d, err = OpenXDP(o)
		return err
	}); err != nil {
		t.Fatalf("OpenXDP in %s: %v", h.Namespace, err)
	}
	t.Cleanup(func() { d.Close() })
	pd, err := d.AllocPD()
	must(t, err)
	return &xdpSide{dev: d, pd: pd}
}

// qp makes a QP whose CQs are on the given vector.
func (s *xdpSide) qp(t testing.TB, vector, sqDepth int) (*QP, *completion.CQ, *completion.CQ) {
	t.Helper()
	scq, err := s.dev.CreateCQ(1024, vector)
	must(t, err)
	rcq, err := s.dev.CreateCQ(1024, vector)
	must(t, err)
	q, err := s.dev.CreateQP(s.pd, QPAttr{SQDepth: sqDepth, RQDepth: 64, IRD: 8, ORD: 8, SendCQ: scq, RecvCQ: rcq})
	must(t, err)
	return q, scq, rcq
}

// connectVia connects qa, from h's namespace, to addr, where ln's next
// request is accepted onto qb.
func connectVia(t testing.TB, h topology.Host, ln *Listener, addr string, qa, qb *QP) {
	t.Helper()
	accepted := make(chan error, 1)
	go func() {
		cr, err := ln.Accept(context.Background())
		if err == nil {
			err = cr.Accept(qb, nil)
		}
		accepted <- err
	}()
	if err := h.Do(func() error {
		_, err := qa.Connect(context.Background(), addr, ConnectOptions{Timeout: 10 * time.Second})
		return err
	}); err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("accept at %s: %v", addr, err)
	}
}

func (s *xdpSide) mr(t testing.TB, n int, access qp.Access, seed byte) *MR {
	t.Helper()
	m, err := s.dev.RegisterMR(s.pd, make([]byte, n), 0x1000, access)
	must(t, err)
	for i := range m.Buf {
		m.Buf[i] = seed + byte(i*13+i>>8)
	}
	return m
}

// Seed 004 on a two-queue link: each host has two pollers, pinned to CPUs
// 0 and 1. Two connections cross: A's QP on vector 0 to B's on vector 1,
// and A's on vector 1 to B's on vector 0. B listens on its first poller,
// so the first connection moves to poller 1 when accepted, and segments
// that arrive on a queue whose poller does not own their flow are handed
// over. For every QP, every engine call (segments received, work requests
// turned into FPDUs, completions) ran on its CQ's CPU, and the data is
// all there.
func TestPerProcessorCompletions(t *testing.T) {
	testenv.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	cpuCheck.Store(true)
	defer cpuCheck.Store(false)
	tp := topology.NewTest(t, topology.Options{Queues: 2})
	a := newXDPSide(t, tp.A, XDPOptions{Mode: bpf.ModeNative, Pollers: 2})
	b := newXDPSide(t, tp.B, XDPOptions{Mode: bpf.ModeNative, Pollers: 2})
	ln, err := b.dev.Listen(net.JoinHostPort(tp.B.Addr.Addr().String(), "4791"), ListenOptions{})
	must(t, err)
	defer ln.Close()

	const writeLen, readLen = 4 << 20, 1 << 20
	type end struct {
		q        *QP
		scq, rcq *completion.CQ
	}
	var qps []*QP
	for i, vec := range [][2]int{{0, 1}, {1, 0}} {
		ca, cb := end{}, end{}
		ca.q, ca.scq, ca.rcq = a.qp(t, vec[0], 64)
		cb.q, cb.scq, cb.rcq = b.qp(t, vec[1], 64)
		qps = append(qps, ca.q, cb.q)
		src := a.mr(t, writeLen, 0, byte(i+1))
		sink := a.mr(t, readLen, qp.LocalWrite, 0)
		msg := a.mr(t, 64, 0, 7)
		dst := b.mr(t, writeLen, qp.LocalWrite|qp.RemoteWrite, 0)
		rbuf := b.mr(t, 64, qp.LocalWrite, 0)
		rsrc := b.mr(t, readLen, qp.RemoteRead, byte(i+9))
		must(t, cb.q.PostRecv(&qp.RecvWR{ID: 100, SGL: []qp.SGE{{LKey: rbuf.STag, Addr: rbuf.Base, Length: 64}}}))

		connectVia(t, tp.A, ln, net.JoinHostPort(tp.B.Addr.Addr().String(), "4791"), ca.q, cb.q)
		for _, wr := range []*qp.SendWR{
			{ID: 1, Op: qp.OpWrite, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: src.STag, Addr: src.Base, Length: writeLen}}, RemoteSTag: dst.STag, RemoteTO: dst.Base},
			{ID: 2, Op: qp.OpSend, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: msg.STag, Addr: msg.Base, Length: 64}}},
			{ID: 3, Op: qp.OpRead, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: sink.STag, Addr: sink.Base, Length: readLen}}, RemoteSTag: rsrc.STag, RemoteTO: rsrc.Base},
		} {
			must(t, ca.q.PostSend(wr))
		}
		for j, c := range wait(t, ca.scq, 3) {
			if c.Status != completion.Success || c.ID != uint64(j+1) {
				t.Fatalf("connection %d: completion %d: %+v", i, j, c)
			}
		}
		// The Send's completion at B follows the Write's placement.
		if rc := wait(t, cb.rcq, 1); rc[0].Status != completion.Success || rc[0].ByteLen != 64 {
			t.Fatalf("connection %d: receive completion %+v", i, rc[0])
		}
		if !bytes.Equal(dst.Buf, src.Buf) || !bytes.Equal(rbuf.Buf, msg.Buf) || !bytes.Equal(sink.Buf, rsrc.Buf) {
			t.Fatalf("connection %d: data differs", i)
		}
	}
	for i, q := range qps {
		q.mu.Lock()
		calls, off := q.cpuCalls, q.cpuOff
		q.mu.Unlock()
		t.Logf("QP %d (vector %d): %d engine calls, %d off its CPU", i, q.Vector(), calls, off)
		if calls == 0 || off != 0 {
			t.Errorf("QP %d on vector %d: %d of %d engine calls off CPU %d", i, q.Vector(), off, calls, q.Vector())
		}
	}
	var handed, moving uint64
	for _, p := range b.dev.Pollers() {
		must(t, p.Do(func(*tcp.Stack, tcp.Time) {})) // publishes the counters
		st := p.Stats()
		handed += st.HandedOff
		moving += st.MovingDrops
		if st.HandoffDrops != 0 {
			t.Errorf("handoff ring overflowed: %+v", st)
		}
	}
	t.Logf("B: %d frames handed between pollers, %d dropped while a connection moved", handed, moving)
	if handed == 0 {
		t.Error("no frame was handed over to the owning poller")
	}
}

// A graceful disconnect whose peer never sends its FIN ends anyway: after
// closeTimeout the connection is reset and the QP reports Broken, as on the
// kernel datapath. The peer is a bare kernel socket that answers the MPA
// Request by hand and then only holds the connection.
func TestEngineCloseTimeout(t *testing.T) {
	tp := topology.NewTest(t, topology.Options{})
	a := newXDPSide(t, tp.A, XDPOptions{Mode: bpf.ModeNative, Pollers: 1})
	ln, err := tp.B.ListenTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), 4791))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := mpaByHand(ln, nil) // never closed before the test ends
	q, _, _ := a.qp(t, 0, 64)
	if _, err := q.Connect(context.Background(), net.JoinHostPort(tp.B.Addr.Addr().String(), "4791"), ConnectOptions{Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	peer := <-held
	defer peer.Close()
	if ev := <-q.Events(); ev.Kind != Established {
		t.Fatalf("first event %v", ev)
	}
	start := time.Now()
	q.Disconnect(true)
	select {
	case ev := <-q.Events():
		if ev.Kind != Broken {
			t.Fatalf("event %v, want broken", ev)
		}
		if d := time.Since(start); d < closeTimeout-100*time.Millisecond {
			t.Fatalf("broken after %v, before closeTimeout", d)
		}
	case <-time.After(closeTimeout + 10*time.Second):
		t.Fatal("the QP still waits for a FIN that never comes")
	}
	if !q.Ended() {
		t.Fatal("QP not ended")
	}
}

// readMPAFrame reads one MPA startup frame from a bare socket, for tests
// whose peer answers by hand.
func readMPAFrame(conn net.Conn, reply bool) (mpa.Frame, error) {
	buf := make([]byte, mpa.FrameHeaderLen)
	if _, err := io.ReadFull(conn, buf); err != nil {
		return mpa.Frame{}, err
	}
	n, err := mpa.FrameLen(buf)
	if err != nil {
		return mpa.Frame{}, err
	}
	buf = append(buf, make([]byte, n-len(buf))...)
	if _, err := io.ReadFull(conn, buf[mpa.FrameHeaderLen:]); err != nil {
		return mpa.Frame{}, err
	}
	f, _, err := mpa.ParseFrame(buf, reply)
	return f, err
}

// mpaByHand accepts one connection on ln, answers its MPA Request by hand
// (after prep, if set, has seen the socket) and then only holds it: the
// connection comes on the channel, for the test to close.
func mpaByHand(ln net.Listener, prep func(net.Conn)) <-chan net.Conn {
	held := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if prep != nil {
			prep(c)
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		req, err := readMPAFrame(c, false)
		if err != nil {
			c.Close()
			return
		}
		reply, _, err := (&mpa.Config{}).Accept(&req)
		if err == nil {
			wire, _ := reply.Append(nil)
			_, _ = c.Write(wire)
		}
		held <- c
	}()
	return held
}
