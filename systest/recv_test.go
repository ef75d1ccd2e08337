package systest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// The xdp datapath's side of client's TestRecvPostedBeforeThePeersSend:
// an application on host B posts a receive and, once PostRecv returns, one
// on host A sends to it (the test orders the two, as a message on another
// connection would); the receive must be found, 300 rounds in a row, with
// the receiving EP's rings taken by its poller. Here the poller takes the
// ring at the start of every turn, long before a frame crosses the veth,
// so the test passed without the daemon's takeQueuedRecvs too: it holds the
// xdp datapath to the guarantee, which the kernel datapath's test caught
// being broken.
func TestXDPRecvPostedBeforeThePeersSend(t *testing.T) {
	net, _, sockA, sockB, _ := twoXDPDaemons(t)

	type app struct {
		ia                  *client.IA
		lmr                 *client.LMR
		recv, req, conn, cr *client.EVD
		ep                  *client.EP
	}
	open := func(sock string) *app {
		ia, err := client.Open(context.Background(), client.Options{Socket: sock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ia.Close() })
		a := &app{ia: ia}
		pz, err := ia.CreatePZ()
		if err != nil {
			t.Fatal(err)
		}
		buf, err := ia.Alloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		if a.lmr, err = pz.RegisterLMR(buf, client.LocalWrite); err != nil {
			t.Fatal(err)
		}
		for _, e := range []struct {
			p    **client.EVD
			kind client.EVDKind
		}{{&a.recv, client.DTOEvents}, {&a.req, client.DTOEvents}, {&a.conn, client.ConnectionEvents}, {&a.cr, client.CREvents}} {
			if *e.p, err = ia.CreateEVD(client.EVDOptions{Depth: 256, Kind: e.kind}); err != nil {
				t.Fatal(err)
			}
		}
		if a.ep, err = ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: a.recv, RequestEVD: a.req, ConnectEVD: a.conn, SQDepth: 64, RQDepth: 64}); err != nil {
			t.Fatal(err)
		}
		return a
	}
	wait := func(e *client.EVD, what string) client.Event {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ev, err := e.Wait(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return ev
	}
	a, b := open(sockA), open(sockB)
	const port = 19301
	if _, err := b.ia.CreatePSP(port, b.cr, false); err != nil {
		t.Fatal(err)
	}
	if err := a.ep.Connect(fmt.Sprintf("%s:%d", net.B.Addr.Addr(), port), nil, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := wait(b.cr, "connection request").CR.Accept(b.ep, nil); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*app{a, b} {
		if ev := wait(x.conn, "connection"); ev.Conn != client.Established {
			t.Fatalf("connect: %v", ev.Conn)
		}
	}
	for i := range 300 {
		if err := b.ep.PostRecv(uint64(i), []client.Segment{{LMR: b.lmr, Length: 8}}); err != nil {
			t.Fatal(err)
		}
		if err := a.ep.PostSend(uint64(i), []client.Segment{{LMR: a.lmr, Length: 8}}, client.Signaled); err != nil {
			t.Fatal(err)
		}
		if ev := wait(b.recv, "receive"); ev.Status != completion.Success || ev.Cookie != uint64(i) {
			t.Fatalf("round %d: receive %+v", i, ev)
		}
		if ev := wait(a.req, "send"); ev.Status != completion.Success {
			t.Fatalf("round %d: send %+v", i, ev)
		}
	}
}
