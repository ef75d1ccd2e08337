// Command softrnic-example is a pair of applications that use softrnic the
// way an RDMA program does: the server advertises a buffer in the MPA
// private data of its accept; the client Sends to it, RDMA-Writes into its
// buffer, has the server verify the data, RDMA-Reads it back and checks it,
// and measures bandwidth and latency.
//
// With --stream both sides first talk over an ordinary TCP connection of
// their own (the client asks for RDMA, the server agrees), then switch that
// same connection to RDMA (seed 000's Socket Service Point on the server,
// SocketConnect on the client) and go on as above.
//
//	softrnic-example server --socket PATH --port P [--stream]
//	softrnic-example client --socket PATH --server HOST:P [--size BYTES] [--stream]
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

const (
	msgSize = 4096
	chunk   = 1 << 20
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: softrnic-example server|client [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	socket := fs.String("socket", "", "softrnicd control socket")
	port := fs.Int("port", 4791, "server: port to listen on")
	server := fs.String("server", "", "client: server address host:port")
	size := fs.Int("size", 64<<20, "bytes to write and read back")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	stream := fs.Bool("stream", false, "negotiate over plain TCP first, then switch that connection to RDMA")
	_ = fs.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	if os.Args[1] == "server" {
		err = runServer(ctx, *socket, uint16(*port), *size, *stream)
	} else {
		err = runClient(ctx, *socket, *server, *size, *stream)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic-example %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// app is what both sides set up.
type app struct {
	ia                  *client.IA
	pz                  *client.PZ
	buf                 *client.Buffer
	lmr                 *client.LMR
	recv, req, conn, cr *client.EVD
	ep                  *client.EP
}

func setup(ctx context.Context, socket string, size int) (*app, error) {
	ia, err := client.Open(ctx, client.Options{Socket: socket, Name: "softrnic-example"})
	if err != nil {
		return nil, err
	}
	a := &app{ia: ia}
	if a.pz, err = ia.CreatePZ(); err != nil {
		return nil, err
	}
	// Messages in the first 64 KiB, the data area after it.
	if a.buf, err = ia.Alloc(64<<10 + 2*size); err != nil {
		return nil, err
	}
	if a.lmr, err = a.pz.RegisterLMR(a.buf, client.LocalWrite|client.RemoteWrite|client.RemoteRead); err != nil {
		return nil, err
	}
	for _, e := range []struct {
		p    **client.EVD
		kind client.EVDKind
	}{{&a.recv, client.DTOEvents}, {&a.req, client.DTOEvents}, {&a.conn, client.ConnectionEvents}, {&a.cr, client.CREvents}} {
		if *e.p, err = ia.CreateEVD(client.EVDOptions{Depth: 1024, Kind: e.kind}); err != nil {
			return nil, err
		}
	}
	a.ep, err = ia.CreateEP(client.EPAttr{PZ: a.pz, RecvEVD: a.recv, RequestEVD: a.req, ConnectEVD: a.conn,
		SQDepth: 256, RQDepth: 16, IRD: 16, ORD: 16})
	if err != nil {
		return nil, err
	}
	// Receives for incoming messages, posted before any connection.
	for i := 0; i < 8; i++ {
		if err := a.ep.PostRecv(uint64(i), []client.Segment{{LMR: a.lmr, Offset: uint64(i) * msgSize, Length: msgSize}}); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// recvMsg waits for the next message and reposts its buffer.
func (a *app) recvMsg(ctx context.Context) (string, error) {
	ev, err := a.recv.Wait(ctx)
	if err != nil {
		return "", err
	}
	if ev.Status != completion.Success || ev.Cookie >= 8 {
		return "", fmt.Errorf("receive %d: %v", ev.Cookie, ev.Status)
	}
	slot := ev.Cookie
	msg := string(a.buf.Bytes[slot*msgSize : slot*msgSize+uint64(ev.Length)])
	if err := a.ep.PostRecv(slot, []client.Segment{{LMR: a.lmr, Offset: slot * msgSize, Length: msgSize}}); err != nil {
		return "", err
	}
	return msg, nil
}

// sendMsg sends a message from the 9th message slot and waits for it.
func (a *app) sendMsg(ctx context.Context, msg string) error {
	off := uint64(8 * msgSize)
	copy(a.buf.Bytes[off:], msg)
	if err := a.ep.PostSend(0x5e, []client.Segment{{LMR: a.lmr, Offset: off, Length: uint32(len(msg))}}, client.Signaled); err != nil {
		return err
	}
	return a.waitDTO(ctx, 0x5e)
}

func (a *app) waitDTO(ctx context.Context, cookie uint64) error {
	for {
		ev, err := a.req.Wait(ctx)
		if err != nil {
			return err
		}
		if ev.Status != completion.Success {
			return fmt.Errorf("request %#x: %v (cause %v)", ev.Cookie, ev.Status, ev.Cause)
		}
		if ev.Cookie == cookie {
			return nil
		}
	}
}

func (a *app) waitConn(ctx context.Context) (client.ConnEvent, error) {
	ev, err := a.conn.Wait(ctx)
	return ev.Conn, err
}

// The streaming negotiation of --stream: one line each way, read octet by
// octet so that nothing past the line is taken from the socket (what
// follows is the peer's MPA Request or Reply, which is the daemon's).
const (
	askRDMA   = "softrnic-example: RDMA, please\n"
	agreeRDMA = "softrnic-example: RDMA it is\n"
)

func readLine(c net.Conn) (string, error) {
	var line []byte
	b := make([]byte, 1)
	for len(line) < 256 {
		if _, err := io.ReadFull(c, b); err != nil {
			return "", err
		}
		line = append(line, b[0])
		if b[0] == '\n' {
			return string(line), nil
		}
	}
	return "", errors.New("line too long")
}

// streamRequest is the server's --stream start: a TCP listener of its own,
// the client's question, and the connection made a Socket Service Point
// whose final streaming message is the answer.
func (a *app) streamRequest(ctx context.Context, port uint16) (client.Event, error) {
	ln, err := net.Listen("tcp4", net.JoinHostPort(a.ia.Attr().Address, strconv.Itoa(int(port))))
	if err != nil {
		return client.Event{}, err
	}
	defer ln.Close()
	fmt.Printf("server: listening on %s:%d (TCP, RDMA after a negotiation)\n", a.ia.Attr().Address, port)
	if d, ok := ctx.Deadline(); ok {
		_ = ln.(*net.TCPListener).SetDeadline(d)
	}
	c, err := ln.Accept()
	if err != nil {
		return client.Event{}, err
	}
	q, err := readLine(c)
	if err != nil || q != askRDMA {
		c.Close()
		return client.Event{}, fmt.Errorf("negotiation: %q %v", q, err)
	}
	fmt.Printf("server: TCP connection from %s asks: %q\n", c.RemoteAddr(), strings.TrimSpace(q))
	if _, err := a.ia.CreateSSP(c.(*net.TCPConn), a.ep, a.cr, []byte(agreeRDMA)); err != nil {
		c.Close()
		return client.Event{}, err
	}
	fmt.Println("server: answered, and made the connection a Socket Service Point")
	ev, err := a.cr.Wait(ctx)
	if err == nil && ev.Type != client.ConnectionRequest {
		err = fmt.Errorf("socket service point: %v", ev.Conn)
	}
	return ev, err
}

func runServer(ctx context.Context, socket string, port uint16, size int, stream bool) error {
	a, err := setup(ctx, socket, size)
	if err != nil {
		return err
	}
	defer a.ia.Close()
	var ev client.Event
	if stream {
		ev, err = a.streamRequest(ctx, port)
	} else {
		if _, err := a.ia.CreatePSP(port, a.cr, false); err != nil {
			return err
		}
		fmt.Printf("server: listening on %s:%d\n", a.ia.Attr().Address, port)
		ev, err = a.cr.Wait(ctx)
	}
	if err != nil {
		return err
	}
	info, err := ev.CR.Query()
	if err != nil {
		return err
	}
	fmt.Printf("server: connection request from %s: %q\n", info.RemoteAddr, info.PrivateData)
	// Advertise the data area: STag, address, length.
	var adv [16]byte
	binary.BigEndian.PutUint32(adv[0:], a.lmr.Context)
	binary.BigEndian.PutUint64(adv[4:], a.lmr.Address(64<<10))
	binary.BigEndian.PutUint32(adv[12:], uint32(size))
	if err := ev.CR.Accept(a.ep, adv[:]); err != nil {
		return err
	}
	if c, err := a.waitConn(ctx); err != nil || c != client.Established {
		return fmt.Errorf("accept: %v %v", c, err)
	}
	fmt.Println("server: connected")
	for {
		msg, err := a.recvMsg(ctx)
		if err != nil {
			return err
		}
		fields := strings.Fields(msg)
		switch {
		case len(fields) == 3 && fields[0] == "verify":
			n, _ := strconv.Atoi(fields[2])
			if n < 0 || n > size {
				return fmt.Errorf("verify of %d octets", n)
			}
			sum := sha256.Sum256(a.buf.Bytes[64<<10 : 64<<10+n])
			verdict := "ok"
			if hex.EncodeToString(sum[:]) != fields[1] {
				verdict = "mismatch"
			}
			fmt.Printf("server: %d octets written by the client: SHA-256 %s\n", n, verdict)
			if err := a.sendMsg(ctx, verdict); err != nil {
				return err
			}
		case msg == "bye":
			// How long the event took tells a reset (at once) from a
			// close the peer did not complete (the daemon's timeout).
			bye := time.Now()
			if c, err := a.waitConn(ctx); err != nil || c != client.Disconnected {
				return fmt.Errorf("disconnect: %v %v, %v after the client's bye", c, err, time.Since(bye).Round(time.Millisecond))
			}
			fmt.Println("server: disconnected, done")
			return nil
		default:
			fmt.Printf("server: received %q\n", msg)
		}
	}
}

// streamConnect is the client's --stream start: its own TCP connection,
// the question, the answer, and the switch of that connection to RDMA.
func (a *app) streamConnect(ctx context.Context, server string) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(a.ia.Attr().Address)}}
	c, err := d.DialContext(ctx, "tcp4", server)
	if err != nil {
		return err
	}
	fmt.Printf("client: TCP connection %s → %s\n", c.LocalAddr(), c.RemoteAddr())
	if _, err := c.Write([]byte(askRDMA)); err != nil {
		c.Close()
		return err
	}
	ans, err := readLine(c)
	if err != nil || ans != agreeRDMA {
		c.Close()
		return fmt.Errorf("negotiation: %q %v", ans, err)
	}
	fmt.Printf("client: the server answers %q; switching this connection to RDMA\n", strings.TrimSpace(ans))
	return a.ep.SocketConnect(c.(*net.TCPConn), 10*time.Second, []byte("softrnic-example client"))
}

func runClient(ctx context.Context, socket, server string, size int, stream bool) error {
	if server == "" {
		return errors.New("--server is required")
	}
	a, err := setup(ctx, socket, size)
	if err != nil {
		return err
	}
	defer a.ia.Close()
	if stream {
		err = a.streamConnect(ctx, server)
	} else {
		fmt.Printf("client: connecting from %s to %s\n", a.ia.Attr().Address, server)
		err = a.ep.Connect(server, []byte("softrnic-example client"), 10*time.Second)
	}
	if err != nil {
		return err
	}
	if c, err := a.waitConn(ctx); err != nil || c != client.Established {
		return fmt.Errorf("connect: %v %v", c, err)
	}
	info, err := a.ep.Query()
	if err != nil {
		return err
	}
	if len(info.PrivateData) != 16 {
		return fmt.Errorf("server advertised %d octets", len(info.PrivateData))
	}
	remote := client.RemoteBuffer{Context: binary.BigEndian.Uint32(info.PrivateData), Address: binary.BigEndian.Uint64(info.PrivateData[4:])}
	if n := int(binary.BigEndian.Uint32(info.PrivateData[12:])); n < size {
		size = n
	}
	fmt.Printf("client: connected %s → %s; server buffer STag %#x at %#x\n", info.LocalAddr, info.RemoteAddr, remote.Context, remote.Address)

	if err := a.sendMsg(ctx, "hello from softrnic"); err != nil {
		return err
	}
	fmt.Println("client: Send            ok")

	src := a.buf.Bytes[64<<10 : 64<<10+size]
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(src); i += 8 {
		binary.LittleEndian.PutUint64(src[i:], r.Uint64())
	}
	start := time.Now()
	if err := a.transfer(ctx, true, remote, size); err != nil {
		return err
	}
	wbw := float64(size) / time.Since(start).Seconds()
	sum := sha256.Sum256(src)
	if err := a.sendMsg(ctx, fmt.Sprintf("verify %x %d", sum, size)); err != nil {
		return err
	}
	if v, err := a.recvMsg(ctx); err != nil || v != "ok" {
		return fmt.Errorf("server's verdict on the RDMA Write: %q %v", v, err)
	}
	fmt.Printf("client: RDMA Write      %d MiB, verified by the server (SHA-256), %.2f Gbit/s\n", size>>20, wbw*8/1e9)

	start = time.Now()
	if err := a.transfer(ctx, false, remote, size); err != nil {
		return err
	}
	rbw := float64(size) / time.Since(start).Seconds()
	if !bytes.Equal(a.buf.Bytes[64<<10+size:64<<10+2*size], src) {
		return errors.New("RDMA Read returned different data")
	}
	fmt.Printf("client: RDMA Read       %d MiB, identical to what was written, %.2f Gbit/s\n", size>>20, rbw*8/1e9)

	lat := make([]time.Duration, 0, 1000)
	for i := 0; i < 1000; i++ {
		t0 := time.Now()
		if err := a.ep.PostRead(uint64(1e6+i), client.Segment{LMR: a.lmr, Offset: 9 * msgSize, Length: 8}, remote, client.Signaled); err != nil {
			return err
		}
		if err := a.waitDTO(ctx, uint64(1e6+i)); err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	fmt.Printf("client: RDMA Read 8 B   round trip median %v, p99 %v\n", lat[len(lat)/2].Round(100*time.Nanosecond), lat[len(lat)*99/100].Round(100*time.Nanosecond))

	if err := a.sendMsg(ctx, "bye"); err != nil {
		return err
	}
	disconnect := time.Now()
	if err := a.ep.Disconnect(true); err != nil {
		return err
	}
	if c, err := a.waitConn(ctx); err != nil || c != client.Disconnected {
		return fmt.Errorf("disconnect: %v %v, %v after Disconnect", c, err, time.Since(disconnect).Round(time.Millisecond))
	}
	fmt.Println("client: disconnected, done")
	return nil
}

// transfer writes (or reads back into the second half) size octets in 1 MiB
// requests, keeping up to 32 in flight.
func (a *app) transfer(ctx context.Context, write bool, remote client.RemoteBuffer, size int) error {
	const window = 32
	posted, done := 0, 0
	n := (size + chunk - 1) / chunk
	for done < n {
		for posted < n && posted-done < window {
			off := uint64(posted * chunk)
			l := uint32(min(chunk, size-posted*chunk))
			rb := client.RemoteBuffer{Context: remote.Context, Address: remote.Address + off}
			var err error
			if write {
				err = a.ep.PostWrite(uint64(posted), []client.Segment{{LMR: a.lmr, Offset: 64<<10 + off, Length: l}}, rb, client.Signaled)
			} else {
				err = a.ep.PostRead(uint64(posted), client.Segment{LMR: a.lmr, Offset: 64<<10 + uint64(size) + off, Length: l}, rb, client.Signaled)
			}
			if err != nil {
				return err
			}
			posted++
		}
		ev, err := a.req.Wait(ctx)
		if err != nil {
			return err
		}
		if ev.Status != completion.Success {
			return fmt.Errorf("request %d: %v", ev.Cookie, ev.Status)
		}
		done++
	}
	return nil
}
