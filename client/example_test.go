package client_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
)

// exampleDaemon starts a softrnicd on loopback for the examples; a real
// application opens the socket of the daemon already running on its host.
func exampleDaemon() (socket string, stop func()) {
	dir, _ := os.MkdirTemp("", "softrnic-example")
	socket = filepath.Join(dir, "lo.sock")
	d, err := daemon.New(daemon.Options{Iface: "lo", Socket: socket, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	go d.Serve()
	return socket, func() { d.Close(); os.RemoveAll(dir) }
}

func examplePort() string {
	l, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer l.Close()
	return l.Addr().String()
}

// endpoint is what each side of the examples sets up: an IA, a PZ, a
// registered buffer, EVDs and an EP.
type endpoint struct {
	ia                  *client.IA
	buf                 *client.Buffer
	lmr                 *client.LMR
	dto, conn, requests *client.EVD
	ep                  *client.EP
	waitCtx             context.Context
	cancel              context.CancelFunc
}

func newEndpoint(socket string) *endpoint {
	e := &endpoint{}
	e.waitCtx, e.cancel = context.WithTimeout(context.Background(), 30*time.Second)
	var err error
	if e.ia, err = client.Open(e.waitCtx, client.Options{Socket: socket}); err != nil {
		panic(err)
	}
	pz, _ := e.ia.CreatePZ()
	e.buf, _ = e.ia.Alloc(1 << 16)
	e.lmr, _ = pz.RegisterLMR(e.buf, client.LocalWrite|client.RemoteWrite|client.RemoteRead)
	e.dto, _ = e.ia.CreateEVD(client.EVDOptions{Depth: 64, Kind: client.DTOEvents})
	e.conn, _ = e.ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.ConnectionEvents})
	e.requests, _ = e.ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.CREvents})
	e.ep, err = e.ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: e.dto, RequestEVD: e.dto, ConnectEVD: e.conn, SQDepth: 16, RQDepth: 16, IRD: 4, ORD: 4})
	if err != nil {
		panic(err)
	}
	return e
}

func (e *endpoint) close() { e.ia.Close(); e.cancel() }

// A server listens on a port, accepts a connection request with private
// data of its own, and receives a message into a posted buffer.
func ExampleCR_Accept() {
	socket, stop := exampleDaemon()
	defer stop()
	addr := examplePort()
	var port uint16
	fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &port)

	server := newEndpoint(socket)
	defer server.close()
	psp, _ := server.ia.CreatePSP(port, server.requests, false)
	defer psp.Free()
	// Post the receive before accepting: the client may send at once.
	_ = server.ep.PostRecv(1, []client.Segment{{LMR: server.lmr, Length: 256}})

	cli := newEndpoint(socket) // the other side, usually another process
	defer cli.close()
	_ = cli.ep.Connect(addr, []byte("may I?"), 5*time.Second)

	ev, _ := server.requests.Wait(server.waitCtx)
	info, _ := ev.CR.Query()
	fmt.Printf("request with private data %q\n", info.PrivateData)
	_ = ev.CR.Accept(server.ep, []byte("welcome"))
	ev, _ = server.conn.Wait(server.waitCtx)
	fmt.Println("server:", ev.Conn)

	_, _ = cli.conn.Wait(cli.waitCtx)
	copy(cli.buf.Bytes, "hello, server")
	_ = cli.ep.PostSend(7, []client.Segment{{LMR: cli.lmr, Length: 13}}, 0)

	ev, _ = server.dto.Wait(server.waitCtx)
	fmt.Printf("received %q (cookie %d, status %v)\n", server.buf.Bytes[:ev.Length], ev.Cookie, ev.Status)
	// Output:
	// request with private data "may I?"
	// server: ESTABLISHED
	// received "hello, server" (cookie 1, status success)
}

// A client connects and RDMA-writes into a buffer the server advertised
// (here its STag and address are simply known to it).
func ExampleEP_PostWrite() {
	socket, stop := exampleDaemon()
	defer stop()
	addr := examplePort()
	var port uint16
	fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &port)
	server := newEndpoint(socket)
	defer server.close()
	_, _ = server.ia.CreatePSP(port, server.requests, false)

	cli := newEndpoint(socket)
	defer cli.close()
	_ = cli.ep.Connect(addr, nil, 5*time.Second)
	ev, _ := server.requests.Wait(server.waitCtx)
	_ = ev.CR.Accept(server.ep, nil)
	ev, _ = cli.conn.Wait(cli.waitCtx)
	fmt.Println("client:", ev.Conn)

	copy(cli.buf.Bytes, "written by RDMA")
	target := client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(1000)}
	_ = cli.ep.PostWrite(42, []client.Segment{{LMR: cli.lmr, Length: 15}}, target, client.Signaled)
	ev, _ = cli.dto.Wait(cli.waitCtx)
	fmt.Printf("write %d: %v\n", ev.Cookie, ev.Status)
	// A Send after a Write arrives after the Write is placed; here the
	// server just looks once the write has completed at the client.
	_ = server.ep.PostRecv(0, nil)
	_ = cli.ep.PostSend(43, nil, 0)
	_, _ = server.dto.Wait(server.waitCtx)
	fmt.Printf("server memory: %q\n", server.buf.Bytes[1000:1015])
	// Output:
	// client: ESTABLISHED
	// write 42: success
	// server memory: "written by RDMA"
}

// RDMA Read fetches a peer's memory without the peer's CPU taking part.
func ExampleEP_PostRead() {
	socket, stop := exampleDaemon()
	defer stop()
	addr := examplePort()
	var port uint16
	fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &port)
	server := newEndpoint(socket)
	defer server.close()
	_, _ = server.ia.CreatePSP(port, server.requests, false)
	copy(server.buf.Bytes[500:], "served by RDMA Read")

	cli := newEndpoint(socket)
	defer cli.close()
	_ = cli.ep.Connect(addr, nil, 5*time.Second)
	ev, _ := server.requests.Wait(server.waitCtx)
	_ = ev.CR.Accept(server.ep, nil)
	_, _ = cli.conn.Wait(cli.waitCtx)

	source := client.RemoteBuffer{Context: server.lmr.Context, Address: server.lmr.Address(500)}
	_ = cli.ep.PostRead(1, client.Segment{LMR: cli.lmr, Offset: 0, Length: 19}, source, client.Signaled)
	ev, _ = cli.dto.Wait(cli.waitCtx)
	fmt.Printf("read %v: %q\n", ev.Status, cli.buf.Bytes[:19])
	// Output:
	// read success: "served by RDMA Read"
}

// record is application memory that was never allocated for RDMA: the
// server registers one field of it where it is.
type record struct {
	seq  uint32
	name [16]byte
	tail uint32
}

var (
	inbox  = &record{seq: 1, tail: 2}
	outbox = []byte("from any memory!")
)

// Any octets of the application's memory can be registered where they are:
// the daemon copies in and out of the process, and nothing is shared or
// pinned (fork leaves the pages the process's own). Here the server lets a
// 16-octet field of a record be written; the client writes it from an
// ordinary slice.
func ExamplePZ_RegisterProcessMemory() {
	socket, stop := exampleDaemon()
	defer stop()
	addr := examplePort()
	var port uint16
	fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &port)
	server := newEndpoint(socket)
	defer server.close()
	_, _ = server.ia.CreatePSP(port, server.requests, false)
	spz, _ := server.ia.CreatePZ()
	field, err := spz.RegisterProcessMemory(uintptr(unsafe.Pointer(&inbox.name)), len(inbox.name), client.LocalWrite|client.RemoteWrite)
	if err != nil {
		panic(err)
	}

	cli := newEndpoint(socket)
	defer cli.close()
	cpz, _ := cli.ia.CreatePZ()
	from, _ := cpz.RegisterProcessMemory(uintptr(unsafe.Pointer(&outbox[0])), len(outbox), 0)
	ep, _ := cli.ia.CreateEP(client.EPAttr{PZ: cpz, RecvEVD: cli.dto, RequestEVD: cli.dto, ConnectEVD: cli.conn, SQDepth: 4, RQDepth: 4})
	_ = ep.Connect(addr, nil, 5*time.Second)
	sep, _ := server.ia.CreateEP(client.EPAttr{PZ: spz, RecvEVD: server.dto, RequestEVD: server.dto, ConnectEVD: server.conn, SQDepth: 4, RQDepth: 4})
	ev, _ := server.requests.Wait(server.waitCtx)
	_ = ev.CR.Accept(sep, nil)
	_, _ = cli.conn.Wait(cli.waitCtx)

	_ = ep.PostWrite(1, []client.Segment{{LMR: from, Length: 16}}, client.RemoteBuffer{Context: field.Context, Address: field.Address(0)}, 0)
	// The Send behind the Write arrives after the Write is placed.
	_ = sep.PostRecv(2, nil)
	_ = ep.PostSend(3, nil, 0)
	ev, _ = server.dto.Wait(server.waitCtx)
	fmt.Printf("receive %v; record: seq %d, name %q, tail %d\n", ev.Status, inbox.seq, inbox.name[:], inbox.tail)
	// Output:
	// receive success; record: seq 1, name "from any memory!", tail 2
}
