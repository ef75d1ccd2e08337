// Command softrnic-ping is rping for softrnic: it speaks rping's own
// exchange, so it pings rdma-core's rping (on Linux siw or any iWARP NIC)
// in either role.
//
// Each ping: the client Sends the address, STag and size of its source
// buffer (16 octets, big-endian); the server RDMA-Reads it and Sends a
// go-ahead; the client Sends its sink buffer; the server RDMA-Writes what it
// read into it and Sends a go-ahead; the client may compare (-V).
//
//	softrnic-ping -s [-a ADDR] [-p PORT] [-S SIZE] [-v] [-P] [MPA options] --socket PATH
//	softrnic-ping -c -a ADDR [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [MPA options] --socket PATH
//
// MPA options (rping has none; siw takes them as module parameters):
// --no-crc does not ask for CRC; --mpa-rev 1 speaks RFC 5044's revision 1
// instead of RFC 6581's 2; --p2p asks for (client) or accepts (server) the
// peer-to-peer model, in which the client sends a ready-to-receive message
// first; --rtr write,read,send limits the RTR messages the client offers
// or the server accepts (default write,read). A zero-length Send as RTR
// takes one of the server's posted receives, which rping's exchange does
// not expect: "send" is there to test a peer's negotiation, not to ping.
//
// The server serves one client and exits, or with -P (persistent) serves
// clients one after the other until it is stopped: a client whose
// connection fails or breaks, at any point, is reported on standard error
// and the server goes on to the next request. Only the loss of the daemon
// (or -timeout) ends a persistent server.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// rping's constants (rdma-core librdmacm/examples/rping.c).
const (
	infoLen     = 16 // struct rping_rdma_info: buf (8), rkey (4), size (4), big-endian
	defaultSize = 64
	minSize     = 23
	maxSize     = 65535
	defaultPort = 7174
	// Offsets in the one registered buffer.
	offRecv  = 0
	offSend  = 64
	offRDMA  = 4096
	offStart = offRDMA + 65536
	// acceptTimeout bounds the wait for ESTABLISHED after an Accept, so
	// that a client that vanishes mid-handshake cannot hold the server.
	acceptTimeout = 10 * time.Second
)

type opts struct {
	server, client, verbose, validate, persistent bool
	noCRC, p2p                                    bool
	mpaRev                                        int
	rtr                                           client.RTR
	addr                                          string
	port, count, size                             int
	socket                                        string
	timeout                                       time.Duration
}

func main() {
	var o opts
	flag.BoolVar(&o.server, "s", false, "server")
	flag.BoolVar(&o.client, "c", false, "client")
	flag.StringVar(&o.addr, "a", "", "address: the server's (client), or to listen on (server)")
	flag.IntVar(&o.port, "p", defaultPort, "port")
	flag.IntVar(&o.count, "C", 0, "pings (client; 0: until interrupted)")
	flag.IntVar(&o.size, "S", defaultSize, "ping buffer size")
	flag.BoolVar(&o.verbose, "v", false, "display the ping data")
	flag.BoolVar(&o.validate, "V", false, "validate the ping data")
	flag.BoolVar(&o.persistent, "P", false, "persistent server: serve clients one after the other")
	flag.StringVar(&o.socket, "socket", "", "softrnicd control socket")
	flag.DurationVar(&o.timeout, "timeout", 0, "give up after this long (0: never)")
	flag.BoolVar(&o.noCRC, "no-crc", false, "do not ask for MPA CRC (it is still used if the peer asks)")
	flag.IntVar(&o.mpaRev, "mpa-rev", 2, "MPA revision: 2 (RFC 6581) or 1 (RFC 5044)")
	flag.BoolVar(&o.p2p, "p2p", false, "peer-to-peer model: the client sends an RTR message first (MPA revision 2)")
	rtr := flag.String("rtr", "", "with --p2p, the RTR messages the client offers or the server accepts: write, read, send, joined by commas (default write,read)")
	flag.Parse()
	usage := func(why string) {
		fmt.Fprintf(os.Stderr, "softrnic-ping: %s\nusage: softrnic-ping -s|-c [-a addr] [-p port] [-C count] [-S size %d..%d] [-v] [-V] [-P] [--no-crc] [--mpa-rev 1|2] [--p2p [--rtr write,read,send]] --socket PATH\n", why, minSize, maxSize)
		os.Exit(2)
	}
	switch {
	case o.server == o.client:
		usage("one of -s and -c")
	case o.size < minSize || o.size > maxSize:
		usage(fmt.Sprintf("-S %d out of range", o.size))
	case o.port <= 0 || o.port > 65535:
		usage(fmt.Sprintf("-p %d out of range", o.port))
	case o.mpaRev != 1 && o.mpaRev != 2:
		usage(fmt.Sprintf("--mpa-rev %d: 1 or 2", o.mpaRev))
	case o.p2p && o.mpaRev == 1:
		usage("--p2p needs MPA revision 2: revision 1 has no peer-to-peer model")
	case *rtr != "" && !o.p2p:
		usage("--rtr needs --p2p")
	}
	if *rtr != "" {
		var err error
		if o.rtr, err = client.ParseRTR(*rtr); err != nil {
			usage(err.Error())
		}
	}
	ctx := context.Background()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	var err error
	if o.server {
		err = serve(ctx, &o)
	} else {
		err = ping(ctx, &o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-ping:", err)
		os.Exit(1)
	}
}

// side is one end's resources; everything lives in one registered buffer.
type side struct {
	o              *opts
	ia             *client.IA
	pz             *client.PZ
	buf            *client.Buffer
	lmr            *client.LMR
	sends, recvs   *client.EVD
	conn, requests *client.EVD
	ep             *client.EP
	cookie         uint64
}

func open(ctx context.Context, o *opts) (*side, error) {
	ia, err := client.Open(ctx, client.Options{Socket: o.socket, Name: "softrnic-ping"})
	if err != nil {
		return nil, err
	}
	s := &side{o: o, ia: ia}
	if s.pz, err = ia.CreatePZ(); err != nil {
		return nil, err
	}
	if s.buf, err = ia.Alloc(offStart + 65536); err != nil {
		return nil, err
	}
	if s.lmr, err = s.pz.RegisterLMR(s.buf, client.LocalWrite|client.RemoteRead|client.RemoteWrite); err != nil {
		return nil, err
	}
	for _, e := range []struct {
		p    **client.EVD
		kind client.EVDKind
	}{{&s.sends, client.DTOEvents}, {&s.recvs, client.DTOEvents}, {&s.conn, client.ConnectionEvents}, {&s.requests, client.CREvents}} {
		if *e.p, err = ia.CreateEVD(client.EVDOptions{Depth: 64, Kind: e.kind}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// newEP makes an EP with rping's queues (16 sends, 2 receives, 1 Read
// each way) and posts its one 16-octet receive.
func (s *side) newEP() error {
	var err error
	s.ep, err = s.ia.CreateEP(client.EPAttr{PZ: s.pz, RecvEVD: s.recvs, RequestEVD: s.sends, ConnectEVD: s.conn,
		SQDepth: 16, RQDepth: 2, IRD: 1, ORD: 1, NoCRC: s.o.noCRC, MPARevision: s.o.mpaRev, PeerToPeer: s.o.p2p, RTR: s.o.rtr})
	if err != nil {
		return err
	}
	if err := s.postRecv(); err != nil {
		_ = s.ep.Free()
		return err
	}
	return nil
}

func (s *side) postRecv() error {
	return s.ep.PostRecv(0, []client.Segment{{LMR: s.lmr, Offset: offRecv, Length: infoLen}})
}

// errDisconnected: the peer went away while we waited (how a non-persistent
// rping server learns its client is done).
var errDisconnected = errors.New("disconnected")

// next waits for evd's next event about the current EP. The EVDs outlive
// each client's EP: what an earlier EP left queued (its flushed receive,
// its DISCONNECTED) is dropped here, so that it is not taken for the
// current client's.
func (s *side) next(ctx context.Context, evd *client.EVD) (client.Event, error) {
	for {
		ev, err := evd.Wait(ctx)
		if err != nil || ev.EP == s.ep {
			return ev, err
		}
	}
}

// recv waits for the next 16-octet message and reposts the receive.
func (s *side) recv(ctx context.Context) ([]byte, error) {
	ev, err := s.next(ctx, s.recvs)
	if err != nil {
		return nil, err
	}
	if ev.Status == completion.FlushError {
		return nil, errDisconnected
	}
	if ev.Status != completion.Success {
		return nil, fmt.Errorf("receive: %v", ev.Status)
	}
	if ev.Length != infoLen {
		return nil, fmt.Errorf("received bogus data, size %d", ev.Length)
	}
	msg := bytes.Clone(s.buf.Bytes[offRecv : offRecv+infoLen])
	return msg, s.postRecv()
}

// done waits for the completion of the request just posted.
func (s *side) done(ctx context.Context, what string) error {
	ev, err := s.next(ctx, s.sends)
	if err != nil {
		return err
	}
	if ev.Status != completion.Success {
		return fmt.Errorf("%s: %v (cause %v)", what, ev.Status, ev.Cause)
	}
	if ev.Cookie != s.cookie {
		return fmt.Errorf("%s: completion %d, expected %d", what, ev.Cookie, s.cookie)
	}
	return nil
}

// sendInfo Sends an rping_rdma_info (or, for the server's go-ahead, zeros).
func (s *side) sendInfo(ctx context.Context, addr uint64, stag uint32, size int) error {
	b := s.buf.Bytes[offSend : offSend+infoLen]
	binary.BigEndian.PutUint64(b, addr)
	binary.BigEndian.PutUint32(b[8:], stag)
	binary.BigEndian.PutUint32(b[12:], uint32(size))
	s.cookie++
	if err := s.ep.PostSend(s.cookie, []client.Segment{{LMR: s.lmr, Offset: offSend, Length: infoLen}}, client.Signaled); err != nil {
		return err
	}
	return s.done(ctx, "send")
}

func serve(ctx context.Context, o *opts) error {
	s, err := open(ctx, o)
	if err != nil {
		return err
	}
	defer s.ia.Close()
	if _, err := s.ia.CreatePSP(uint16(o.port), s.requests, false); err != nil {
		return err
	}
	fmt.Printf("softrnic-ping: server listening on %s:%d\n", s.ia.Attr().Address, o.port)
	for {
		// Only the listener's own failures end here: its EVD fails when
		// the daemon goes or -timeout passes.
		ev, err := s.requests.Wait(ctx)
		if err != nil {
			return err
		}
		if ev.CR == nil {
			fmt.Fprintf(os.Stderr, "softrnic-ping: unexpected event %d on the request EVD\n", ev.Type)
			continue
		}
		peer := "client"
		if info, err := ev.CR.Query(); err == nil {
			peer = info.RemoteAddr
		}
		err = s.serveOne(ctx, ev.CR)
		switch {
		case !o.persistent:
			return err
		case err != nil && s.lost(ctx, err):
			return err
		case err != nil:
			fmt.Fprintf(os.Stderr, "softrnic-ping: %s: %v; serving the next client\n", peer, err)
		}
	}
}

// lost reports whether err, from serving one client, ends even a
// persistent server: the daemon went away or -timeout passed. Anything
// else is that client's failure.
func (s *side) lost(ctx context.Context, err error) bool {
	return ctx.Err() != nil || s.ia.Gone() || errors.Is(err, client.ErrClosed)
}

// serveOne accepts cr on a new EP and serves its pings until the client
// disconnects; the EP is freed (its connection aborted) however it ends.
func (s *side) serveOne(ctx context.Context, cr *client.CR) error {
	if err := s.newEP(); err != nil {
		_ = cr.Reject(nil) // the client hears at once, not at its timeout
		return err
	}
	defer s.ep.Free()
	if err := cr.Accept(s.ep, nil); err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, acceptTimeout)
	ev, err := s.next(actx, s.conn)
	cancel()
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	if ev.Conn != client.Established {
		return fmt.Errorf("accept: %v%s", ev.Conn, causeText(ev))
	}
	for {
		// The client's source advertisement, or its disconnect.
		info, err := s.recv(ctx)
		if errors.Is(err, errDisconnected) {
			return nil
		}
		if err != nil {
			return err
		}
		addr, stag, size := binary.BigEndian.Uint64(info), binary.BigEndian.Uint32(info[8:]), int(binary.BigEndian.Uint32(info[12:]))
		if size > s.o.size {
			return fmt.Errorf("client's buffer of %d octets exceeds ours of %d (-S)", size, s.o.size)
		}
		s.cookie++
		if err := s.ep.PostRead(s.cookie, client.Segment{LMR: s.lmr, Offset: offRDMA, Length: uint32(size)},
			client.RemoteBuffer{Context: stag, Address: addr}, client.Signaled); err != nil {
			return err
		}
		if err := s.done(ctx, "RDMA Read"); err != nil {
			return err
		}
		data := s.buf.Bytes[offRDMA : offRDMA+size]
		if s.o.verbose {
			fmt.Printf("server ping data: %s\n", cstring(data))
		}
		if err := s.sendInfo(ctx, 0, 0, 0); err != nil { // go ahead
			return err
		}
		info, err = s.recv(ctx) // the sink advertisement
		if err != nil {
			return err
		}
		addr, stag = binary.BigEndian.Uint64(info), binary.BigEndian.Uint32(info[8:])
		n := len(cstring(data)) + 1
		s.cookie++
		if err := s.ep.PostWrite(s.cookie, []client.Segment{{LMR: s.lmr, Offset: offRDMA, Length: uint32(n)}},
			client.RemoteBuffer{Context: stag, Address: addr}, client.Signaled); err != nil {
			return err
		}
		if err := s.done(ctx, "RDMA Write"); err != nil {
			return err
		}
		if err := s.sendInfo(ctx, 0, 0, 0); err != nil { // go ahead
			return err
		}
	}
}

func cstring(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// fillPing writes rping's pattern: "rdma-ping-N: " then a character cycling
// from 'A' to 'z' starting at start, and a NUL in the last octet.
func fillPing(b []byte, n int, start byte) {
	cc := copy(b, "rdma-ping-"+strconv.Itoa(n)+": ")
	c := start
	for i := cc; i < len(b); i++ {
		b[i] = c
		if c++; c > 122 {
			c = 65
		}
	}
	b[len(b)-1] = 0
}

func ping(ctx context.Context, o *opts) error {
	if o.addr == "" {
		return errors.New("-a is required with -c")
	}
	s, err := open(ctx, o)
	if err != nil {
		return err
	}
	defer s.ia.Close()
	if err := s.newEP(); err != nil {
		return err
	}
	if err := s.ep.Connect(net.JoinHostPort(o.addr, strconv.Itoa(o.port)), nil, 10*time.Second); err != nil {
		return err
	}
	if ev, err := s.next(ctx, s.conn); err != nil {
		return fmt.Errorf("connect: %w", err)
	} else if ev.Conn != client.Established {
		return fmt.Errorf("connect: %v%s", ev.Conn, causeText(ev))
	}
	start := byte(65)
	src := s.buf.Bytes[offStart : offStart+o.size]
	sink := s.buf.Bytes[offRDMA : offRDMA+o.size]
	for n := 0; o.count == 0 || n < o.count; n++ {
		fillPing(src, n, start)
		if start++; start > 122 {
			start = 65
		}
		clear(sink)
		if err := s.sendInfo(ctx, s.lmr.Address(offStart), s.lmr.Context, o.size); err != nil {
			return err
		}
		if _, err := s.recv(ctx); err != nil { // go ahead: the server has read
			return err
		}
		if err := s.sendInfo(ctx, s.lmr.Address(offRDMA), s.lmr.Context, o.size); err != nil {
			return err
		}
		if _, err := s.recv(ctx); err != nil { // go ahead: the server has written
			return err
		}
		if o.validate && !bytes.Equal(src, sink) {
			return fmt.Errorf("data mismatch in ping %d:\n sent %q\n back %q", n, src, sink)
		}
		if o.verbose {
			fmt.Printf("ping data: %s\n", cstring(sink))
		}
	}
	if err := s.ep.Disconnect(true); err != nil {
		return err
	}
	if ev, err := s.next(ctx, s.conn); err != nil {
		return fmt.Errorf("disconnect: %w", err)
	} else if ev.Conn != client.Disconnected && ev.Conn != client.Broken {
		return fmt.Errorf("disconnect: %v%s", ev.Conn, causeText(ev))
	}
	return nil
}

// causeText is ": " and the Terminate that ended the connection, if any.
func causeText(ev client.Event) string {
	if ev.Cause == nil {
		return ""
	}
	return fmt.Sprintf(" (Terminate: %v)", ev.Cause)
}
