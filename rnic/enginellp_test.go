package rnic

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// mrTable is a plain STag table for engine tests.
type mrTable map[uint32]*qp.MR

func (m mrTable) Lookup(stag uint32) *qp.MR { return m[stag] }

func (m mrTable) reg(pd uint32, n int, access qp.Access, seed uint64) *qp.MR {
	mr := &qp.MR{STag: uint32(len(m)+1)<<8 | 0x33, PD: pd, Access: access, Base: 0x40000, Buf: make([]byte, n)}
	if seed != 0 {
		rng := rand.New(rand.NewPCG(seed, 1))
		for i := range mr.Buf {
			mr.Buf[i] = byte(rng.Uint32())
		}
	}
	m[mr.STag] = mr
	return mr
}

type engineSide struct {
	q        *qp.QP
	scq, rcq *completion.CQ
	mem      mrTable
	events   []qp.Event
}

func newEngineSide(t *testing.T, pd uint32) *engineSide {
	s := &engineSide{mem: mrTable{}}
	var err error
	if s.scq, err = completion.New(completion.Options{Depth: 64}); err != nil {
		t.Fatal(err)
	}
	if s.rcq, err = completion.New(completion.Options{Depth: 64}); err != nil {
		t.Fatal(err)
	}
	s.q, err = qp.New(qp.Config{QPN: pd, PD: pd, SQDepth: 32, RQDepth: 32, IRD: 8, ORD: 8,
		SendCQ: s.scq, RecvCQ: s.rcq, Mem: s.mem, Events: func(e qp.Event) { s.events = append(s.events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func drain(cq *completion.CQ, into *[]completion.Completion) {
	out := make([]completion.Completion, 16)
	for {
		n := cq.Poll(out)
		if n == 0 {
			return
		}
		*into = append(*into, out[:n]...)
	}
}

// responder gives each passive connection an mpaConn for the listening
// side's QP.
type responder struct {
	llp *mpaConn
}

func (r *responder) Receive(c *tcp.Conn, b []byte) int { return r.llp.Receive(c, b) }
func (r *responder) Event(c *tcp.Conn, ev tcp.Event)   { r.llp.Event(c, ev) }
func (r *responder) Fill(c *tcp.Conn, dst []byte) int  { return r.llp.Fill(c, dst) }

// The QP engine over the TCP engine: MPA startup, then an RDMA Write of
// 1 MiB, a Send and an RDMA Read of 256 KiB across a link that loses and
// reorders segments; every octet placed where it belongs.
func TestQPOverTCPEngine(t *testing.T) {
	for _, crc := range []bool{true, false} {
		o := tcp.Options{Secret: [16]byte{9}}
		sa, err := tcp.NewStack(o)
		if err != nil {
			t.Fatal(err)
		}
		sb, _ := tcp.NewStack(o)
		lossy := func() *sim.Link {
			return &sim.Link{Delay: 2 * time.Millisecond, Loss: 0.01, Reorder: 0.01, Duplicate: 0.005}
		}
		n := sim.New(5, sa, sb, lossy(), lossy())
		a, b := newEngineSide(t, 1), newEngineSide(t, 2)
		cfg := mpa.Config{CRC: crc, IRD: 8, ORD: 8}

		const writeLen, readLen = 1 << 20, 256 << 10
		src := a.mem.reg(1, writeLen, 0, 11)
		sink := a.mem.reg(1, readLen, qp.LocalWrite, 0)
		msg := a.mem.reg(1, 64, 0, 12)
		dst := b.mem.reg(2, writeLen, qp.RemoteWrite, 0)
		rbuf := b.mem.reg(2, 64, qp.LocalWrite, 0)
		rsrc := b.mem.reg(2, readLen, qp.RemoteRead, 13)
		if err := b.q.PostRecv(&qp.RecvWR{ID: 100, SGL: []qp.SGE{{LKey: rbuf.STag, Addr: rbuf.Base, Length: 64}}}); err != nil {
			t.Fatal(err)
		}

		resp := &responder{llp: newMPAConn(b.q, cfg, false)}
		if _, err := sb.Listen(netip.Addr{}, 4791, resp); err != nil {
			t.Fatal(err)
		}
		init := newMPAConn(a.q, cfg, true)
		if _, err := sa.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, 4791), &responder{llp: init}); err != nil {
			t.Fatal(err)
		}
		if !n.Run(10*time.Second, func() bool { return init.Ready() && resp.llp.Ready() }) {
			t.Fatalf("MPA startup: initiator %v (%v), responder %v (%v)", init.Ready(), init.Err, resp.llp.Ready(), resp.llp.Err)
		}
		if init.Params.CRC != crc || resp.llp.Params.CRC != crc {
			t.Fatalf("CRC negotiated %v/%v, want %v", init.Params.CRC, resp.llp.Params.CRC, crc)
		}
		posts := []*qp.SendWR{
			{ID: 1, Op: qp.OpWrite, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: src.STag, Addr: src.Base, Length: writeLen}}, RemoteSTag: dst.STag, RemoteTO: dst.Base},
			{ID: 2, Op: qp.OpSend, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: msg.STag, Addr: msg.Base, Length: 64}}},
			{ID: 3, Op: qp.OpRead, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: sink.STag, Addr: sink.Base, Length: readLen}}, RemoteSTag: rsrc.STag, RemoteTO: rsrc.Base},
		}
		for _, wr := range posts {
			if err := a.q.PostSend(wr); err != nil {
				t.Fatal(err)
			}
		}
		init.Kick()
		var sc, rc []completion.Completion
		if !n.Run(5*time.Minute, func() bool {
			drain(a.scq, &sc)
			drain(b.rcq, &rc)
			return len(sc) == 3 && len(rc) == 1
		}) {
			t.Fatalf("crc=%v: completions send %+v recv %+v; events %v %v", crc, sc, rc, a.events, b.events)
		}
		for i, c := range sc {
			if c.Status != completion.Success || c.ID != uint64(i+1) {
				t.Fatalf("send completion %d: %+v", i, c)
			}
		}
		if rc[0].Status != completion.Success || rc[0].ByteLen != 64 {
			t.Fatalf("receive completion %+v", rc[0])
		}
		if !bytes.Equal(dst.Buf, src.Buf) || !bytes.Equal(rbuf.Buf, msg.Buf) || !bytes.Equal(sink.Buf, rsrc.Buf) {
			t.Fatalf("crc=%v: data differs (write %v, send %v, read %v)", crc,
				bytes.Equal(dst.Buf, src.Buf), bytes.Equal(rbuf.Buf, msg.Buf), bytes.Equal(sink.Buf, rsrc.Buf))
		}
		if n.AB.Stats.Lost+n.BA.Stats.Lost == 0 {
			t.Fatal("the link lost nothing: the test did not exercise retransmission")
		}
	}
}

// An initiator whose negotiation fails on the Reply (RFC 6581 §9: here
// no RTR in common) tells the responder in a Terminate before it
// closes, as the kernel datapath does; it used to reset the connection
// with nothing said.
func TestEngineNegotiationFailureTerminates(t *testing.T) {
	o := tcp.Options{Secret: [16]byte{9}}
	sa, err := tcp.NewStack(o)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := tcp.NewStack(o)
	if err != nil {
		t.Fatal(err)
	}
	link := func() *sim.Link { return &sim.Link{Delay: time.Millisecond} }
	n := sim.New(7, sa, sb, link(), link())
	a, b := newEngineSide(t, 1), newEngineSide(t, 2)
	resp := &responder{llp: newMPAConn(b.q, mpa.Config{CRC: true, IRD: 8, ORD: 8, PeerToPeer: true, RTR: mpa.RTRWrite}, false)}
	if _, err := sb.Listen(netip.Addr{}, 4791, resp); err != nil {
		t.Fatal(err)
	}
	init := newMPAConn(a.q, mpa.Config{CRC: true, IRD: 8, ORD: 8, PeerToPeer: true, RTR: mpa.RTRRead}, true)
	if _, err := sa.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, 4791), &responder{llp: init}); err != nil {
		t.Fatal(err)
	}
	got := func() bool {
		for _, e := range b.events {
			if e.Kind == qp.TerminateReceived {
				return true
			}
		}
		return false
	}
	if !n.Run(10*time.Second, got) {
		t.Fatalf("responder events %v; initiator error %v", b.events, init.Err)
	}
	if init.Ready() || !errors.Is(init.Err, ddp.LLPNoMatchingRTR) {
		t.Fatalf("initiator ready %v, error %v", init.Ready(), init.Err)
	}
	for _, e := range b.events {
		if e.Kind == qp.TerminateReceived && !errors.Is(e.Err, ddp.LLPNoMatchingRTR) {
			t.Fatalf("the Terminate says %v", e.Err)
		}
	}
}
