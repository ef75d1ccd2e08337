package main

// perftest compatibility (--perftest): the exchange rdma-core's perftest
// tools use with -R, as Debian 12's perftest (4.5+0.17, version "6.06")
// puts it on the wire (see docs/interop-wire-notes.md): a control
// connection carrying Sends of fixed sizes, client first, strictly
// alternating — version (16 octets), cycle buffer and cache line (4 octets
// each, big-endian), MTU (2), a zeroed pingpong_dest (56) — then a second
// connection to the same port for the measured QP, four more pingpong_dest
// exchanges (the last three with the data buffer's rkey at 16 and vaddr at
// 24), the data, one exchange, five 8-octet reports and a closing exchange.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

const (
	ptVersion   = "6.06"
	ptDestLen   = 56
	ptCycle     = 4096
	ptCacheLine = 64
	ptCtlBuf    = 4096
)

// ptCtl is the control connection.
type ptCtl struct {
	p       *peer
	ep      *client.EP
	sends   *client.EVD // the control QP's own queues: its messages
	recvs   *client.EVD // race the measured QP's and must not mix
	recvOff uint64      // two receive slots
	sendOff uint64
	cookie  uint64
}

func (c *ptCtl) postRecv(slot int) error {
	return c.ep.PostRecv(uint64(slot), []client.Segment{{LMR: c.p.lmr, Offset: c.recvOff + uint64(slot)*ptCtlBuf, Length: ptCtlBuf}})
}

func (c *ptCtl) send(ctx context.Context, b []byte) error {
	copy(c.p.buf.Bytes[c.sendOff:], b)
	c.cookie++
	if err := c.ep.PostSend(c.cookie, []client.Segment{{LMR: c.p.lmr, Offset: c.sendOff, Length: uint32(len(b))}}, client.Signaled); err != nil {
		return err
	}
	_, err := reap(ctx, c.sends)
	return err
}

func (c *ptCtl) recv(ctx context.Context) ([]byte, error) {
	ev, err := c.recvs.Wait(ctx)
	if err != nil {
		return nil, err
	}
	if ev.Status != completion.Success {
		return nil, fmt.Errorf("control receive: %v", ev.Status)
	}
	off := c.recvOff + ev.Cookie*ptCtlBuf
	b := append([]byte(nil), c.p.buf.Bytes[off:off+uint64(ev.Length)]...)
	return b, c.postRecv(int(ev.Cookie))
}

// xchg: the client sends then receives; the server receives then replies.
func (c *ptCtl) xchg(ctx context.Context, server bool, mine []byte) ([]byte, error) {
	if server {
		theirs, err := c.recv(ctx)
		if err != nil {
			return nil, err
		}
		return theirs, c.send(ctx, mine)
	}
	if err := c.send(ctx, mine); err != nil {
		return nil, err
	}
	return c.recv(ctx)
}

func versionAtLeast(v []byte, want float64) bool {
	f, err := strconv.ParseFloat(string(trimNUL(v)), 64)
	return err == nil && f >= want
}

// dest encodes a pingpong_dest: lid, out_reads, qpn, psn, rkey, pad,
// vaddr, gid[16], srqn, gid_index; big-endian.
func dest(outReads, qpn uint32, rkey uint32, vaddr uint64) []byte {
	b := make([]byte, ptDestLen)
	binary.BigEndian.PutUint32(b[4:], outReads)
	binary.BigEndian.PutUint32(b[8:], qpn)
	binary.BigEndian.PutUint32(b[12:], rand.Uint32()&0xffffff)
	binary.BigEndian.PutUint32(b[16:], rkey)
	binary.BigEndian.PutUint64(b[24:], vaddr)
	return b
}

// runPerftest runs --perftest mode; the EP p.ep is the measured QP.
func runPerftest(ctx context.Context, o *opts) error {
	// write_lat is left out on purpose: perftest's server (the MPA
	// responder) writes first, which RFC 5044 §7.1.2 forbids a responder.
	supported := o.testNumber == writeBW || o.testNumber == readBW || o.testNumber == readLat ||
		o.testNumber == sendBW
	server := o.server == ""
	if !supported && server {
		return fmt.Errorf("--perftest supports write_bw, read_bw, send_bw and read_lat")
	}
	p, err := setup(ctx, o)
	if err != nil {
		return err
	}
	defer p.ia.Close()
	// The control QP: two receives, its own event queues (its closing
	// message can overtake the last measured Send), and one RDMA Read
	// each way, for a peer-to-peer RTR Read (RFC 6581 §9.2): an
	// initiator offering one asks for ORD 1, which our IRD must meet.
	c := &ptCtl{p: p, recvOff: uint64(o.bufSize) - 3*ptCtlBuf, sendOff: uint64(o.bufSize) - ptCtlBuf}
	for _, e := range []**client.EVD{&c.sends, &c.recvs} {
		if *e, err = p.ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.DTOEvents}); err != nil {
			return err
		}
	}
	ctlEP, err := p.ia.CreateEP(client.EPAttr{PZ: p.pz, RecvEVD: c.recvs, RequestEVD: c.sends, ConnectEVD: p.conn,
		SQDepth: 4, RQDepth: 4, IRD: 1, ORD: 1, NoCRC: o.noCRC, MPARevision: o.mpaRev, PeerToPeer: o.p2p, RTR: o.rtr})
	if err != nil {
		return err
	}
	c.ep = ctlEP
	for i := 0; i < 2; i++ {
		if err := c.postRecv(i); err != nil {
			return err
		}
	}
	reads := uint32(1)
	if o.testNumber == readBW || o.testNumber == readLat {
		reads = 32 // the measured EP's IRD/ORD
	}
	var psp *client.PSP
	addr := o.server
	if server {
		if psp, err = p.ia.CreatePSP(uint16(o.port), p.reqs, false); err != nil {
			return err
		}
		if !o.jsonOut {
			fmt.Printf("************************************\n* Waiting for client to connect... *\n************************************\n")
		}
		if err := acceptOn(ctx, p, ctlEP); err != nil {
			return err
		}
	} else {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			addr = net.JoinHostPort(addr, strconv.Itoa(o.port))
		}
		if err := connectRetry(ctx, p, ctlEP, addr); err != nil {
			return err
		}
	}
	// Parameters.
	ver := make([]byte, 16)
	copy(ver, ptVersion)
	peerVer, err := c.xchg(ctx, server, ver)
	if err != nil {
		return err
	}
	if !supported {
		// A client for a test we do not speak yet: leave at once, which
		// also ends the perftest server's wait for its client.
		_ = ctlEP.Disconnect(false)
		return fmt.Errorf("%s: not supported with --perftest yet (write_bw, read_bw, send_bw, read_lat); left the server (version %q)", o.test, string(trimNUL(peerVer)))
	}
	if versionAtLeast(peerVer, 5.32) {
		for _, v := range []uint32{ptCycle, ptCacheLine} {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], v)
			if _, err := c.xchg(ctx, server, b[:]); err != nil {
				return err
			}
		}
	}
	if versionAtLeast(peerVer, 5.31) {
		if _, err := c.xchg(ctx, server, []byte{'3', 0}); err != nil {
			return err
		}
	}
	zeros := make([]byte, ptDestLen)
	if _, err := c.xchg(ctx, server, zeros); err != nil {
		return err
	}
	// The measured connection, to the same port.
	if server {
		if err := acceptOn(ctx, p, p.ep); err != nil {
			return err
		}
		_ = psp.Free()
	} else if err := connectRetry(ctx, p, p.ep, addr); err != nil {
		return err
	}
	if _, err := c.xchg(ctx, server, zeros); err != nil {
		return err
	}
	mine := dest(reads, p.ep.Handle(), p.lmr.Context, p.lmr.Address(0))
	isSend := o.testNumber == sendBW
	if isSend {
		// On iWARP, perftest's send_bw advertises a credit word rather
		// than the data buffer; the server RDMA-writes its receive count
		// there (little-endian).
		mine = dest(reads, p.ep.Handle(), p.lmr.Context, p.lmr.Address(c.creditOff()))
		if server {
			for i := 0; i < ptRxDepth(o); i++ {
				if err := p.postRecv(i); err != nil {
					return err
				}
			}
		}
	}
	var theirs []byte
	// Bandwidth tests exchange the destination three times more, latency
	// tests and send_bw four (as captured between two siw guests).
	real := 3
	if o.isLatency || isSend {
		real = 4
	}
	for i := 0; i < real; i++ {
		if theirs, err = c.xchg(ctx, server, mine); err != nil {
			return err
		}
	}
	if len(theirs) < 32 {
		return fmt.Errorf("peer's pingpong_dest has %d octets", len(theirs))
	}
	p.remote = client.RemoteBuffer{Context: binary.BigEndian.Uint32(theirs[16:]), Address: binary.BigEndian.Uint64(theirs[24:])}
	p.remoteSize = max(o.size, ptCycle)

	var r Result
	if !server {
		if !o.jsonOut {
			header(o)
		}
		base := Result{Test: o.test, Bytes: o.size, Iterations: o.iters}
		switch {
		case isSend:
			r, err = p.perftestSends(ctx, c, base)
		case o.isLatency:
			r, err = p.latency(ctx, o.size, base)
		default:
			r, err = p.bandwidth(ctx, o.size, base)
		}
		if err != nil {
			return err
		}
	}
	if server && isSend {
		if err := p.perftestReceive(ctx); err != nil {
			return err
		}
	}
	if o.isLatency || isSend {
		// Latency tests and send_bw end with one closing exchange and
		// no reports.
		return finishPerftest(ctx, c, p, server, mine, &r)
	}
	if _, err := c.xchg(ctx, server, mine); err != nil {
		return err
	}
	// Reports: size, iterations, peak, average (MiB/s), message rate.
	for i, v := range []uint64{uint64(o.size), uint64(r.Iterations), math.Float64bits(r.BWPeakMBps * 1e6 / (1 << 20)),
		math.Float64bits(r.BWAvgMBps * 1e6 / (1 << 20)), math.Float64bits(r.MsgRateMpps)} {
		var b [8]byte
		if !server {
			binary.BigEndian.PutUint64(b[:], v)
		}
		got, err := c.xchg(ctx, server, b[:])
		if err != nil {
			return err
		}
		if server && i == 4 && len(got) == 8 && !o.jsonOut {
			fmt.Printf(" peer reports %.6f Mpps\n", math.Float64frombits(binary.BigEndian.Uint64(got)))
		}
	}
	return finishPerftest(ctx, c, p, server, mine, &r)
}

// finishPerftest makes the closing exchange, prints the result and ends
// the measured connection as perftest does: its server disconnects, and
// both wait for the disconnect.
func finishPerftest(ctx context.Context, c *ptCtl, p *peer, server bool, mine []byte, r *Result) error {
	o := p.o
	if _, err := c.xchg(ctx, server, mine); err != nil {
		return err
	}
	if !server {
		if o.jsonOut {
			_ = json.NewEncoder(os.Stdout).Encode([]Result{*r})
		} else {
			line(o, r)
		}
	}
	// The perftest server closes the measured connection; both wait for
	// the disconnect.
	if server {
		_ = p.ep.Disconnect(true)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		ev, err := p.conn.Wait(wctx)
		if err != nil {
			return nil // the peer never closed: we are done anyway
		}
		if ev.EP == p.ep && (ev.Conn == client.Disconnected || ev.Conn == client.Broken) {
			if !server {
				_ = p.ep.Disconnect(true)
			}
			return nil
		}
	}
}

func acceptOn(ctx context.Context, p *peer, ep *client.EP) error {
	ev, err := p.reqs.Wait(ctx)
	if err != nil {
		return err
	}
	if err := ev.CR.Accept(ep, nil); err != nil {
		return err
	}
	return waitEstablished(ctx, p, ep)
}

func waitEstablished(ctx context.Context, p *peer, ep *client.EP) error {
	for {
		ev, err := p.conn.Wait(ctx)
		if err != nil {
			return err
		}
		if ev.EP != ep {
			continue
		}
		if ev.Conn != client.Established {
			return fmt.Errorf("connection: %v", ev.Conn)
		}
		return nil
	}
}

// connectRetry connects, retrying as perftest's client does while the
// server has not listened again yet (10 times, 100 ms apart).
func connectRetry(ctx context.Context, p *peer, ep *client.EP, addr string) error {
	var last error
	for i := 0; i < 10; i++ {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
			_ = ep.Reset()
		}
		if err := ep.Connect(addr, nil, 10*time.Second); err != nil {
			return err
		}
		if last = waitEstablished(ctx, p, ep); last == nil {
			return nil
		}
	}
	return errors.Join(errors.New("connect: no luck after 10 tries"), last)
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// ptRxDepth is perftest's receive depth for send_bw: 512, at most the
// iterations, rounded up to even.
func ptRxDepth(o *opts) int {
	d := min(512, o.iters)
	return d + d%2
}

// creditOff is where the credit word lives: just before the control area.
func (c *ptCtl) creditOff() uint64 { return c.recvOff - 64 }

// perftestSends is send_bw's client: Sends, never more than the receive
// depth beyond what the server's credit says it has taken.
func (p *peer) perftestSends(ctx context.Context, c *ptCtl, r Result) (Result, error) {
	o := p.o
	depth := ptRxDepth(o)
	credit := (*uint32)(unsafe.Pointer(&p.buf.Bytes[c.creditOff()]))
	start := time.Now()
	posted, done := 0, 0
	for done < o.iters {
		for posted < o.iters && posted-done < o.depth && posted+1-int(atomic.LoadUint32(credit)) < depth {
			if err := p.ep.PostSend(uint64(posted), []client.Segment{{LMR: p.lmr, Length: uint32(o.size)}}, client.Signaled); err != nil {
				return r, err
			}
			posted++
		}
		if posted == done {
			// Waiting for credit only: the server's Write has no event.
			time.Sleep(10 * time.Microsecond)
			continue
		}
		if _, err := reap(ctx, p.sends); err != nil {
			return r, err
		}
		done++
	}
	el := time.Since(start).Seconds()
	r.BWAvgMBps = float64(done*o.size) / el / 1e6
	r.BWPeakMBps = r.BWAvgMBps
	r.MsgRateMpps = float64(done) / el / 1e6
	return r, nil
}

// perftestReceive is send_bw's server: take iters Sends, reposting, and
// write the count to the client's credit word every third of the depth.
func (p *peer) perftestReceive(ctx context.Context) error {
	o := p.o
	depth := ptRxDepth(o)
	step := max(1, depth/3)
	var count [8]byte
	for n := 1; n <= o.iters; n++ {
		ev, err := p.recvs.Wait(ctx)
		if err != nil {
			return err
		}
		if ev.Status != completion.Success {
			return fmt.Errorf("receive %d: %v", n, ev.Status)
		}
		if n+depth <= o.iters {
			if err := p.postRecv(n + depth); err != nil {
				return err
			}
		}
		if n%step == 0 || n == o.iters {
			binary.LittleEndian.PutUint32(count[:], uint32(n))
			off := uint64(o.bufSize - 8)
			copy(p.buf.Bytes[off:], count[:4])
			if err := p.ep.PostWrite(uint64(1<<40+n), []client.Segment{{LMR: p.lmr, Offset: off, Length: 4}}, p.remote, client.Signaled); err != nil {
				return err
			}
			if _, err := reap(ctx, p.sends); err != nil {
				return err
			}
		}
	}
	return nil
}
