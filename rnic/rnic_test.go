package rnic

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/qp"
)

type host struct {
	t        testing.TB
	dev      *Device
	pd       *PD
	scq, rcq *completion.CQ
}

func newHost(t testing.TB) *host {
	h := &host{t: t, dev: Open()}
	var err error
	h.pd, err = h.dev.AllocPD()
	must(t, err)
	h.scq, err = h.dev.CreateCQ(4096, 0)
	must(t, err)
	h.rcq, err = h.dev.CreateCQ(4096, 0)
	must(t, err)
	t.Cleanup(func() { h.dev.Close() })
	return h
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (h *host) qp(attr QPAttr) *QP {
	if attr.SQDepth == 0 {
		attr.SQDepth, attr.RQDepth = 256, 256
	}
	if attr.IRD == 0 {
		attr.IRD, attr.ORD = 16, 16
	}
	attr.SendCQ, attr.RecvCQ = h.scq, h.rcq
	q, err := h.dev.CreateQP(h.pd, attr)
	must(h.t, err)
	return q
}

func (h *host) mr(n int, access qp.Access) *MR {
	m, err := h.dev.RegisterMR(h.pd, make([]byte, n), 0x4000_0000, access)
	must(h.t, err)
	return m
}

// pair connects a client QP to a server QP over loopback.
func pair(t testing.TB, srv, cli *host, sattr, cattr QPAttr, prep func(s, c *QP)) (s, c *QP) {
	t.Helper()
	return pairAt(t, "127.0.0.1:0", srv, cli, sattr, cattr, prep)
}

// pairAt connects a client QP to a server QP listening on laddr, with
// private data both ways; both QPs have seen Established.
func pairAt(t testing.TB, laddr string, srv, cli *host, sattr, cattr QPAttr, prep func(s, c *QP)) (s, c *QP) {
	t.Helper()
	ln, err := srv.dev.Listen(laddr, ListenOptions{})
	must(t, err)
	defer ln.Close()
	s, c = srv.qp(sattr), cli.qp(cattr)
	if prep != nil {
		prep(s, c)
	}
	errc := make(chan error, 1)
	go func() {
		cr, err := ln.Accept(context.Background())
		if err != nil {
			errc <- err
			return
		}
		if string(cr.PrivateData) != "hello server" {
			errc <- errors.New("server got private data " + string(cr.PrivateData))
			return
		}
		errc <- cr.Accept(s, []byte("hello client"))
	}()
	pd, err := c.Connect(context.Background(), ln.Addr().String(), ConnectOptions{PrivateData: []byte("hello server")})
	must(t, err)
	must(t, <-errc)
	if string(pd) != "hello client" {
		t.Fatalf("client got private data %q", pd)
	}
	for _, q := range []*QP{s, c} {
		if ev := <-q.Events(); ev.Kind != Established {
			t.Fatalf("first event %v", ev)
		}
	}
	return s, c
}

// wait polls cq until n completions arrived or the deadline passed.
func wait(t testing.TB, cq *completion.CQ, n int) []completion.Completion {
	t.Helper()
	out := make([]completion.Completion, 0, n)
	buf := make([]completion.Completion, 64)
	deadline := time.After(60 * time.Second)
	for len(out) < n {
		k := cq.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		cq.Arm(false)
		if k = cq.Poll(buf[:min(len(buf), n-len(out))]); k > 0 {
			out = append(out, buf[:k]...)
			continue
		}
		select {
		case <-cq.Notify():
		case <-deadline:
			t.Fatalf("%d of %d completions after 60 s", len(out), n)
		}
	}
	return out
}

func waitEvent(t testing.TB, q *QP, kinds ...ConnEventKind) ConnEvent {
	t.Helper()
	for {
		select {
		case ev := <-q.Events():
			for _, k := range kinds {
				if ev.Kind == k {
					return ev
				}
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("QP %d: no %v event", q.QPN(), kinds)
		}
	}
}

// TestEveryOperationOverTCP moves every operation, with receives posted
// before the connection exists, and closes gracefully.
func TestEveryOperationOverTCP(t *testing.T) { onBothDatapaths(t, testEveryOperation) }

func testEveryOperation(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	sbuf := srv.mr(1<<20, qp.LocalWrite|qp.RemoteWrite|qp.RemoteRead|qp.RemoteAtomic)
	cbuf := cli.mr(1<<20, qp.LocalWrite)
	fillRand(cbuf.Buf[:200000], 1)
	fillRand(sbuf.Buf[500000:700000], 2)
	s, c := f.pair(t, srv, cli, QPAttr{}, QPAttr{}, func(s, c *QP) {
		// Receives posted before the connection exists.
		for i := 0; i < 3; i++ {
			must(t, s.PostRecv(&qp.RecvWR{ID: uint64(100 + i), SGL: []qp.SGE{{LKey: sbuf.STag, Addr: sbuf.Base + 800000 + uint64(i)*65536, Length: 65536}}}))
		}
	})
	post := func(wr qp.SendWR) { must(t, c.PostSend(&wr)) }
	post(qp.SendWR{ID: 1, Op: qp.OpWrite, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base, Length: 200000}},
		RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base})
	post(qp.SendWR{ID: 2, Op: qp.OpSend, Flags: qp.Signaled | qp.Solicited, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base, Length: 50000}}})
	post(qp.SendWR{ID: 3, Op: qp.OpRead, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + 300000, Length: 200000}},
		RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + 500000})
	// The target word is the RNIC's to update atomically, and ours to
	// read and write only atomically while it may.
	target := (*uint64)(unsafe.Pointer(&sbuf.Buf[1000000]))
	atomic.StoreUint64(target, 5)
	post(qp.SendWR{ID: 4, Op: qp.OpFetchAdd, Flags: qp.Signaled, Add: 10, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + 600000, Length: 8}},
		RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + 1000000})
	post(qp.SendWR{ID: 5, Op: qp.OpImmediate, Flags: qp.Signaled, Immediate: [8]byte{9, 9, 9}})
	sc := wait(t, cli.scq, 5)
	for i, cpl := range sc {
		if cpl.ID != uint64(i+1) || cpl.Status != completion.Success {
			t.Fatalf("client completion %d: %+v", i, cpl)
		}
	}
	rc := wait(t, srv.rcq, 2)
	if rc[0].ID != 100 || rc[0].ByteLen != 50000 || !rc[0].Solicited || rc[1].Opcode != completion.OpRecvImmediate || rc[1].Immediate[0] != 9 {
		t.Fatalf("server receives %+v", rc)
	}
	if !bytes.Equal(sbuf.Buf[:200000], cbuf.Buf[:200000]) {
		t.Fatal("RDMA Write data differs")
	}
	if !bytes.Equal(sbuf.Buf[800000:850000], cbuf.Buf[:50000]) {
		t.Fatal("Send data differs")
	}
	if !bytes.Equal(cbuf.Buf[300000:500000], sbuf.Buf[500000:700000]) {
		t.Fatal("RDMA Read data differs")
	}
	if got, old := atomic.LoadUint64(target), binary.NativeEndian.Uint64(cbuf.Buf[600000:]); got != 15 || old != 5 {
		t.Fatalf("fetch-add: target %d, result %d", got, old)
	}

	// Graceful close from the client: both sides see Disconnected, and the
	// server's remaining receives are flushed.
	c.Disconnect(true)
	if ev := waitEvent(t, c, Disconnected, Broken); ev.Kind != Disconnected {
		t.Fatalf("client: %+v", ev)
	}
	if ev := waitEvent(t, s, Disconnected, Broken); ev.Kind != Disconnected {
		t.Fatalf("server: %+v", ev)
	}
	for _, cpl := range wait(t, srv.rcq, 1) {
		if cpl.Status != completion.FlushError {
			t.Fatalf("after close: %+v", cpl)
		}
	}
	s.Destroy()
	c.Destroy()
}

func fillRand(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
}

func TestRejectCarriesPrivateData(t *testing.T) { onBothDatapaths(t, testRejectCarriesPrivateData) }

func testRejectCarriesPrivateData(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	ln := f.listen(t, srv, ListenOptions{})
	go func() {
		cr, err := ln.Accept(context.Background())
		if err == nil {
			_ = cr.Reject([]byte("go away"))
		}
	}()
	c := cli.qp(QPAttr{})
	_, err := c.Connect(context.Background(), f.connectAddr(ln), ConnectOptions{})
	var rej *RejectedError
	if !errors.As(err, &rej) || string(rej.PrivateData) != "go away" {
		t.Fatalf("connect: %v", err)
	}
}

// TestConnectFailures: the initiator's outcome against a port nobody
// listens on and against peers that are not RNICs, from the server host's
// kernel (on xdp, B's steering program passes their flows to B's kernel).
func TestConnectFailures(t *testing.T) { onBothDatapaths(t, testConnectFailures) }

func testConnectFailures(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	// Nobody listens: unreachable (the SYN is answered by a reset).
	l := f.listenTCP(t)
	addr := l.Addr().String()
	l.Close()
	c := cli.qp(QPAttr{})
	if _, err := c.Connect(context.Background(), addr, ConnectOptions{}); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("closed port: %v", err)
	}
	// Nor after the RNIC's own listener on the port closed.
	ln := f.listen(t, srv, ListenOptions{})
	ln.Close()
	c1 := cli.qp(QPAttr{})
	if _, err := c1.Connect(context.Background(), f.connectAddr(ln), ConnectOptions{}); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("closed RNIC listener: %v", err)
	}
	// A TCP server that never answers the MPA Request: timed out.
	l = f.listenTCP(t)
	go func() {
		if conn, err := l.Accept(); err == nil {
			defer conn.Close()
			time.Sleep(2 * time.Second)
		}
	}()
	c2 := cli.qp(QPAttr{})
	if _, err := c2.Connect(context.Background(), l.Addr().String(), ConnectOptions{Timeout: 300 * time.Millisecond}); !errors.Is(err, ErrTimedOut) {
		t.Fatalf("silent server: %v", err)
	}
	// Something that is not MPA answers: an invalid frame.
	l2 := f.listenTCP(t)
	go func() {
		if conn, err := l2.Accept(); err == nil {
			defer conn.Close()
			_, _ = conn.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			time.Sleep(time.Second)
		}
	}()
	c3 := cli.qp(QPAttr{})
	if _, err := c3.Connect(context.Background(), l2.Addr().String(), ConnectOptions{}); !errors.Is(err, ddp.LLPInvalidFrame) {
		t.Fatalf("HTTP server: %v", err)
	}
}

func TestProtocolErrorOverTCP(t *testing.T) { onBothDatapaths(t, testProtocolError) }

func testProtocolError(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	cbuf := cli.mr(64, qp.LocalWrite)
	s, c := f.pair(t, srv, cli, QPAttr{}, QPAttr{}, nil)
	must(t, c.PostSend(&qp.SendWR{ID: 1, Op: qp.OpRead, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base, Length: 8}},
		RemoteSTag: 0xabcd01, RemoteTO: 0}))
	cpl := wait(t, cli.scq, 1)[0]
	if cpl.Status != completion.RemoteAccessError || !errors.Is(cpl.Err, ddp.RDMAPInvalidSTag) {
		t.Fatalf("read of a bad STag: %+v", cpl)
	}
	if ev := waitEvent(t, s, TerminateSent); !errors.Is(ev.Err, ddp.RDMAPInvalidSTag) {
		t.Fatalf("server: %+v", ev)
	}
	waitEvent(t, s, Broken)
	waitEvent(t, c, Broken)
}

func TestAbortIsSeenByThePeer(t *testing.T) { onBothDatapaths(t, testAbortIsSeenByThePeer) }

func testAbortIsSeenByThePeer(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	s, c := f.pair(t, srv, cli, QPAttr{}, QPAttr{}, nil)
	c.Disconnect(false)
	waitEvent(t, c, Broken)
	if ev := waitEvent(t, s, Disconnected, Broken); ev.Kind != Broken {
		t.Fatalf("server saw %+v after the client's reset", ev)
	}
}

// TestQPLivesOnOneVector: a QP's CQs share one completion vector, which
// is the QP's (on xdp, it names the poller the QP runs on).
func TestQPLivesOnOneVector(t *testing.T) { onBothDatapaths(t, testQPLivesOnOneVector) }

func testQPLivesOnOneVector(t *testing.T, f *fabric) {
	h, _ := f.hosts(t)
	other, err := h.dev.CreateCQ(16, 1)
	must(t, err)
	if _, err := h.dev.CreateQP(h.pd, QPAttr{SQDepth: 1, RQDepth: 1, SendCQ: h.scq, RecvCQ: other}); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("CQs on two vectors: %v", err)
	}
	q, err := h.dev.CreateQP(h.pd, QPAttr{SQDepth: 1, RQDepth: 1, SendCQ: other, RecvCQ: other})
	must(t, err)
	if q.Vector() != 1 {
		t.Fatalf("vector %d", q.Vector())
	}
	if ps := h.dev.Pollers(); f.tp == nil && q.Poller() != nil {
		t.Fatal("a poller on the kernel datapath")
	} else if f.tp != nil && (q.Poller() == nil || q.Poller() != ps[1%len(ps)]) {
		t.Fatalf("QP on vector 1 runs on poller %p of %v", q.Poller(), ps)
	}
	q.Destroy()
}

func TestDeregisterBusyAndPDInUse(t *testing.T) {
	h := newHost(t)
	q := h.qp(QPAttr{})
	m := h.mr(64, qp.LocalWrite)
	must(t, q.PostRecv(&qp.RecvWR{SGL: []qp.SGE{{LKey: m.STag, Addr: m.Base, Length: 64}}}))
	if err := m.Deregister(); !errors.Is(err, ErrBusy) {
		t.Fatalf("deregister in use: %v", err)
	}
	if err := h.pd.Free(); !errors.Is(err, ErrBusy) {
		t.Fatalf("free PD in use: %v", err)
	}
	q.Destroy() // flushes the receive
	must(t, m.Deregister())
	stale := m.STag
	m2 := h.mr(64, qp.LocalWrite)
	if m2.STag == stale || h.dev.stags.Lookup(stale) != nil {
		t.Fatalf("reused STag %#x after %#x", m2.STag, stale)
	}
	must(t, m2.Deregister())
	must(t, h.pd.Free())
}

// TestMPAVariantsOverTCP connects with each startup flavour a real iWARP
// peer may ask for and moves a Send, a Write and a Read on it.
func TestMPAVariantsOverTCP(t *testing.T) { onBothDatapaths(t, testMPAVariants) }

func testMPAVariants(t *testing.T, f *fabric) {
	cases := []struct {
		name     string
		srv, cli QPAttr
	}{
		{name: "revision 1, CRC", srv: QPAttr{}, cli: QPAttr{MPARevision: 1}},
		{name: "revision 1 responder", srv: QPAttr{MPARevision: 1}, cli: QPAttr{}},
		{name: "no CRC either side", srv: QPAttr{NoCRC: true}, cli: QPAttr{NoCRC: true}},
		{name: "CRC asked by the responder only", srv: QPAttr{}, cli: QPAttr{NoCRC: true}},
		{name: "markers both ways", srv: QPAttr{Markers: true}, cli: QPAttr{Markers: true}},
		{name: "markers towards the client only", srv: QPAttr{}, cli: QPAttr{Markers: true}},
		{name: "peer to peer", srv: QPAttr{PeerToPeer: true}, cli: QPAttr{PeerToPeer: true}},
		{name: "IRD/ORD 1", srv: QPAttr{IRD: 1, ORD: 1}, cli: QPAttr{IRD: 1, ORD: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, cli := f.hosts(t)
			sbuf := srv.mr(1<<20, qp.LocalWrite|qp.RemoteWrite|qp.RemoteRead)
			cbuf := cli.mr(1<<20, qp.LocalWrite|qp.RemoteWrite)
			fillRand(cbuf.Buf[:300000], 11)
			fillRand(sbuf.Buf[600000:900000], 12)
			s, q := f.pair(t, srv, cli, c.srv, c.cli, func(s, _ *QP) {
				must(t, s.PostRecv(&qp.RecvWR{ID: 1, SGL: []qp.SGE{{LKey: sbuf.STag, Addr: sbuf.Base + 400000, Length: 100000}}}))
			})
			must(t, q.PostSend(&qp.SendWR{ID: 1, Op: qp.OpWrite, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base, Length: 300000}},
				RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base}))
			must(t, q.PostSend(&qp.SendWR{ID: 2, Op: qp.OpSend, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base, Length: 100000}}}))
			must(t, q.PostSend(&qp.SendWR{ID: 3, Op: qp.OpRead, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + 500000, Length: 300000}},
				RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + 600000}))
			checkOK(t, wait(t, cli.scq, 3))
			checkOK(t, wait(t, srv.rcq, 1))
			if !bytes.Equal(sbuf.Buf[:300000], cbuf.Buf[:300000]) || !bytes.Equal(sbuf.Buf[400000:500000], cbuf.Buf[:100000]) ||
				!bytes.Equal(cbuf.Buf[500000:800000], sbuf.Buf[600000:900000]) {
				t.Fatal("data differs")
			}
			s.Destroy()
			q.Destroy()
		})
	}
}

func TestUnansweredRequestIsRejected(t *testing.T) {
	onBothDatapaths(t, testUnansweredRequestIsRejected)
}

func testUnansweredRequestIsRejected(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	ln := f.listen(t, srv, ListenOptions{RequestTimeout: 200 * time.Millisecond})
	c := cli.qp(QPAttr{})
	// Nobody calls Accept: the listener rejects after RequestTimeout.
	_, err := c.Connect(context.Background(), f.connectAddr(ln), ConnectOptions{Timeout: 5 * time.Second})
	var rej *RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("unanswered request: %v", err)
	}
	// The request was queued before it timed out; accepting it now, on
	// a QP of the listener's device, is too late.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cr, err := ln.Accept(ctx)
	if err == nil {
		if err := cr.Accept(srv.qp(QPAttr{}), nil); !errors.Is(err, ErrAnswered) {
			t.Fatalf("accepting a timed-out request: %v", err)
		}
	}
}

// AnswerTimeout, longer than RequestTimeout, is the consumer's to answer
// in: a request held past RequestTimeout is still accepted.
func TestAnswerTimeoutBoundsTheAnswer(t *testing.T) {
	onBothDatapaths(t, testAnswerTimeoutBoundsTheAnswer)
}

func testAnswerTimeoutBoundsTheAnswer(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	ln := f.listen(t, srv, ListenOptions{RequestTimeout: 200 * time.Millisecond, AnswerTimeout: 30 * time.Second})
	c := cli.qp(QPAttr{})
	connected := make(chan error, 1)
	go func() {
		_, err := c.Connect(context.Background(), f.connectAddr(ln), ConnectOptions{Timeout: 30 * time.Second})
		connected <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cr, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // three RequestTimeouts
	if err := cr.Accept(srv.qp(QPAttr{}), nil); err != nil {
		t.Fatalf("accepting after RequestTimeout, within AnswerTimeout: %v", err)
	}
	if err := <-connected; err != nil {
		t.Fatalf("connect: %v", err)
	}
}

// TestErrorClassesOverTCP: each class of remote error, over TCP, ends
// with the responder's Terminate carrying the RFC cause, the requester
// told of it, both QPs in Error and every request accounted for.
func TestErrorClassesOverTCP(t *testing.T) { onBothDatapaths(t, testErrorClasses) }

func testErrorClasses(t *testing.T, f *fabric) {
	type env struct {
		c       *QP
		cbuf    *MR
		w, r    *MR // server regions: remote write, remote read
		foreign *MR // server region in another PD
	}
	cases := []struct {
		name     string
		cause    ddp.TerminateError
		post     func(e env) qp.SendWR
		reqFails completion.Status // the requester's completion, for Reads and atomics
	}{
		{"write to unknown STag", ddp.DDPTaggedInvalidSTag, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpWrite, Flags: qp.Inline, InlineData: []byte("x"), RemoteSTag: 0x123400}
		}, 0},
		{"write out of bounds", ddp.DDPTaggedBaseOrBounds, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpWrite, Flags: qp.Inline, InlineData: []byte("xy"), RemoteSTag: e.w.STag, RemoteTO: e.w.Base + 4095}
		}, 0},
		{"write to another PD", ddp.DDPTaggedNotAssoc, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpWrite, Flags: qp.Inline, InlineData: []byte("x"), RemoteSTag: e.foreign.STag, RemoteTO: e.foreign.Base}
		}, 0},
		{"write without rights", ddp.RDMAPAccessRights, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpWrite, Flags: qp.Inline, InlineData: []byte("x"), RemoteSTag: e.r.STag, RemoteTO: e.r.Base}
		}, 0},
		{"send too long", ddp.DDPUntaggedTooLong, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpSend, SGL: []qp.SGE{{LKey: e.cbuf.STag, Addr: e.cbuf.Base, Length: 65}}}
		}, 0},
		{"read of unknown STag", ddp.RDMAPInvalidSTag, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpRead, SGL: []qp.SGE{{LKey: e.cbuf.STag, Addr: e.cbuf.Base, Length: 8}}, RemoteSTag: 0x999900}
		}, completion.RemoteAccessError},
		{"read out of bounds", ddp.RDMAPBaseOrBounds, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpRead, SGL: []qp.SGE{{LKey: e.cbuf.STag, Addr: e.cbuf.Base, Length: 8}}, RemoteSTag: e.r.STag, RemoteTO: e.r.Base + 4090}
		}, completion.RemoteAccessError},
		{"read without rights", ddp.RDMAPAccessRights, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpRead, SGL: []qp.SGE{{LKey: e.cbuf.STag, Addr: e.cbuf.Base, Length: 8}}, RemoteSTag: e.w.STag, RemoteTO: e.w.Base}
		}, completion.RemoteAccessError},
		{"read from another PD", ddp.RDMAPSTagNotAssociated, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpRead, SGL: []qp.SGE{{LKey: e.cbuf.STag, Addr: e.cbuf.Base, Length: 8}}, RemoteSTag: e.foreign.STag, RemoteTO: e.foreign.Base}
		}, completion.RemoteAccessError},
		{"atomic without rights", ddp.RDMAPAccessRights, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpFetchAdd, SGL: []qp.SGE{{LKey: e.cbuf.STag, Addr: e.cbuf.Base, Length: 8}}, RemoteSTag: e.w.STag, RemoteTO: e.w.Base}
		}, completion.RemoteAccessError},
		{"invalidate of another PD's STag", ddp.RDMAPProtectionCannotInv, func(e env) qp.SendWR {
			return qp.SendWR{Op: qp.OpSendInvalidate, Flags: qp.Inline, InlineData: []byte("x"), InvalidateSTag: e.foreign.STag}
		}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := f.hosts(t)
			e := env{cbuf: cli.mr(4096, qp.LocalWrite)}
			e.w = srv.mr(4096, qp.LocalWrite|qp.RemoteWrite)
			e.r = srv.mr(4096, qp.RemoteRead)
			otherPD, err := srv.dev.AllocPD()
			must(t, err)
			e.foreign, err = srv.dev.RegisterMR(otherPD, make([]byte, 4096), 0, qp.LocalWrite|qp.RemoteWrite|qp.RemoteRead)
			must(t, err)
			rb := srv.mr(64, qp.LocalWrite)
			s, c := f.pair(t, srv, cli, QPAttr{}, QPAttr{}, func(s, _ *QP) {
				must(t, s.PostRecv(&qp.RecvWR{ID: 1, SGL: []qp.SGE{{LKey: rb.STag, Addr: rb.Base, Length: 64}}}))
			})
			e.c = c
			wr := tc.post(e)
			wr.ID, wr.Flags = 42, wr.Flags|qp.Signaled
			must(t, c.PostSend(&wr))
			if ev := waitEvent(t, s, TerminateSent); ev.Err != tc.cause {
				t.Fatalf("responder sent %v, want %v", ev.Err, tc.cause)
			}
			if ev := waitEvent(t, c, TerminateReceived); !errors.Is(ev.Err, tc.cause) {
				t.Fatalf("requester received %v, want %v", ev.Err, tc.cause)
			}
			waitEvent(t, s, Broken)
			waitEvent(t, c, Broken)
			if s.State() != qp.Error || c.State() != qp.Error {
				t.Fatalf("states %v %v", s.State(), c.State())
			}
			cpl := wait(t, cli.scq, 1)[0]
			if tc.reqFails != 0 && (cpl.Status != tc.reqFails || !errors.Is(cpl.Err, tc.cause)) {
				t.Fatalf("requester completion %+v", cpl)
			}
			// The server's posted receive is consumed or flushed, never lost.
			if rc := wait(t, srv.rcq, 1); rc[0].ID != 1 {
				t.Fatalf("server receive %+v", rc)
			}
			for _, x := range e.w.Buf {
				if x != 0 {
					t.Fatal("a refused Write changed memory")
				}
			}
			s.Destroy()
			c.Destroy()
		})
	}
}

func TestResetAndReconnect(t *testing.T) { onBothDatapaths(t, testResetAndReconnect) }

func testResetAndReconnect(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	_, c := f.pair(t, srv, cli, QPAttr{}, QPAttr{}, nil)
	if err := c.Reset(); !errors.Is(err, ErrState) {
		t.Fatalf("reset while connected: %v", err)
	}
	c.Disconnect(true)
	if ev := waitEvent(t, c, Disconnected, Broken); ev.Kind != Disconnected {
		t.Fatalf("close: %+v", ev)
	}
	must(t, c.Reset())
	// The reset QP connects again, to a new server QP, and works.
	ln := f.listen(t, srv, ListenOptions{})
	s2 := srv.qp(QPAttr{})
	rb := srv.mr(64, qp.LocalWrite)
	must(t, s2.PostRecv(&qp.RecvWR{ID: 3, SGL: []qp.SGE{{LKey: rb.STag, Addr: rb.Base, Length: 64}}}))
	go func() {
		if cr, err := ln.Accept(context.Background()); err == nil {
			_ = cr.Accept(s2, nil)
		}
	}()
	if _, err := c.Connect(context.Background(), f.connectAddr(ln), ConnectOptions{}); err != nil {
		t.Fatalf("reconnect after reset: %v", err)
	}
	waitEvent(t, c, Established)
	must(t, c.PostSend(&qp.SendWR{Op: qp.OpSend, Flags: qp.Inline, InlineData: []byte("again")}))
	if rc := wait(t, srv.rcq, 1); rc[0].ID != 3 || rc[0].ByteLen != 5 {
		t.Fatalf("after reconnect: %+v", rc)
	}
}

func TestOnEventReplacesTheChannel(t *testing.T) { onBothDatapaths(t, testOnEventReplacesTheChannel) }

func testOnEventReplacesTheChannel(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	evc := make(chan ConnEventKind, 16)
	ln := f.listen(t, srv, ListenOptions{})
	s := srv.qp(QPAttr{OnEvent: func(e ConnEvent) { evc <- e.Kind }})
	go func() {
		if cr, err := ln.Accept(context.Background()); err == nil {
			_ = cr.Accept(s, nil)
		}
	}()
	c := cli.qp(QPAttr{})
	_, err := c.Connect(context.Background(), f.connectAddr(ln), ConnectOptions{})
	must(t, err)
	c.Disconnect(false)
	for _, want := range []ConnEventKind{Established, Broken} {
		select {
		case k := <-evc:
			if k != want {
				t.Fatalf("event %v, want %v", k, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no %v", want)
		}
	}
}

// STags do not follow from each other: of 256 regions registered one after
// another, no two in a row have neighbouring indices or the same key more
// often than chance would have it, and a reused index gets a new key.
func TestSTagsUnpredictable(t *testing.T) {
	var tab stagTable
	var prev uint32
	next, sameKey := 0, 0
	for i := range 256 {
		m := &qp.MR{}
		if err := tab.insert(m); err != nil {
			t.Fatal(err)
		}
		if i > 0 && m.STag>>8 == prev>>8+1 {
			next++
		}
		if i > 0 && uint8(m.STag) == uint8(prev) {
			sameKey++
		}
		prev = m.STag
	}
	// By chance about 1/1000 and 1/256 of the pairs: 16 of 255 is far off.
	if next > 16 || sameKey > 16 {
		t.Errorf("of 255 STags in a row, %d have the next index and %d the same key as the one before", next, sameKey)
	}
	m := &qp.MR{}
	if err := tab.insert(m); err != nil {
		t.Fatal(err)
	}
	old := m.STag
	tab.remove(m)
	for range 50000 { // until the index comes again
		n := &qp.MR{}
		if err := tab.insert(n); err != nil {
			t.Fatal(err)
		}
		if n.STag>>8 == old>>8 {
			if n.STag == old || tab.Lookup(old) != nil {
				t.Fatalf("index %#x reused with its old STag %#x", old>>8, old)
			}
			return
		}
		tab.remove(n)
	}
	t.Fatal("a free index never came again")
}

// Lookups run on the pollers while the application registers and
// deregisters: a region registered throughout is found at every lookup,
// while the chunk list grows under it; afterwards every live STag finds its
// region and every deregistered one finds nothing (run under -race by make
// test).
func TestSTagTableConcurrent(t *testing.T) {
	var tab stagTable
	keep := &qp.MR{}
	if err := tab.insert(keep); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if tab.Lookup(keep.STag) != keep {
					t.Error("a registered region was not found")
					return
				}
			}
		}()
	}
	var live, gone []*qp.MR
	for i := range 5000 {
		m := &qp.MR{}
		if err := tab.insert(m); err != nil {
			t.Fatal(err)
		}
		live = append(live, m)
		if i%3 == 2 {
			tab.remove(live[0])
			gone = append(gone, live[0])
			live = live[1:]
		}
	}
	close(done)
	wg.Wait()
	for _, m := range live {
		if tab.Lookup(m.STag) != m {
			t.Fatalf("STag %#x lost", m.STag)
		}
	}
	for _, m := range gone {
		if tab.Lookup(m.STag) != nil {
			t.Fatalf("deregistered STag %#x still found", m.STag)
		}
	}
}

// A request is answered only with a QP of the listener's device.
func TestAcceptWithAnotherDevicesQP(t *testing.T) {
	onBothDatapaths(t, func(t *testing.T, f *fabric) {
		srv, cli := f.hosts(t)
		ln := f.listen(t, srv, ListenOptions{})
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cr, err := ln.Accept(ctx)
			if err == nil {
				if err = cr.Accept(cli.qp(QPAttr{}), nil); err != nil {
					_ = cr.Reject(nil)
				}
			}
			errc <- err
		}()
		_, _ = cli.qp(QPAttr{}).Connect(context.Background(), f.connectAddr(ln), ConnectOptions{Timeout: 3 * time.Second})
		if err := <-errc; !errors.Is(err, ErrInvalidParam) {
			t.Fatalf("accept on a QP of the client's device: %v", err)
		}
	})
}

// A QP destroyed after its graceful disconnect, with nothing left to send
// (perftest and rping: rdma_disconnect, then rdma_destroy_qp at once),
// lets its close finish in order, as Linux siw's released socket does: the
// peer sees a graceful disconnect, not a reset after the FIN.
func TestDestroyAfterGracefulDisconnectIsNoReset(t *testing.T) {
	onBothDatapaths(t, testDestroyAfterGracefulDisconnect)
}

func testDestroyAfterGracefulDisconnect(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	for round := range 10 {
		s, c := f.pair(t, srv, cli, QPAttr{}, QPAttr{}, nil)
		c.Disconnect(true)
		for i := 0; ; i++ {
			// Drained, or already past it: the FINs crossed
			// between two looks, and the close ended in order.
			c.mu.Lock()
			drained := c.eng.Drained() || c.eng.Ended()
			c.unlock()
			if drained {
				break
			}
			if i == 5000 {
				t.Fatal("the client's graceful disconnect never drained")
			}
			time.Sleep(time.Millisecond)
		}
		c.Destroy()
		if ev := waitEvent(t, s, Disconnected, Broken); ev.Kind != Disconnected {
			t.Fatalf("round %d: the server saw %+v after the client's graceful disconnect and destroy", round, ev)
		}
		s.Destroy()
	}
}
