package client_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// tcpPair is a TCP connection over 127.0.0.1: the accepted end and the
// dialed end, both the test's own sockets.
func tcpPair(t *testing.T) (srv, cli *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	must(t, err)
	defer ln.Close()
	c, err := net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	must(t, err)
	s, err := ln.AcceptTCP()
	must(t, err)
	t.Cleanup(func() { c.Close(); s.Close() })
	return s, c
}

// streamRounds exchanges rounds of random-sized messages both ways on the
// two sockets, as a protocol negotiating before RDMA would, and checks
// each direction's stream by SHA-256.
func streamRounds(t *testing.T, a, b *net.TCPConn, rounds int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range rounds {
		for _, dir := range [][2]*net.TCPConn{{a, b}, {b, a}} {
			msg := make([]byte, 1+rng.IntN(64<<10))
			for j := range msg {
				msg[j] = byte(rng.Uint32())
			}
			errc := make(chan error, 1)
			go func() { _, err := dir[0].Write(msg); errc <- err }()
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(dir[1], got); err != nil {
				t.Fatalf("round %d: read: %v", i, err)
			}
			must(t, <-errc)
			if sha256.Sum256(got) != sha256.Sum256(msg) {
				t.Fatalf("round %d: streamed %d octets differ", i, len(msg))
			}
		}
	}
}

// sspPair: the client app's EP SocketConnects over its socket to the
// server app's SSP; the server accepts. The server's final message is read
// by the client before it switches.
func sspPair(t *testing.T, server, cli *app, ssock, csock *net.TCPConn, final []byte) (sep, cep *client.EP) {
	t.Helper()
	sep, cep = server.ep(t), cli.ep(t)
	must(t, sep.PostRecv(1, []client.Segment{{LMR: server.lmr, Offset: 0, Length: 4096}}))
	must(t, cep.PostRecv(2, []client.Segment{{LMR: cli.lmr, Offset: 0, Length: 4096}}))
	ssp, err := server.ia.CreateSSP(ssock, sep, server.cr, final)
	must(t, err)
	if info, err := ssp.Query(); err != nil || info.State != client.SSPOperational || info.EP != sep ||
		info.RemoteAddr != csock.LocalAddr().String() {
		t.Fatalf("SSP before the request: %+v %v", info, err)
	}
	if st := state(t, sep); st != client.Reserved {
		t.Fatalf("SSP's EP in %v, want RESERVED", st)
	}
	if len(final) > 0 {
		got := make([]byte, len(final))
		_, err := io.ReadFull(csock, got)
		must(t, err)
		if !bytes.Equal(got, final) {
			t.Fatalf("final message %q, want %q", got, final)
		}
	}
	must(t, cep.SocketConnect(csock, 10*time.Second, []byte("switch, please")))
	// The application's copies are closed: nothing here can read the
	// peer's MPA octets or write into the RDMA stream.
	if _, err := csock.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the client's socket after SocketConnect: %v", err)
	}
	if _, err := ssock.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the server's socket after CreateSSP: %v", err)
	}
	ev := wait(t, server.cr)
	if ev.Type != client.ConnectionRequest || ev.CR == nil || ev.EP != sep {
		t.Fatalf("server got %+v", ev)
	}
	info, err := ev.CR.Query()
	must(t, err)
	if string(info.PrivateData) != "switch, please" {
		t.Fatalf("private data %q", info.PrivateData)
	}
	if st := state(t, sep); st != client.PassivePending {
		t.Fatalf("SSP's EP after the request: %v", st)
	}
	if si, err := ssp.Query(); err != nil || si.State != client.SSPNonOperational {
		t.Fatalf("SSP after its request: %+v %v", si, err)
	}
	must(t, ev.CR.Accept(sep, []byte("switched")))
	if ev := wait(t, server.conn); ev.Conn != client.Established || ev.EP != sep {
		t.Fatalf("server: %+v", ev)
	}
	if ev := wait(t, cli.conn); ev.Conn != client.Established || ev.EP != cep {
		t.Fatalf("client: %+v", ev)
	}
	// The EPs inherit the socket's addresses.
	si, err := sep.Query()
	must(t, err)
	ci, err := cep.Query()
	must(t, err)
	if ci.LocalAddr != si.RemoteAddr || ci.RemoteAddr != si.LocalAddr || string(ci.PrivateData) != "switched" {
		t.Fatalf("client EP %+v, server EP %+v", ci, si)
	}
	// The request is the SSP's only one; freeing it now leaves the
	// connection alone and gives nothing back.
	if nc, err := ssp.Free(); err != nil || nc != nil {
		t.Fatalf("free after the request: %v %v", nc, err)
	}
	if _, err := ssp.Query(); !errors.Is(err, client.ErrInvalidHandle) {
		t.Fatalf("query a freed SSP: %v", err)
	}
	if _, err := ssp.Free(); !errors.Is(err, client.ErrInvalidHandle) {
		t.Fatalf("free a freed SSP: %v", err)
	}
	return sep, cep
}

// rdmaEverything runs a Send each way, an RDMA Write, an RDMA Read and
// both atomics on a connected pair, and checks every octet.
func rdmaEverything(t *testing.T, server, cli *app, sep, cep *client.EP) {
	t.Helper()
	copy(cli.buf.Bytes[8192:], "client to server")
	copy(server.buf.Bytes[8192:], "server to client!")
	must(t, cep.PostSend(10, []client.Segment{{LMR: cli.lmr, Offset: 8192, Length: 16}}, client.Signaled))
	must(t, sep.PostSend(20, []client.Segment{{LMR: server.lmr, Offset: 8192, Length: 17}}, client.Signaled))
	for i := range cli.buf.Bytes[100000:300000] {
		cli.buf.Bytes[100000+i] = byte(i * 7)
	}
	must(t, cep.PostWrite(11, []client.Segment{{LMR: cli.lmr, Offset: 100000, Length: 200000}},
		client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(300000)}, client.Signaled))
	for i := range server.buf.Bytes[600000:650000] {
		server.buf.Bytes[600000+i] = byte(i * 13)
	}
	must(t, cep.PostRead(12, client.Segment{LMR: cli.lmr, Offset: 500000, Length: 50000},
		client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(600000)}, client.Signaled))
	must(t, cep.PostFetchAdd(13, client.Segment{LMR: cli.lmr, Offset: 700000, Length: 8},
		client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(800000)}, 5, client.Signaled))
	must(t, cep.PostCmpSwap(14, client.Segment{LMR: cli.lmr, Offset: 700008, Length: 8},
		client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(800000)}, 5, 77, client.Signaled))
	for want := uint64(10); want <= 14; want++ {
		if ev := wait(t, cli.req); ev.Type != client.DTOCompletion || ev.Cookie != want || ev.Status != completion.Success {
			t.Fatalf("client completion %+v, want cookie %d", ev, want)
		}
	}
	if ev := wait(t, server.req); ev.Cookie != 20 || ev.Status != completion.Success {
		t.Fatalf("server completion %+v", ev)
	}
	if ev := wait(t, server.recv); ev.Cookie != 1 || ev.Length != 16 || string(server.buf.Bytes[:16]) != "client to server" {
		t.Fatalf("server receive %+v %q", ev, server.buf.Bytes[:16])
	}
	if ev := wait(t, cli.recv); ev.Cookie != 2 || ev.Length != 17 || string(cli.buf.Bytes[:17]) != "server to client!" {
		t.Fatalf("client receive %+v %q", ev, cli.buf.Bytes[:17])
	}
	if !bytes.Equal(server.buf.Bytes[300000:500000], cli.buf.Bytes[100000:300000]) {
		t.Fatal("RDMA Write data differs")
	}
	if !bytes.Equal(cli.buf.Bytes[500000:550000], server.buf.Bytes[600000:650000]) {
		t.Fatal("RDMA Read data differs")
	}
	if cli.buf.Bytes[700000] != 0 || cli.buf.Bytes[700008] != 5 || server.buf.Bytes[800000] != 77 {
		t.Fatalf("atomics: fetched %d and %d, target %d", cli.buf.Bytes[700000], cli.buf.Bytes[700008], server.buf.Bytes[800000])
	}
}

// TestSSPStreamThenRDMA: two applications talk over their own TCP
// connection, then switch it to RDMA with an SSP on one side (with a final
// streaming message) and SocketConnect on the other, and every RDMA
// operation works on it.
func TestSSPStreamThenRDMA(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")
	ssock, csock := tcpPair(t)
	streamRounds(t, ssock, csock, 8, 1)
	sep, cep := sspPair(t, server, cli, ssock, csock, []byte("last words in streaming mode"))
	rdmaEverything(t, server, cli, sep, cep)
	must(t, cep.Disconnect(true))
	if ev := wait(t, cli.conn); ev.Conn != client.Disconnected {
		t.Fatalf("client: %v", ev.Conn)
	}
	if ev := wait(t, server.conn); ev.Conn != client.Disconnected {
		t.Fatalf("server: %v", ev.Conn)
	}
}

// TestSSPRequestAlreadyQueued: the client's last streaming message and its
// MPA Request reach the server's socket before the server makes its SSP
// (it reads only the message): the Request, already in the socket, is
// the SSP's, and nothing of it went to the application.
func TestSSPRequestAlreadyQueued(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")
	ssock, csock := tcpPair(t)
	sep, cep := server.ep(t), cli.ep(t)
	must(t, sep.PostRecv(1, []client.Segment{{LMR: server.lmr, Offset: 0, Length: 4096}}))
	must(t, cep.PostRecv(2, []client.Segment{{LMR: cli.lmr, Offset: 0, Length: 4096}}))
	_, err := csock.Write([]byte("let us switch"))
	must(t, err)
	must(t, cep.SocketConnect(csock, 10*time.Second, []byte("queued")))
	got := make([]byte, len("let us switch"))
	_, err = io.ReadFull(ssock, got)
	must(t, err)
	// The Request is queued behind it by now.
	deadline := time.Now().Add(10 * time.Second)
	for inq(t, ssock) < 20 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := inq(t, ssock); n < 20 {
		t.Fatalf("%d octets queued in the server's socket, want the Request", n)
	}
	_, err = server.ia.CreateSSP(ssock, sep, server.cr, nil)
	must(t, err)
	ev := wait(t, server.cr)
	if ev.Type != client.ConnectionRequest {
		t.Fatalf("server got %+v", ev)
	}
	if info, _ := ev.CR.Query(); string(info.PrivateData) != "queued" {
		t.Fatalf("private data %q", info.PrivateData)
	}
	must(t, ev.CR.Accept(sep, nil))
	establishedThenEverything(t, server, cli, sep, cep)
}

func inq(t *testing.T, c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	must(t, err)
	var n int
	must(t, rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }))
	return n
}

// TestSSPFreeGivesTheSocketBack: an SSP freed before any request gives its
// socket back as it was: the final message went out, and the two
// applications go on streaming on it.
func TestSSPFreeGivesTheSocketBack(t *testing.T) {
	sock, _ := startDaemon(t)
	server := newApp(t, sock, "server")
	ssock, csock := tcpPair(t)
	sep := server.ep(t)
	ssp, err := server.ia.CreateSSP(ssock, sep, server.cr, []byte("final"))
	must(t, err)
	got := make([]byte, 5)
	_, err = io.ReadFull(csock, got)
	must(t, err)
	// Half a Request: the SSP does not take it (it peeks).
	_, err = csock.Write([]byte("MPA ID Req"))
	must(t, err)
	time.Sleep(50 * time.Millisecond)
	back, err := ssp.Free()
	must(t, err)
	if back == nil {
		t.Fatal("Free gave no socket back")
	}
	defer back.Close()
	if st := state(t, sep); st != client.Unconnected {
		t.Fatalf("EP after Free: %v, want UNCONNECTED", st)
	}
	half := make([]byte, 10)
	_, err = io.ReadFull(back, half)
	must(t, err)
	if string(half) != "MPA ID Req" {
		t.Fatalf("the socket came back with %q unread, want the peer's octets", half)
	}
	streamRounds(t, back, csock, 3, 2)
	noMore(t, server.cr, "server CR EVD")
}

// TestSSPSocketDown: an SSP of a socket that is not connected, or whose
// peer closes before sending a request, goes NON_OPERATIONAL with one
// SOCKET_DOWN event on its EVD, its EP back to UNCONNECTED.
func TestSSPSocketDown(t *testing.T) {
	sock, _ := startDaemon(t)
	server := newApp(t, sock, "server")

	unconnected := unconnectedSocket(t)
	sep := server.ep(t)
	ssp, err := server.ia.CreateSSP(unconnected, sep, server.cr, nil)
	must(t, err)
	ev := wait(t, server.cr)
	if ev.Type != client.ConnectionEvent || ev.Conn != client.SocketDown || ev.SSP != ssp.Handle() {
		t.Fatalf("unconnected socket: %+v", ev)
	}
	if info, _ := ssp.Query(); info.State != client.SSPNonOperational {
		t.Fatalf("SSP %+v", info)
	}
	if st := state(t, sep); st != client.Unconnected {
		t.Fatalf("EP after SOCKET_DOWN: %v", st)
	}
	if nc, err := ssp.Free(); nc != nil || err != nil {
		t.Fatalf("free a down SSP: %v %v", nc, err)
	}

	ssock, csock := tcpPair(t)
	ssp, err = server.ia.CreateSSP(ssock, nil, server.cr, nil)
	must(t, err)
	must(t, csock.Close())
	ev = wait(t, server.cr)
	if ev.Type != client.ConnectionEvent || ev.Conn != client.SocketDown || ev.SSP != ssp.Handle() {
		t.Fatalf("peer closed: %+v", ev)
	}
	noMore(t, server.cr, "server CR EVD")
	must(t, errOnly(ssp.Free()))
}

func errOnly(_ any, err error) error { return err }

// TestSSPNotMPA: a peer that answers with something else than an MPA
// Request gets its connection reset, and the SSP reports SOCKET_DOWN.
func TestSSPNotMPA(t *testing.T) {
	sock, _ := startDaemon(t)
	server := newApp(t, sock, "server")
	ssock, csock := tcpPair(t)
	_, err := server.ia.CreateSSP(ssock, nil, server.cr, nil)
	must(t, err)
	_, err = csock.Write([]byte("GET / HTTP/1.1\r\nHost: example\r\n\r\n"))
	must(t, err)
	if ev := wait(t, server.cr); ev.Type != client.ConnectionEvent || ev.Conn != client.SocketDown {
		t.Fatalf("not MPA: %+v", ev)
	}
	_ = csock.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := csock.Read(make([]byte, 1)); !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("the peer's read after a failed switch: %v, want a reset", err)
	}
}

// TestSSPErrors: every error return of CreateSSP, SSP.Free, SSP.Query and
// SocketConnect that digest 000 lists.
func TestSSPErrors(t *testing.T) {
	sock, _ := startDaemon(t)
	a, b := newApp(t, sock, "a"), newApp(t, sock, "b")
	ssock, csock := tcpPair(t)
	ep := a.ep(t)

	// INVALID_HANDLE: an EVD or EP of another IA, an EVD freed.
	if _, err := a.ia.CreateSSP(ssock, ep, b.cr, nil); !errors.Is(err, client.ErrInvalidHandle) {
		t.Errorf("EVD of another IA: %v", err)
	}
	if _, err := a.ia.CreateSSP(ssock, b.ep(t), a.cr, nil); !errors.Is(err, client.ErrInvalidHandle) {
		t.Errorf("EP of another IA: %v", err)
	}
	gone, err := a.ia.CreateEVD(client.EVDOptions{Depth: 4, Kind: client.CREvents})
	must(t, err)
	must(t, gone.Free())
	if _, err := a.ia.CreateSSP(ssock, ep, gone, nil); !errors.Is(err, client.ErrInvalidHandle) {
		t.Errorf("freed EVD: %v", err)
	}
	// INVALID_PARAMETER: not a CR EVD, not TCP, listening, too long.
	if _, err := a.ia.CreateSSP(ssock, ep, a.conn, nil); !errors.Is(err, client.ErrInvalidParameter) {
		t.Errorf("connection EVD: %v", err)
	}
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	must(t, err)
	defer udp.Close()
	if _, err := a.ia.CreateSSP(udp, ep, a.cr, nil); !errors.Is(err, client.ErrInvalidParameter) {
		t.Errorf("UDP socket: %v", err)
	}
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	must(t, err)
	defer ln.Close()
	if _, err := a.ia.CreateSSP(ln, ep, a.cr, nil); !errors.Is(err, client.ErrInvalidParameter) {
		t.Errorf("listening socket: %v", err)
	}
	if _, err := a.ia.CreateSSP(ssock, ep, a.cr, make([]byte, client.MaxFinalMessage+1)); !errors.Is(err, client.ErrInvalidParameter) {
		t.Errorf("final message too long: %v", err)
	}
	// INVALID_STATE: an EP that is not UNCONNECTED; a socket that is
	// not the IA's (here: over ::1, the daemon's IA is 127.0.0.1).
	p, err := a.ia.CreateSSP(ssock, ep, a.cr, nil)
	must(t, err)
	if _, err := a.ia.CreateSSP(csock, ep, a.cr, nil); !errors.Is(err, client.ErrInvalidState) {
		t.Errorf("EP RESERVED by another SSP: %v", err)
	}
	if other, err := net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback}); err == nil {
		defer other.Close()
		c6, err := net.DialTCP("tcp6", nil, other.Addr().(*net.TCPAddr))
		must(t, err)
		defer c6.Close()
		if _, err := a.ia.CreateSSP(c6, nil, a.cr, nil); !errors.Is(err, client.ErrInvalidParameter) {
			t.Errorf("IPv6 socket: %v", err)
		}
	}
	// The failed calls left the socket with the application (a write
	// would reach the SSP's socket, its peer).
	if err := csock.SetNoDelay(true); err != nil {
		t.Errorf("the socket after failed calls: %v", err)
	}
	if nc, err := p.Free(); err != nil || nc == nil {
		t.Fatalf("free: %v %v", nc, err)
	} else {
		nc.Close()
	}
	if _, err := p.Free(); !errors.Is(err, client.ErrInvalidHandle) {
		t.Errorf("double free: %v", err)
	}
	if _, err := p.Query(); !errors.Is(err, client.ErrInvalidHandle) {
		t.Errorf("query freed: %v", err)
	}

	// SocketConnect.
	if err := ep.SocketConnect(csock, 0, nil); !errors.Is(err, client.ErrInvalidParameter) {
		t.Errorf("timeout 0: %v", err)
	}
	if err := ep.SocketConnect(csock, time.Second, nil); !errors.Is(err, client.ErrInvalidState) {
		t.Errorf("no receive posted: %v", err)
	}
	nopz, err := a.ia.CreateEP(client.EPAttr{ConnectEVD: a.conn})
	must(t, err)
	if err := nopz.SocketConnect(csock, time.Second, nil); !errors.Is(err, client.ErrInvalidState) {
		t.Errorf("EP without a PZ: %v", err)
	}
	if err := ep.SocketConnect(udp, time.Second, nil); !errors.Is(err, client.ErrInvalidParameter) {
		t.Errorf("UDP socket: %v", err)
	}
	if err := ep.SocketConnect(csock, time.Second, make([]byte, 10000)); err == nil {
		t.Errorf("private data too long: accepted")
	}
	if _, err := csock.Write([]byte("and still")); err != nil {
		t.Errorf("the socket after failed SocketConnects: %v", err)
	}
}

// TestSocketConnectNotConnected: SocketConnect on a socket that is not
// connected fails as an event, NON_PEER_REJECTED, the EP DISCONNECTED.
func TestSocketConnectNotConnected(t *testing.T) {
	sock, _ := startDaemon(t)
	cli := newApp(t, sock, "client")
	f := unconnectedSocket(t)
	cep := cli.ep(t)
	must(t, cep.PostRecv(2, []client.Segment{{LMR: cli.lmr, Offset: 0, Length: 4096}}))
	must(t, cep.SocketConnect(f, 5*time.Second, nil))
	if ev := wait(t, cli.conn); ev.Conn != client.NonPeerRejected {
		t.Fatalf("client: %+v", ev)
	}
	if st := state(t, cep); st != client.DisconnectedState {
		t.Fatalf("EP %v", st)
	}
}

// TestSocketConnectHostilePeer: SocketConnect on a connection whose peer
// is no SSP: one answers the MPA Request with something else, one never
// answers, one resets. Each ends in one connection event (never
// ESTABLISHED), the EP DISCONNECTED, and the connection reset rather
// than handed back to streaming.
func TestSocketConnectHostilePeer(t *testing.T) {
	sock, _ := startDaemon(t)
	cli := newApp(t, sock, "client")
	for _, c := range []struct {
		name string
		peer func(t *testing.T, s *net.TCPConn)
		want client.ConnEvent
	}{
		{"garbage", func(t *testing.T, s *net.TCPConn) {
			readRequest(t, s)
			_, _ = s.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\nnot an MPA Reply at all"))
		}, client.NonPeerRejected},
		{"silent", func(t *testing.T, s *net.TCPConn) { readRequest(t, s) }, client.TimedOut},
		{"reset", func(t *testing.T, s *net.TCPConn) {
			readRequest(t, s)
			_ = s.SetLinger(0)
			_ = s.Close()
		}, client.NonPeerRejected},
	} {
		t.Run(c.name, func(t *testing.T) {
			ssock, csock := tcpPair(t)
			cep := cli.ep(t)
			must(t, cep.PostRecv(2, []client.Segment{{LMR: cli.lmr, Offset: 0, Length: 4096}}))
			must(t, cep.SocketConnect(csock, 2*time.Second, []byte("hello?")))
			c.peer(t, ssock)
			ev := wait(t, cli.conn)
			if ev.Conn != c.want {
				t.Fatalf("event %v, want %v", ev.Conn, c.want)
			}
			if st := state(t, cep); st != client.DisconnectedState {
				t.Fatalf("EP %v", st)
			}
			noMore(t, cli.conn, "connect EVD")
			// The connection does not go back to streaming: the peer
			// reads its end (or a reset), nothing else.
			_ = ssock.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := io.Copy(io.Discard, ssock); err == nil && n > 100 {
				t.Fatalf("the peer read %d more octets after the failed switch", n)
			}
		})
	}
}

// readRequest reads the MPA Request a SocketConnect sends.
func readRequest(t *testing.T, s *net.TCPConn) {
	t.Helper()
	hdr := make([]byte, 20)
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(s, hdr); err != nil || string(hdr[:16]) != "MPA ID Req Frame" {
		t.Fatalf("MPA Request %q: %v", hdr, err)
	}
	pd := make([]byte, int(hdr[18])<<8|int(hdr[19]))
	if _, err := io.ReadFull(s, pd); err != nil {
		t.Fatalf("MPA Request's private data: %v", err)
	}
}

// TestSSPHostilePeer: an SSP whose peer sends half a Request and resets
// or closes, or a Request whose private data length is out of bounds,
// reports SOCKET_DOWN once; the last peer's connection is reset. (A peek
// gives the half Request again after the peer's end: the wait must look
// at the connection's state, or it waits for ever.)
func TestSSPHostilePeer(t *testing.T) {
	sock, _ := startDaemon(t)
	server := newApp(t, sock, "server")
	req := func(pdLen uint16) []byte {
		b := append([]byte("MPA ID Req Frame"), 0x40, 1, byte(pdLen>>8), byte(pdLen))
		return b
	}
	for _, c := range []struct {
		name string
		peer func(c *net.TCPConn)
	}{
		{"half-then-reset", func(c *net.TCPConn) {
			_, _ = c.Write(req(100)[:18])
			time.Sleep(20 * time.Millisecond)
			_ = c.SetLinger(0)
			_ = c.Close()
		}},
		{"half-then-close", func(c *net.TCPConn) {
			_, _ = c.Write(req(100)[:19])
			time.Sleep(20 * time.Millisecond)
			_ = c.CloseWrite()
		}},
		{"private-data-too-long", func(c *net.TCPConn) { _, _ = c.Write(append(req(60000), make([]byte, 600)...)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ssock, csock := tcpPair(t)
			sep := server.ep(t)
			ssp, err := server.ia.CreateSSP(ssock, sep, server.cr, nil)
			must(t, err)
			c.peer(csock)
			ev := wait(t, server.cr)
			if ev.Type != client.ConnectionEvent || ev.Conn != client.SocketDown || ev.SSP != ssp.Handle() {
				t.Fatalf("event %+v, want SOCKET_DOWN", ev)
			}
			noMore(t, server.cr, "CR EVD")
			if st := state(t, sep); st != client.Unconnected {
				t.Fatalf("EP %v", st)
			}
			if c.name == "private-data-too-long" {
				_ = csock.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := csock.Read(make([]byte, 1)); !errors.Is(err, unix.ECONNRESET) {
					t.Fatalf("the peer's read: %v, want a reset", err)
				}
			}
			if nc, err := ssp.Free(); nc != nil || err != nil {
				t.Fatalf("free: %v %v", nc, err)
			}
		})
	}
}

// TestSSPAcceptNeedsAReceive: accepting an SSP's request on an EP with no
// receive posted is refused and changes nothing (seed 004); the request
// stays, and an Accept after a receive is posted switches the connection.
func TestSSPAcceptNeedsAReceive(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")
	ssock, csock := tcpPair(t)
	sep, cep := server.ep(t), cli.ep(t)
	must(t, cep.PostRecv(2, []client.Segment{{LMR: cli.lmr, Offset: 0, Length: 4096}}))
	_, err := server.ia.CreateSSP(ssock, sep, server.cr, nil)
	must(t, err)
	must(t, cep.SocketConnect(csock, 10*time.Second, nil))
	ev := wait(t, server.cr)
	if ev.Type != client.ConnectionRequest {
		t.Fatalf("server got %+v", ev)
	}
	if err := ev.CR.Accept(sep, nil); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("accept with no receive posted: %v, want INVALID_STATE", err)
	}
	if st := state(t, sep); st != client.PassivePending {
		t.Fatalf("EP after the refused accept: %v", st)
	}
	must(t, sep.PostRecv(1, []client.Segment{{LMR: server.lmr, Offset: 0, Length: 4096}}))
	must(t, ev.CR.Accept(sep, nil))
	establishedThenEverything(t, server, cli, sep, cep)
}

// establishedThenEverything waits for ESTABLISHED on both sides, then runs
// every operation on the pair.
func establishedThenEverything(t *testing.T, server, cli *app, sep, cep *client.EP) {
	t.Helper()
	if ev := wait(t, cli.conn); ev.Conn != client.Established {
		t.Fatalf("client: %+v", ev)
	}
	if ev := wait(t, server.conn); ev.Conn != client.Established {
		t.Fatalf("server: %+v", ev)
	}
	rdmaEverything(t, server, cli, sep, cep)
}

// unconnectedSocket is a TCP socket that was never connected, as a file.
func unconnectedSocket(t *testing.T) *os.File {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	must(t, err)
	return os.NewFile(uintptr(fd), "unconnected")
}
