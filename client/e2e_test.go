package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/daemon"
)

// startDaemon runs a daemon on the loopback interface with its socket in a
// temporary directory; both test applications talk to it, and its RNIC
// connects to itself over 127.0.0.1.
func startDaemon(t testing.TB) (string, *daemon.Server) {
	t.Helper()
	return startDaemonLogging(t, io.Discard)
}

// startDaemonLogging is startDaemon with the daemon's log, at Info and
// above, written to log.
func startDaemonLogging(t testing.TB, log io.Writer) (string, *daemon.Server) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "lo.sock")
	srv, err := daemon.New(daemon.Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return sock, srv
}

func freePort(t testing.TB) uint16 {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

type app struct {
	ia                  *client.IA
	pz                  *client.PZ
	buf                 *client.Buffer
	lmr                 *client.LMR
	recv, req, conn, cr *client.EVD
}

func newApp(t testing.TB, sock, name string) *app {
	t.Helper()
	ctx := context.Background()
	ia, err := client.Open(ctx, client.Options{Socket: sock, Name: name})
	must(t, err)
	t.Cleanup(func() { ia.Close() })
	a := &app{ia: ia}
	a.pz, err = ia.CreatePZ()
	must(t, err)
	a.buf, err = ia.Alloc(1 << 20)
	must(t, err)
	a.lmr, err = a.pz.RegisterLMR(a.buf, client.LocalWrite|client.RemoteWrite|client.RemoteRead|client.RemoteAtomic)
	must(t, err)
	for _, e := range []struct {
		p    **client.EVD
		kind client.EVDKind
	}{{&a.recv, client.DTOEvents}, {&a.req, client.DTOEvents}, {&a.conn, client.ConnectionEvents}, {&a.cr, client.CREvents}} {
		*e.p, err = ia.CreateEVD(client.EVDOptions{Depth: 256, Kind: e.kind})
		must(t, err)
	}
	return a
}

func (a *app) ep(t testing.TB) *client.EP {
	t.Helper()
	ep, err := a.ia.CreateEP(client.EPAttr{PZ: a.pz, RecvEVD: a.recv, RequestEVD: a.req, ConnectEVD: a.conn, SQDepth: 64, RQDepth: 64, IRD: 8, ORD: 8})
	must(t, err)
	return ep
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wait(t testing.TB, e *client.EVD) client.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev, err := e.Wait(ctx)
	must(t, err)
	return ev
}

func TestEndToEnd(t *testing.T) {
	sock, srv := startDaemon(t)
	port := freePort(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")

	psp, err := server.ia.CreatePSP(port, server.cr, false)
	must(t, err)
	sep := server.ep(t)
	// A receive posted before anything is connected catches the first Send.
	must(t, sep.PostRecv(1, []client.Segment{{LMR: server.lmr, Offset: 0, Length: 4096}}))

	cep := cli.ep(t)
	must(t, cep.Connect(net.JoinHostPort("127.0.0.1", itoa(port)), []byte("hello from the client"), 10*time.Second))
	if st, _ := cep.State(); st != client.ActivePending && st != client.Connected {
		t.Fatalf("client EP right after Connect: %v", st)
	}
	ev := wait(t, server.cr)
	if ev.Type != client.ConnectionRequest || ev.CR == nil {
		t.Fatalf("server got %+v", ev)
	}
	info, err := ev.CR.Query()
	must(t, err)
	if string(info.PrivateData) != "hello from the client" {
		t.Fatalf("private data %q", info.PrivateData)
	}
	must(t, ev.CR.Accept(sep, []byte("welcome")))
	if ev := wait(t, server.conn); ev.Conn != client.Established || ev.EP != sep {
		t.Fatalf("server: %+v", ev)
	}
	if ev := wait(t, cli.conn); ev.Conn != client.Established || ev.EP != cep {
		t.Fatalf("client: %+v", ev)
	}
	ci, err := cep.Query()
	must(t, err)
	if ci.State != client.Connected || string(ci.PrivateData) != "welcome" {
		t.Fatalf("client EP %+v", ci)
	}

	// Send, RDMA Write, RDMA Read, fetch-add.
	copy(cli.buf.Bytes, "a message over shared rings")
	must(t, cep.PostSend(10, []client.Segment{{LMR: cli.lmr, Length: 27}}, client.Signaled))
	for i := range cli.buf.Bytes[100000:200000] {
		cli.buf.Bytes[100000+i] = byte(i * 7)
	}
	must(t, cep.PostWrite(11, []client.Segment{{LMR: cli.lmr, Offset: 100000, Length: 100000}},
		client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(300000)}, client.Signaled))
	copy(server.buf.Bytes[600000:], "read me back")
	must(t, cep.PostRead(12, client.Segment{LMR: cli.lmr, Offset: 500000, Length: 12},
		client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(600000)}, client.Signaled))
	must(t, cep.PostFetchAdd(13, client.Segment{LMR: cli.lmr, Offset: 700000, Length: 8},
		client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(800000)}, 5, client.Signaled))
	for want := uint64(10); want <= 13; want++ {
		ev := wait(t, cli.req)
		if ev.Type != client.DTOCompletion || ev.Cookie != want || ev.Status != completion.Success {
			t.Fatalf("client completion %+v, want cookie %d", ev, want)
		}
	}
	if ev := wait(t, server.recv); ev.Cookie != 1 || ev.Length != 27 || ev.Opcode != completion.OpRecv {
		t.Fatalf("server receive %+v", ev)
	}
	if string(server.buf.Bytes[:27]) != "a message over shared rings" {
		t.Fatalf("received %q", server.buf.Bytes[:27])
	}
	if !bytes.Equal(server.buf.Bytes[300000:400000], cli.buf.Bytes[100000:200000]) {
		t.Fatal("RDMA Write data differs")
	}
	if string(cli.buf.Bytes[500000:500012]) != "read me back" {
		t.Fatalf("RDMA Read got %q", cli.buf.Bytes[500000:500012])
	}
	if server.buf.Bytes[800000] != 5 {
		t.Fatalf("fetch-add target %d", server.buf.Bytes[800000])
	}

	// Graceful disconnect: one DISCONNECTED on each side.
	must(t, cep.Disconnect(true))
	if ev := wait(t, cli.conn); ev.Conn != client.Disconnected {
		t.Fatalf("client: %v", ev.Conn)
	}
	if ev := wait(t, server.conn); ev.Conn != client.Disconnected {
		t.Fatalf("server: %v", ev.Conn)
	}
	// A repeat disconnect is a no-op; reset makes the EP usable again.
	must(t, cep.Disconnect(true))
	must(t, cep.Reset())
	if st, _ := cep.State(); st != client.Unconnected {
		t.Fatalf("after reset: %v", st)
	}
	must(t, psp.Free())
	must(t, sep.Free())
	must(t, cep.Free())
	if err := sep.Free(); !errors.Is(err, client.ErrInvalidHandle) {
		t.Fatalf("double free: %v", err)
	}
	_ = srv
}

func itoa(p uint16) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + p%10)}, b...)
		p /= 10
		if p == 0 {
			return string(b)
		}
	}
}
