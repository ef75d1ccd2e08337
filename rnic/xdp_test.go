package rnic

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// Our two datapaths against each other on a real wire: a QP on the
// accelerated datapath (the TCP engine on AF_XDP, steered by the XDP
// program) in one namespace, a QP on the kernel-TCP datapath in the
// other. The kernel side connects, then Writes 1 MiB, Sends and Reads
// 256 KiB; every octet must land, with CRC on.
func TestQPOverXDPAgainstKernelDatapath(t *testing.T) {
	testenv.RequireRoot(t)
	for _, mode := range []bpf.Mode{bpf.ModeGeneric, bpf.ModeNative} {
		t.Run(mode.String(), func(t *testing.T) { testQPOverXDP(t, mode) })
	}
}

func testQPOverXDP(t *testing.T, mode bpf.Mode) {
	tp := topology.NewTest(t, topology.Options{MTU: 1500})
	var p *xdpnet.Poller
	if err := tp.B.Do(func() error {
		var err error
		p, err = xdpnet.NewPoller(xdpnet.Config{Interface: tp.B.Link, Addr: tp.B.Addr.Addr(), Mode: mode,
			TCP: tcp.Options{TimeWait: time.Second}})
		return err
	}); err != nil {
		t.Fatalf("poller: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-runErr:
		case <-time.After(10 * time.Second):
			t.Error("poller did not stop")
		}
		_ = p.Close()
	})

	// The engine side (B): the QP runs on the poller.
	const writeLen, readLen = 1 << 20, 256 << 10
	eng := newEngineSide(t, 2)
	dst := eng.mem.reg(2, writeLen, qp.RemoteWrite, 0)
	rbuf := eng.mem.reg(2, 64, qp.LocalWrite, 0)
	rsrc := eng.mem.reg(2, readLen, qp.RemoteRead, 13)
	if err := eng.q.PostRecv(&qp.RecvWR{ID: 100, SGL: []qp.SGE{{LKey: rbuf.STag, Addr: rbuf.Base, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	resp := &responder{llp: newMPAConn(eng.q, mpa.Config{CRC: true, IRD: 8, ORD: 8}, false)}
	if _, err := p.Listen(4791, resp); err != nil {
		t.Fatal(err)
	}

	// The kernel-datapath side (A).
	h := newHost(t)
	src := h.mr(writeLen, 0)
	for i := range src.Buf {
		src.Buf[i] = byte(i*7 + i>>9)
	}
	sink := h.mr(readLen, qp.LocalWrite)
	msg := h.mr(64, 0)
	copy(msg.Buf, "a Send across the two datapaths")
	q := h.qp(QPAttr{})
	if err := tp.A.Do(func() error {
		_, err := q.Connect(context.Background(), net.JoinHostPort(tp.B.Addr.Addr().String(), "4791"), ConnectOptions{Timeout: 10 * time.Second})
		return err
	}); err != nil {
		t.Fatalf("connect from the kernel datapath: %v", err)
	}
	if ev := <-q.Events(); ev.Kind != Established {
		t.Fatalf("first event %v", ev)
	}
	for _, wr := range []*qp.SendWR{
		{ID: 1, Op: qp.OpWrite, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: src.STag, Addr: 0x4000_0000, Length: writeLen}}, RemoteSTag: dst.STag, RemoteTO: dst.Base},
		{ID: 2, Op: qp.OpSend, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: msg.STag, Addr: 0x4000_0000, Length: 64}}},
		{ID: 3, Op: qp.OpRead, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: sink.STag, Addr: 0x4000_0000, Length: readLen}}, RemoteSTag: rsrc.STag, RemoteTO: rsrc.Base},
	} {
		must(t, q.PostSend(wr))
	}
	sc := wait(t, h.scq, 3)
	for i, c := range sc {
		if c.Status != completion.Success || c.ID != uint64(i+1) {
			t.Fatalf("kernel-side completion %d: %+v", i, c)
		}
	}
	rc := wait(t, eng.rcq, 1)
	drain(eng.rcq, &rc) // exactly one: nothing more may follow
	if len(rc) != 1 || rc[0].Status != completion.Success || rc[0].ByteLen != 64 {
		t.Fatalf("engine-side receive completions %+v", rc)
	}
	// The engine's buffers are written on the poller; read them there.
	var okWrite, okSend bool
	if err := p.Do(func(*tcp.Stack, tcp.Time) {
		okWrite = bytes.Equal(dst.Buf, src.Buf)
		okSend = bytes.Equal(rbuf.Buf, msg.Buf)
	}); err != nil {
		t.Fatal(err)
	}
	if !okWrite || !okSend || !bytes.Equal(sink.Buf, rsrc.Buf) {
		t.Fatalf("data differs: write %v, send %v, read %v", okWrite, okSend, bytes.Equal(sink.Buf, rsrc.Buf))
	}
	st, err := p.Steering().Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.SteeredFlow == 0 || st.RedirectFailed != 0 {
		t.Fatalf("steering: %+v", st)
	}
}
