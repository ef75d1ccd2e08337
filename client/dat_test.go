package client_test

// The 17 testable requirements of digest 003 §7 (DAPL endpoint
// management), each through the client package against a real daemon.

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/testenv"
)

func addr(port uint16) string { return net.JoinHostPort("127.0.0.1", itoa(port)) }

// connectPair connects a fresh client EP to a fresh server EP through a PSP.
func connectPair(t *testing.T, server, cli *app, prep func(sep, cep *client.EP)) (sep, cep *client.EP, psp *client.PSP) {
	t.Helper()
	port := freePort(t)
	psp, err := server.ia.CreatePSP(port, server.cr, false)
	must(t, err)
	sep, cep = server.ep(t), cli.ep(t)
	if prep != nil {
		prep(sep, cep)
	}
	must(t, cep.Connect(addr(port), []byte("client"), 10*time.Second))
	ev := wait(t, server.cr)
	must(t, ev.CR.Accept(sep, []byte("server")))
	for _, a := range []*app{server, cli} {
		if ev := wait(t, a.conn); ev.Conn != client.Established {
			t.Fatalf("connect: %v", ev.Conn)
		}
	}
	return sep, cep, psp
}

// noMore checks that an EVD holds no further event.
func noMore(t *testing.T, e *client.EVD, what string) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	if ev, ok, _ := e.Dequeue(); ok {
		t.Fatalf("%s: unexpected event %+v", what, ev)
	}
}

func state(t *testing.T, ep *client.EP) client.EPState {
	t.Helper()
	s, err := ep.State()
	must(t, err)
	return s
}

// 1. ep_create with a NULL PZ: UNCONNECTED with no QP; connect and posts
// fail until ep_modify sets a PZ.
func TestDAT01NoPZNoQP(t *testing.T) {
	sock, _ := startDaemon(t)
	a := newApp(t, sock, "a")
	ep, err := a.ia.CreateEP(client.EPAttr{ConnectEVD: a.conn})
	must(t, err)
	info, err := ep.Query()
	must(t, err)
	if info.State != client.Unconnected || info.HasQP {
		t.Fatalf("%+v", info)
	}
	if err := ep.Connect(addr(freePort(t)), nil, time.Second); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("connect without a PZ: %v", err)
	}
	if err := ep.PostRecv(1, []client.Segment{{LMR: a.lmr, Length: 8}}); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("post without a QP: %v", err)
	}
	must(t, ep.Modify(ctl.ModifyPZ|ctl.ModifyEVDs|ctl.ModifyDepths, client.EPAttr{PZ: a.pz, RecvEVD: a.recv, RequestEVD: a.req, ConnectEVD: a.conn, SQDepth: 8, RQDepth: 8}))
	if info, _ := ep.Query(); !info.HasQP {
		t.Fatal("no QP after setting a PZ")
	}
	must(t, ep.PostRecv(1, []client.Segment{{LMR: a.lmr, Length: 8}}))
}

// 2. With a PZ, receives posted while UNCONNECTED catch a Send the peer
// makes right after ESTABLISHED.
func TestDAT02PrePostedReceives(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	_, cep, _ := connectPair(t, server, cli, func(sep, _ *client.EP) {
		must(t, sep.PostRecv(7, []client.Segment{{LMR: server.lmr, Length: 64}}))
	})
	copy(cli.buf.Bytes, "first")
	must(t, cep.PostSend(1, []client.Segment{{LMR: cli.lmr, Length: 5}}, 0))
	if ev := wait(t, server.recv); ev.Cookie != 7 || ev.Length != 5 || ev.Status != completion.Success {
		t.Fatalf("%+v", ev)
	}
}

// 3. A PZ change in UNCONNECTED replaces the QP; in CONNECTED it is
// INVALID_STATE; changing an immutable field is INVALID_PARAMETER.
func TestDAT03ModifyPZ(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	pz1, err := cli.ia.CreatePZ()
	must(t, err)
	pz2, err := cli.ia.CreatePZ()
	must(t, err)
	ep, err := cli.ia.CreateEP(client.EPAttr{PZ: pz1, RecvEVD: cli.recv, RequestEVD: cli.req, ConnectEVD: cli.conn, SQDepth: 64, RQDepth: 64})
	must(t, err)
	if err := pz1.Free(); err == nil {
		t.Fatal("freed the PZ of a live EP")
	}
	must(t, ep.Modify(ctl.ModifyPZ, client.EPAttr{PZ: pz2}))
	// The old PZ is no longer referenced: it can be freed.
	must(t, pz1.Free())
	if err := ep.Modify(ctl.ModifyImmutable, client.EPAttr{}); !errors.Is(err, client.ErrInvalidParameter) {
		t.Fatalf("immutable field: %v", err)
	}
	_, cep, _ := connectPair(t, server, cli, nil)
	if err := cep.Modify(ctl.ModifyPZ, client.EPAttr{PZ: pz2}); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("PZ change while connected: %v", err)
	}
}

// 4. ep_connect from any state but UNCONNECTED is INVALID_STATE; right
// after the call the EP reads ACTIVE_CONNECTION_PENDING.
func TestDAT04ConnectState(t *testing.T) {
	server, cli, port := listeningPair(t)
	cep := cli.ep(t)
	must(t, cep.Connect(addr(port), nil, 10*time.Second))
	// The server has not accepted: the connection cannot be up.
	if s := state(t, cep); s != client.ActivePending {
		t.Fatalf("after Connect: %v", s)
	}
	if err := cep.Connect(addr(port), nil, time.Second); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("second connect: %v", err)
	}
	ev := wait(t, server.cr)
	must(t, ev.CR.Accept(server.ep(t), nil))
	wait(t, cli.conn)
	if err := cep.Connect(addr(port), nil, time.Second); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("connect while connected: %v", err)
	}
}

// 5. One handshake: exactly one CONNECTION_REQUEST with the client's
// private data (up to 252 octets with the IRD/ORD words), one ESTABLISHED
// per side.
func TestDAT05OneRequestOneEstablished(t *testing.T) {
	server, cli, port := listeningPair(t)
	pd := make([]byte, server.ia.Attr().MaxPrivate)
	for i := range pd {
		pd[i] = byte(i)
	}
	cep := cli.ep(t)
	must(t, cep.Connect(addr(port), pd, 10*time.Second))
	ev := wait(t, server.cr)
	info, err := ev.CR.Query()
	must(t, err)
	if string(info.PrivateData) != string(pd) {
		t.Fatalf("private data of %d octets, sent %d", len(info.PrivateData), len(pd))
	}
	must(t, ev.CR.Accept(server.ep(t), nil))
	wait(t, server.conn)
	wait(t, cli.conn)
	noMore(t, server.cr, "server CR EVD")
	noMore(t, server.conn, "server connect EVD")
	noMore(t, cli.conn, "client connect EVD")
	// One octet more is refused, on an EP that could otherwise connect.
	if err := cli.ep(t).Connect(addr(port), make([]byte, len(pd)+1), time.Second); !errors.Is(err, client.ErrInvalidParameter) {
		t.Fatalf("oversized private data: %v", err)
	}
}

// 6. A connect timeout gives one terminal event (TIMED_OUT, EP
// DISCONNECTED), never a late ESTABLISHED, and flushes the receives.
func TestDAT06ConnectTimeout(t *testing.T) {
	sock, _ := startDaemon(t)
	cli := newApp(t, sock, "c")
	// A TCP server that never answers the MPA Request.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	cep := cli.ep(t)
	must(t, cep.PostRecv(3, []client.Segment{{LMR: cli.lmr, Length: 8}}))
	must(t, cep.Connect(l.Addr().String(), nil, 200*time.Millisecond))
	if ev := wait(t, cli.conn); ev.Conn != client.TimedOut {
		t.Fatalf("%v", ev.Conn)
	}
	if s := state(t, cep); s != client.DisconnectedState {
		t.Fatalf("after timeout: %v", s)
	}
	if ev := wait(t, cli.recv); ev.Cookie != 3 || ev.Status != completion.FlushError {
		t.Fatalf("receive after timeout: %+v", ev)
	}
	noMore(t, cli.conn, "connect EVD after the timeout")
}

// 7. Timers: connects whose timeout races the server's accept each end in
// exactly one terminal connection event (run under -race).
func TestDAT07TimeoutRace(t *testing.T) {
	server, cli, port := listeningPair(t)
	go func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ev, err := server.cr.Wait(ctx)
			cancel()
			if err != nil {
				return
			}
			ep, err := server.ia.CreateEP(client.EPAttr{PZ: server.pz, RecvEVD: server.recv, RequestEVD: server.req, ConnectEVD: server.conn, SQDepth: 4, RQDepth: 4})
			if err != nil {
				return
			}
			_ = ev.CR.Accept(ep, nil)
		}
	}()
	for i := 0; i < 10; i++ {
		cep := cli.ep(t)
		must(t, cep.Connect(addr(port), nil, time.Duration(1+i%3)*time.Millisecond))
		ev := wait(t, cli.conn)
		switch ev.Conn {
		case client.Established:
			must(t, cep.Disconnect(false))
			if ev := wait(t, cli.conn); ev.Conn != client.Disconnected && ev.Conn != client.Broken {
				t.Fatalf("after abort: %v", ev.Conn)
			}
		case client.TimedOut, client.NonPeerRejected:
		default:
			t.Fatalf("attempt %d: %v", i, ev.Conn)
		}
		noMore(t, cli.conn, "after one terminal event")
	}
}

// 8. Freeing a PZ or EVD fails while an EP uses it; after ep_free it works.
func TestDAT08Refcounts(t *testing.T) {
	sock, _ := startDaemon(t)
	a := newApp(t, sock, "a")
	pz, err := a.ia.CreatePZ()
	must(t, err)
	evd, err := a.ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.DTOEvents})
	must(t, err)
	ep, err := a.ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: evd, RequestEVD: evd, ConnectEVD: a.conn, SQDepth: 4, RQDepth: 4})
	must(t, err)
	if err := pz.Free(); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("free PZ in use: %v", err)
	}
	if err := evd.Free(); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("free EVD in use: %v", err)
	}
	must(t, ep.Free())
	must(t, evd.Free())
	must(t, pz.Free())
}

// 9. PSP with the provider flag: the request comes with an EP in
// TENTATIVE_CONNECTION_PENDING and no QP; accept fails until a PZ is set.
func TestDAT09ProviderEP(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	port := freePort(t)
	_, err := server.ia.CreatePSP(port, server.cr, true)
	must(t, err)
	cep := cli.ep(t)
	must(t, cep.Connect(addr(port), nil, 10*time.Second))
	ev := wait(t, server.cr)
	if ev.CR.EP == nil {
		t.Fatal("no provider EP")
	}
	info, err := ev.CR.EP.Query()
	must(t, err)
	if info.State != client.TentativePending || info.HasQP {
		t.Fatalf("provider EP %+v", info)
	}
	if err := ev.CR.Accept(nil, nil); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("accept without a PZ: %v", err)
	}
	must(t, ev.CR.EP.Modify(ctl.ModifyPZ|ctl.ModifyEVDs|ctl.ModifyDepths, client.EPAttr{PZ: server.pz, RecvEVD: server.recv,
		RequestEVD: server.req, ConnectEVD: server.conn, SQDepth: 8, RQDepth: 8}))
	must(t, ev.CR.Accept(nil, nil))
	if ev := wait(t, server.conn); ev.Conn != client.Established {
		t.Fatalf("%v", ev.Conn)
	}
	wait(t, cli.conn)
}

// 10. An RSP accepts exactly one connection; after psp_free new requests
// are refused and existing connections survive.
func TestDAT10RSPAndPSPFree(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	port := freePort(t)
	rep := server.ep(t)
	_, err := server.ia.CreateRSP(port, rep, server.cr)
	must(t, err)
	if s := state(t, rep); s != client.Reserved {
		t.Fatalf("RSP EP: %v", s)
	}
	c1 := cli.ep(t)
	must(t, c1.Connect(addr(port), nil, 10*time.Second))
	ev := wait(t, server.cr)
	if ev.CR.EP != rep {
		t.Fatal("request not for the reserved EP")
	}
	must(t, ev.CR.Accept(nil, nil))
	wait(t, server.conn)
	wait(t, cli.conn)
	c2 := cli.ep(t)
	must(t, c2.Connect(addr(port), nil, 2*time.Second))
	if ev := wait(t, cli.conn); ev.Conn == client.Established {
		t.Fatal("a second connection through the RSP")
	}

	// PSP free: the connection made through it stays.
	port2 := freePort(t)
	psp, err := server.ia.CreatePSP(port2, server.cr, false)
	must(t, err)
	c3 := cli.ep(t)
	must(t, c3.Connect(addr(port2), nil, 10*time.Second))
	ev = wait(t, server.cr)
	s3 := server.ep(t)
	must(t, ev.CR.Accept(s3, nil))
	wait(t, server.conn)
	wait(t, cli.conn)
	must(t, psp.Free())
	c4 := cli.ep(t)
	must(t, c4.Connect(addr(port2), nil, 2*time.Second))
	if ev := wait(t, cli.conn); ev.Conn == client.Established {
		t.Fatal("connected through a freed PSP")
	}
	must(t, s3.PostRecv(1, []client.Segment{{LMR: server.lmr, Length: 8}}))
	must(t, c3.PostSend(1, []client.Segment{{LMR: cli.lmr, Length: 8}}, 0))
	if ev := wait(t, server.recv); ev.Status != completion.Success {
		t.Fatalf("connection after PSP free: %+v", ev)
	}
}

// 11 and 12. Disconnect: CONNECTED -> DISCONNECTED with one DISCONNECTED
// event per side, a repeat is a no-op; graceful lets posted sends finish,
// abrupt flushes what is outstanding.
func TestDAT11And12Disconnect(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	sep, cep, _ := connectPair(t, server, cli, func(sep, _ *client.EP) {
		for i := 0; i < 40; i++ {
			must(t, sep.PostRecv(uint64(i), []client.Segment{{LMR: server.lmr, Offset: uint64(i) * 4096, Length: 4096}}))
		}
	})
	for i := 0; i < 32; i++ {
		must(t, cep.PostSend(uint64(i), []client.Segment{{LMR: cli.lmr, Length: 4096}}, client.Signaled))
	}
	must(t, cep.Disconnect(true))
	for i := 0; i < 32; i++ {
		if ev := wait(t, cli.req); ev.Status != completion.Success {
			t.Fatalf("send %d under a graceful disconnect: %+v", i, ev)
		}
	}
	if ev := wait(t, cli.conn); ev.Conn != client.Disconnected {
		t.Fatalf("client: %v", ev.Conn)
	}
	if ev := wait(t, server.conn); ev.Conn != client.Disconnected {
		t.Fatalf("server: %v", ev.Conn)
	}
	for i := 0; i < 40; i++ {
		ev := wait(t, server.recv)
		if want := completion.Success; i >= 32 {
			want = completion.FlushError
			if ev.Status != want {
				t.Fatalf("receive %d: %v", i, ev.Status)
			}
		} else if ev.Status != want {
			t.Fatalf("receive %d: %v", i, ev.Status)
		}
	}
	must(t, cep.Disconnect(true)) // no-op
	must(t, sep.Disconnect(false))
	noMore(t, cli.conn, "client after repeat")
	noMore(t, server.conn, "server after repeat")
	if s := state(t, cep); s != client.DisconnectedState {
		t.Fatalf("%v", s)
	}

	// Abrupt: the side that asked sees DISCONNECTED too (the QP's own
	// end is an abort), its outstanding sends flushed; the peer, whose
	// connection was reset under it, sees BROKEN.
	_, cep, _ = connectPair(t, server, cli, func(sep, _ *client.EP) {
		// Receives for the Sends: without, the server would end the
		// connection with a Terminate before the client's disconnect.
		for i := 0; i < 8; i++ {
			must(t, sep.PostRecv(uint64(200+i), []client.Segment{{LMR: server.lmr, Offset: uint64(i) * 4096, Length: 4096}}))
		}
	})
	for i := 0; i < 8; i++ {
		must(t, cep.PostSend(uint64(100+i), []client.Segment{{LMR: cli.lmr, Length: 4096}}, client.Signaled))
	}
	must(t, cep.Disconnect(false))
	if ev := wait(t, cli.conn); ev.Conn != client.Disconnected {
		t.Fatalf("client after its abrupt disconnect: %v", ev.Conn)
	}
	if ev := wait(t, server.conn); ev.Conn != client.Broken && ev.Conn != client.Disconnected {
		t.Fatalf("server after the client's abrupt disconnect: %v", ev.Conn)
	}
}

// A connection that ends without its consumer asking is in the daemon's
// log, with its addresses and how it ended: the peer's graceful
// disconnect at Info, the peer's reset at Warn with the cause. The side
// that asked logs nothing.
func TestDaemonLogsConnectionsThePeerEnded(t *testing.T) {
	var logs testenv.Buffer
	sock, _ := startDaemonLogging(t, &logs)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	ended := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, `msg="connection ended"`) {
				out = append(out, l)
			}
		}
		return out
	}
	_, cep, _ := connectPair(t, server, cli, nil)
	must(t, cep.Disconnect(true))
	wait(t, cli.conn)
	wait(t, server.conn)
	lines := ended()
	if len(lines) != 1 || !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], "how=disconnected") ||
		!strings.Contains(lines[0], "remote=127.0.0.1:") {
		t.Fatalf("after the client's graceful disconnect, want one Info line for the server's EP: %q", lines)
	}
	_, cep, _ = connectPair(t, server, cli, nil)
	must(t, cep.Disconnect(false))
	wait(t, cli.conn)
	wait(t, server.conn)
	lines = ended()
	if len(lines) != 2 || !strings.Contains(lines[1], "level=WARN") || !strings.Contains(lines[1], "how=broken") ||
		!strings.Contains(lines[1], "reset") {
		t.Fatalf("after the client's abrupt disconnect, want a Warn line naming the reset: %q", lines)
	}
	// An EP freed while connected is its consumer's abort (perftest's
	// way out): the peer's side is a reset, this side nothing.
	_, cep, _ = connectPair(t, server, cli, nil)
	must(t, cep.Free())
	wait(t, server.conn)
	deadline := time.Now().Add(10 * time.Second)
	for len(ended()) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a line for the freed side would come now
	lines = ended()
	if len(lines) != 3 || !strings.Contains(lines[2], "reset") || strings.Contains(strings.Join(lines, "\n"), "aborted locally") {
		t.Fatalf("after the client freed its connected EP, want one line, the server's reset: %q", lines)
	}
}

// MPA attributes out of range are refused at CreateEP, before anything
// reaches the wire; ParseRTR reads the tools' spelling.
func TestEPMPAAttributesChecked(t *testing.T) {
	sock, _ := startDaemon(t)
	cli := newApp(t, sock, "c")
	pz, err := cli.ia.CreatePZ()
	must(t, err)
	for _, a := range []client.EPAttr{{MPARevision: 3}, {PeerToPeer: true, RTR: 8}} {
		a.PZ, a.RecvEVD, a.RequestEVD, a.ConnectEVD, a.SQDepth, a.RQDepth = pz, cli.recv, cli.req, cli.conn, 4, 4
		if _, err := cli.ia.CreateEP(a); !errors.Is(err, client.ErrInvalidParameter) {
			t.Errorf("MPA revision %d, RTR %d: %v, want INVALID_PARAMETER", a.MPARevision, a.RTR, err)
		}
	}
	if r, err := client.ParseRTR("read, write"); err != nil || r != client.RTRRead|client.RTRWrite {
		t.Errorf("ParseRTR: %v %v", r, err)
	}
	if _, err := client.ParseRTR("write,"); err == nil {
		t.Error("ParseRTR took an empty name")
	}
}

// 13. Disconnecting an UNCONNECTED EP flushes its receives; it stays
// UNCONNECTED.
func TestDAT13DisconnectUnconnectedFlushes(t *testing.T) {
	sock, _ := startDaemon(t)
	a := newApp(t, sock, "a")
	ep := a.ep(t)
	for i := 0; i < 3; i++ {
		must(t, ep.PostRecv(uint64(i), []client.Segment{{LMR: a.lmr, Length: 8}}))
	}
	must(t, ep.Disconnect(true))
	for i := 0; i < 3; i++ {
		if ev := wait(t, a.recv); ev.Status != completion.FlushError || ev.Cookie != uint64(i) {
			t.Fatalf("%+v", ev)
		}
	}
	if s := state(t, ep); s != client.Unconnected {
		t.Fatalf("%v", s)
	}
	noMore(t, a.conn, "connect EVD")
	must(t, ep.PostRecv(9, []client.Segment{{LMR: a.lmr, Length: 8}}))
}

// 14. ep_free while CONNECTED aborts the connection (the peer sees it); in
// RESERVED it is INVALID_STATE.
func TestDAT14FreeConnected(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	_, cep, _ := connectPair(t, server, cli, nil)
	must(t, cep.Free())
	if ev := wait(t, server.conn); ev.Conn != client.Broken && ev.Conn != client.Disconnected {
		t.Fatalf("peer of a freed EP: %v", ev.Conn)
	}
	rep := server.ep(t)
	_, err := server.ia.CreateRSP(freePort(t), rep, server.cr)
	must(t, err)
	if err := rep.Free(); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("free a RESERVED EP: %v", err)
	}
}

// 15 and 16. ep_reset takes DISCONNECTED to UNCONNECTED and the EP
// connects again; ep_query reports the addresses when connected.
func TestDAT15And16ResetAndQuery(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	_, cep, _ := connectPair(t, server, cli, nil)
	info, err := cep.Query()
	must(t, err)
	if host, _, err := net.SplitHostPort(info.RemoteAddr); err != nil || host != "127.0.0.1" || info.LocalAddr == "" {
		t.Fatalf("query: %+v", info)
	}
	if err := cep.Reset(); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("reset while connected: %v", err)
	}
	must(t, cep.Disconnect(false))
	wait(t, cli.conn)
	wait(t, server.conn)
	must(t, cep.Reset())
	port := freePort(t)
	_, err = server.ia.CreatePSP(port, server.cr, false)
	must(t, err)
	must(t, cep.Connect(addr(port), nil, 10*time.Second))
	ev := wait(t, server.cr)
	must(t, ev.CR.Accept(server.ep(t), nil))
	if ev := wait(t, cli.conn); ev.Conn != client.Established {
		t.Fatalf("after reset: %v", ev.Conn)
	}
}

// 17. The DTO fast path does not allocate.
func TestDAT17PostDoesNotAllocate(t *testing.T) {
	sock, _ := startDaemon(t)
	a := newApp(t, sock, "a")
	ep, err := a.ia.CreateEP(client.EPAttr{PZ: a.pz, RecvEVD: a.recv, RequestEVD: a.req, ConnectEVD: a.conn, SQDepth: 4, RQDepth: 1024})
	must(t, err)
	segs := []client.Segment{{LMR: a.lmr, Length: 64}}
	allocs := testing.AllocsPerRun(500, func() {
		_ = ep.PostRecv(1, segs)
	})
	if allocs != 0 {
		t.Fatalf("PostRecv allocates %.1f times", allocs)
	}
}

// The remaining connection events an application sees on connect:
// PEER_REJECTED with the peer's private data, and NON_PEER_REJECTED from a
// port nobody listens on (the host answered: not UNREACHABLE).
func TestRejectedAndUnreachable(t *testing.T) {
	server, cli, port := listeningPair(t)
	cep := cli.ep(t)
	must(t, cep.Connect(addr(port), []byte("please"), 10*time.Second))
	ev := wait(t, server.cr)
	must(t, ev.CR.Reject([]byte("not today")))
	if ev := wait(t, cli.conn); ev.Conn != client.PeerRejected {
		t.Fatalf("rejected: %v", ev.Conn)
	}
	info, err := cep.Query()
	must(t, err)
	if info.State != client.DisconnectedState || string(info.PrivateData) != "not today" {
		t.Fatalf("after reject: %+v", info)
	}
	if err := ev.CR.Accept(server.ep(t), nil); !errors.Is(err, client.ErrInvalidHandle) {
		t.Fatalf("accept after reject: %v", err)
	}

	must(t, cep.Reset())
	must(t, cep.Connect(addr(freePort(t)), nil, 10*time.Second)) // nobody listens
	if ev := wait(t, cli.conn); ev.Conn != client.NonPeerRejected {
		t.Fatalf("closed port: %v, want NON_PEER_REJECTED", ev.Conn)
	}
}

// listeningPair is a daemon with two applications, the server one
// listening on a free port with a PSP.
func listeningPair(t *testing.T) (server, cli *app, port uint16) {
	sock, _ := startDaemon(t)
	server, cli = newApp(t, sock, "s"), newApp(t, sock, "c")
	port = freePort(t)
	_, err := server.ia.CreatePSP(port, server.cr, false)
	must(t, err)
	return server, cli, port
}

// A refused ep_modify leaves the EP working as before: its QP, and the
// rings the application posts to, are the ones it had.
func TestRefusedModifyKeepsEP(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	_, cep, _ := connectPair(t, server, cli, func(sep, cep *client.EP) {
		// A connection EVD cannot take receive completions.
		err := cep.Modify(ctl.ModifyEVDs, client.EPAttr{RecvEVD: cli.conn, RequestEVD: cli.req, ConnectEVD: cli.conn})
		if err == nil {
			t.Fatal("modify with a connection EVD for receives succeeded")
		}
		must(t, sep.PostRecv(3, []client.Segment{{LMR: server.lmr, Length: 64}}))
	})
	copy(cli.buf.Bytes, "still here")
	must(t, cep.PostSend(9, []client.Segment{{LMR: cli.lmr, Length: 10}}, client.Signaled))
	if ev := wait(t, cli.req); ev.Status != completion.Success || ev.Cookie != 9 {
		t.Fatalf("send after a refused modify: %+v", ev)
	}
	if ev := wait(t, server.recv); ev.Status != completion.Success || string(server.buf.Bytes[:ev.Length]) != "still here" {
		t.Fatalf("receive after a refused modify: %+v %q", ev, server.buf.Bytes[:10])
	}
}

// A receive is posted once PostRecv returns, as in verbs, even though the
// daemon takes it from the client's ring later: a Send that the peer makes
// right after, because of something that followed the PostRecv (here the
// test itself, across two sessions), finds it and completes instead of
// breaking the connection with "no buffer". 300 rounds: before the daemon
// took queued receives ahead of what arrived, every run failed within its
// first hundred.
func TestRecvPostedBeforeThePeersSend(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "s"), newApp(t, sock, "c")
	sep, cep, _ := connectPair(t, server, cli, nil)
	for i := range 300 {
		must(t, sep.PostRecv(uint64(i), []client.Segment{{LMR: server.lmr, Length: 8}}))
		must(t, cep.PostSend(uint64(i), []client.Segment{{LMR: cli.lmr, Length: 8}}, client.Signaled))
		if ev := wait(t, server.recv); ev.Status != completion.Success || ev.Cookie != uint64(i) {
			t.Fatalf("round %d: receive %+v", i, ev)
		}
		if ev := wait(t, cli.req); ev.Status != completion.Success {
			t.Fatalf("round %d: send %+v", i, ev)
		}
	}
}
