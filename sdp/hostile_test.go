package sdp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/sdp"
)

// rawPeer is an RDMA endpoint that speaks to an sdp listener through the
// client API directly, saying whatever a test wants.
type rawPeer struct {
	sent int // sends posted, each from a buffer of its own
	ia   *client.IA
	pz   *client.PZ
	evd  *client.EVD
	ep   *client.EP
	buf  *client.Buffer
	lmr  *client.LMR
}

func newRawPeer(t *testing.T, sock string) *rawPeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ia, err := client.Open(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ia.Close() })
	p := &rawPeer{ia: ia}
	pz, _ := ia.CreatePZ()
	p.pz = pz
	// 16 receive buffers of 64 KiB, then 8 send buffers.
	p.buf, _ = ia.Alloc(3 << 19)
	p.lmr, _ = pz.RegisterLMR(p.buf, client.LocalWrite|client.RemoteRead)
	p.evd, _ = ia.CreateEVD(client.EVDOptions{Depth: 64, Kind: client.DTOEvents | client.ConnectionEvents})
	p.ep, err = ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: p.evd, RequestEVD: p.evd, ConnectEVD: p.evd, SQDepth: 16, RQDepth: 16, IRD: 1, ORD: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		p.ep.PostRecv(uint64(i), []client.Segment{{LMR: p.lmr, Offset: uint64(i) << 16, Length: 1 << 16}})
	}
	return p
}

// connect connects with private data pd and returns the first connection
// event.
func (p *rawPeer) connect(t *testing.T, addr string, pd []byte) client.ConnEvent {
	t.Helper()
	if err := p.ep.Connect(addr, pd, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for {
		ev, _, err := p.evd.WaitTimeout(10*time.Second, 1)
		if err != nil {
			t.Fatalf("waiting for the connection: %v", err)
		}
		if ev.Type == client.ConnectionEvent {
			return ev.Conn
		}
	}
}

// send posts msg as one Send.
func (p *rawPeer) send(t *testing.T, msg []byte) {
	t.Helper()
	off := uint64(1<<20) + uint64(p.sent%8)<<16
	p.sent++
	copy(p.buf.Bytes[off:], msg)
	if err := p.ep.PostSend(99, []client.Segment{{LMR: p.lmr, Offset: off, Length: uint32(len(msg))}}, 0); err != nil {
		t.Fatal(err)
	}
}

func hello() []byte { return helloAdverts(1) }

// helloAdverts is a Hello that takes n SrcAvails outstanding.
func helloAdverts(n uint8) []byte {
	h := sdp.Hello{BSDH: sdp.BSDH{Bufs: 16}, Version: sdp.Version, IPVersion: 4, MaxAdverts: n, DesRemRcvSz: 1 << 16, LocalRcvSz: 1 << 16}
	return h.Marshal()
}

func msg(mid sdp.MID, mseq uint32, data []byte) []byte {
	b := make([]byte, sdp.BSDHLen+len(data))
	sdp.BSDH{MID: mid, Bufs: 16, Len: uint32(len(b)), MSeq: mseq}.Put(b)
	copy(b[sdp.BSDHLen:], data)
	return b
}

// rawClient connects a raw peer to ln with a good Hello and returns it with
// the connection ln accepted.
func rawClient(t *testing.T, sock string, ln net.Listener) (*rawPeer, net.Conn) {
	t.Helper()
	return rawClientHello(t, sock, ln, hello())
}

// rawClientHello is rawClient with the Hello pd.
func rawClientHello(t *testing.T, sock string, ln net.Listener, pd []byte) (*rawPeer, net.Conn) {
	t.Helper()
	p := newRawPeer(t, sock)
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := acceptOne(ln, 10*time.Second); ch <- res{c, err} }()
	if ev := p.connect(t, ln.Addr().String(), pd); ev != client.Established {
		t.Fatalf("connect: %v", ev)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return p, r.c
}

// acceptOne accepts the next connection of ln within d.
func acceptOne(ln net.Listener, d time.Duration) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-time.After(d):
		return nil, errors.New("nothing accepted")
	}
}

// A client whose request carries no Hello, or a Hello that offers no
// buffer, is refused; the listener goes on accepting.
func TestListenerRefusesBadHellos(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	short := hello()[:40]
	zero := hello()
	binary.BigEndian.PutUint32(zero[sdp.BSDHLen+8:], 0) // LocalRcvSz
	notHello := hello()
	notHello[0] = byte(sdp.MIDData)
	gen1 := hello()
	gen1[sdp.BSDHLen] = 0x11 // the first generation's version
	ip5 := hello()
	ip5[sdp.BSDHLen+1] = 0x50
	ip6 := hello()
	ip6[sdp.BSDHLen+1] = 0x60 // from an IPv4 address
	for name, pd := range map[string][]byte{"none": nil, "short": short, "no buffers": zero, "not a Hello": notHello,
		"version 1.1": gen1, "IP version 5": ip5, "IP version 6 from IPv4": ip6} {
		p := newRawPeer(t, sock)
		if ev := p.connect(t, ln.Addr().String(), pd); ev == client.Established {
			t.Errorf("%s: a request with that private data was accepted", name)
		}
	}
	c1, c2, err := pair(t, &sdp.Dialer{Socket: sock, NoFallback: true}, ln)
	if err != nil {
		t.Fatalf("a good client after the bad ones: %v", err)
	}
	c1.Close()
	c2.Close()
}

// A peer that breaks the protocol after a good Hello resets the
// connection: the accepted side's Read fails with a reset after the data
// that came before, and nothing hangs.
func TestPeerBreaksTheProtocol(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	badLen := msg(sdp.MIDData, 2, []byte("x"))
	binary.BigEndian.PutUint32(badLen[4:], 9999)
	cases := map[string][]byte{
		"MSeq skips":         msg(sdp.MIDData, 5, []byte("x")),
		"Len lies":           badLen,
		"unknown identifier": msg(0x42, 2, nil),
		"shorter than BSDH":  []byte("tiny"),
		"SrcAvail":           append(msg(sdp.MIDSrcAvail, 2, make([]byte, 16)), 0),
		"MSeqAck from the future": func() []byte {
			b := msg(sdp.MIDData, 2, nil)
			binary.BigEndian.PutUint32(b[12:], 100) // we sent none
			return b
		}(),
	}
	for name, bad := range cases {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			p, c := rawClient(t, sock, ln)
			defer c.Close()
			if name == "SrcAvail" {
				binary.BigEndian.PutUint32(bad[4:], uint32(len(bad)))
			}
			p.send(t, msg(sdp.MIDData, 1, []byte("good")))
			p.send(t, bad)
			readThenReset(t, c, "good")
		})
	}
}

// A client that says nothing, or starts an MPA Request and stops, is a TCP
// client once DetectTimeout passes; a client that sends a whole Request
// and nothing more holds no accept.
func TestSilentAndHalfClients(t *testing.T) {
	sock := startDaemon(t)
	lc := sdp.ListenConfig{Socket: sock, DetectTimeout: 100 * time.Millisecond, HelloTimeout: time.Second}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := acceptAll(ln)
	next := func(d time.Duration) net.Conn {
		select {
		case c := <-accepted:
			return c
		case <-time.After(d):
			return nil
		}
	}
	for _, first := range []string{"", "MPA ID", "MPA ID Req Frame"} {
		raw, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		raw.Write([]byte(first))
		c := next(3 * time.Second)
		switch {
		case first == "MPA ID Req Frame":
			if c != nil {
				t.Errorf("a stalled MPA Request was accepted as a %T", c)
				c.Close()
			}
		case c == nil:
			t.Errorf("client that sent %q: nothing accepted", first)
		default:
			if _, ok := c.(*net.TCPConn); !ok {
				t.Errorf("client that sent %q accepted as a %T", first, c)
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			got := make([]byte, len(first))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != first {
				t.Errorf("the TCP client's first octets: %q %v", got, err)
			}
			c.Close()
		}
	}
	c1, err := (&sdp.Dialer{Socket: sock, NoFallback: true, HelloTimeout: 20 * time.Second}).DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("a good client after them: %v", err)
	}
	c2 := next(5 * time.Second)
	if _, ok := c2.(*sdp.Conn); !ok {
		t.Fatalf("the good client accepted as a %T", c2)
	}
	c1.Close()
	c2.Close()
}

// recv waits for the raw peer's next received message.
func (p *rawPeer) recv(t *testing.T) (sdp.BSDH, []byte) {
	t.Helper()
	for {
		ev, _, err := p.evd.WaitTimeout(10*time.Second, 1)
		if err != nil {
			t.Fatalf("raw peer: %v", err)
		}
		if ev.Type == client.DTOCompletion && ev.Opcode == completion.OpRecv {
			if ev.Status != completion.Success {
				t.Fatalf("raw peer's receive: %v", ev.Status)
			}
			m := append([]byte(nil), p.buf.Bytes[ev.Cookie<<16:ev.Cookie<<16+uint64(ev.Length)]...)
			p.ep.PostRecv(ev.Cookie, []client.Segment{{LMR: p.lmr, Offset: ev.Cookie << 16, Length: 1 << 16}})
			h, err := sdp.ParseBSDH(m)
			if err != nil {
				t.Fatalf("raw peer received: %v", err)
			}
			return h, m
		}
		if ev.Type == client.ConnectionEvent {
			t.Fatalf("raw peer: %v", ev.Conn)
		}
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// A peer's SrcAvail is read with RDMA Read and answered with RdmaRdCompl,
// in its place in the stream; one it withdraws at once is declined
// (SendSM, then its data comes by Bcopy) or completed, whichever the
// race gives.
func TestSrcAvailFromPeer(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	// The source's region: a buffer of its own.
	const n = 300 << 10
	src := newSource(t, p, n, 1)
	avail := func(mseq uint32) []byte { return src.avail(mseq, n) }
	p.send(t, msg(sdp.MIDData, 1, []byte("head")))
	p.send(t, avail(2))
	p.send(t, msg(sdp.MIDData, 3, []byte("tail")))
	want := append(append([]byte("head"), pattern(n, 1)...), "tail"...)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d octets, err %v; equal %v", len(got), err, bytes.Equal(got, want))
	}
	h, m := p.recv(t)
	if h.MID != sdp.MIDRdmaRdCompl || sdp.ParseLen(m) != n {
		t.Fatalf("the source got %v (%d octets), want RdmaRdCompl of %d", h.MID, len(m), n)
	}
	if st := c.(*sdp.Conn).Stats(); st.ZcopyReceived != n {
		t.Errorf("ZcopyReceived %d, want %d", st.ZcopyReceived, n)
	}

	// Withdrawn at once.
	p.send(t, avail(4))
	p.send(t, msg(sdp.MIDSrcAvailCancel, 5, nil))
	h, _ = p.recv(t)
	switch h.MID {
	case sdp.MIDSendSM:
		p.send(t, msg(sdp.MIDData, 6, pattern(60000, 1)))
		want = pattern(60000, 1)
	case sdp.MIDRdmaRdCompl:
		want = pattern(n, 1)
	default:
		t.Fatalf("the cancel was answered with %v", h.MID)
	}
	got = make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after %v: read %d octets, err %v", h.MID, len(got), err)
	}
}

// Our SrcAvail declined by the sink (SendSM): the data comes by Bcopy, whole
// and in order.
func TestSrcAvailDeclined(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	p.send(t, msg(sdp.MIDData, 1, nil)) // MPA: the initiator speaks first
	data := pattern(100<<10, 3)
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	h, _ := p.recv(t)
	if h.MID != sdp.MIDSrcAvail {
		t.Fatalf("a 100 KiB Write came as %v, want SrcAvail", h.MID)
	}
	b := make([]byte, sdp.BSDHLen)
	sdp.BSDH{MID: sdp.MIDSendSM, Bufs: 16, Len: sdp.BSDHLen, MSeq: 2, MSeqAck: h.MSeq}.Put(b)
	p.send(t, b)
	var got []byte
	for len(got) < len(data) {
		h, m := p.recv(t)
		if h.MID != sdp.MIDData {
			t.Fatalf("after SendSM: %v", h.MID)
		}
		got = append(got, m[sdp.BSDHLen:]...)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the declined SrcAvail's data differs")
	}
}

// Our SrcAvails, several outstanding to a peer whose Hello takes them,
// declined together by one SendSM: all their data comes by Bcopy, whole
// and in order; the second time with SrcAvails on both sides of the source
// region's end, which the Bcopy wraps with them (found in review).
func TestSrcAvailsDeclinedTogether(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClientHello(t, sock, ln, helloAdverts(sdp.MaxAdverts))
	defer c.Close()
	p.send(t, msg(sdp.MIDData, 1, nil))
	mseq := uint32(2)
	var last uint32
	credit := func(mid sdp.MID) {
		b := make([]byte, sdp.BSDHLen)
		sdp.BSDH{MID: mid, Bufs: 16, Len: sdp.BSDHLen, MSeq: mseq, MSeqAck: last}.Put(b)
		p.send(t, b)
		mseq++
	}
	for round, data := range [][]byte{pattern(3*sdp.ZSize/4, 5), pattern(sdp.ZSize/2, 6)} {
		if _, err := c.Write(data); err != nil {
			t.Fatal(err)
		}
		advertised := 0
		var vas []uint64
		for advertised < len(data) {
			h, m := p.recv(t)
			last = h.MSeq
			if h.MID != sdp.MIDSrcAvail {
				if h.MID == sdp.MIDData && h.Len == sdp.BSDHLen {
					continue
				}
				t.Fatalf("round %d: %v", round, h.MID)
			}
			sa := sdp.ParseSrcAvail(m)
			vas = append(vas, sa.VA)
			advertised += int(sa.Len)
		}
		if len(vas) < 2 || len(vas) > sdp.MaxAdverts {
			t.Fatalf("round %d: %d SrcAvails outstanding, want 2 to %d", round, len(vas), sdp.MaxAdverts)
		}
		if round == 1 && !slices.ContainsFunc(vas[1:], func(va uint64) bool { return va < vas[0] }) {
			t.Fatalf("round %d: SrcAvails at %x, want some past the region's end", round, vas)
		}
		credit(sdp.MIDSendSM)
		var got []byte
		for k := 1; len(got) < len(data); k++ {
			h, m := p.recv(t)
			if h.MID != sdp.MIDData {
				t.Fatalf("round %d after SendSM: %v", round, h.MID)
			}
			last = h.MSeq
			got = append(got, m[sdp.BSDHLen:]...)
			if k%8 == 0 {
				credit(sdp.MIDData)
			}
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("round %d: the declined data differs", round)
		}
		credit(sdp.MIDData)
	}
}

// A peer that keeps more SrcAvails outstanding than our Hello allowed is
// reset, after the application has what was read of them; as many as it
// allowed are taken.
func TestSrcAvailBeyondMaxAdverts(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	src := newSource(t, p, sdp.ZSize, 9)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	read := func(want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read %d octets: %v (equal %v)", len(want), err, bytes.Equal(got, want))
		}
	}
	mseq := uint32(1)
	avail := func(n int) {
		p.send(t, src.avail(mseq, n))
		mseq++
	}
	// The first fills the sink's region (the application reads
	// nothing yet), by RDMA Reads from a peer whose IRD is 1, and is
	// answered; those after it wait for room.
	fill := func() {
		t.Helper()
		avail(sdp.ZSize)
		if h, m := p.recv(t); h.MID != sdp.MIDRdmaRdCompl || sdp.ParseLen(m) != sdp.ZSize {
			t.Fatalf("the source got %v (%d octets), want RdmaRdCompl of %d", h.MID, sdp.ParseLen(m), sdp.ZSize)
		}
	}
	fill()
	for range sdp.MaxAdverts {
		avail(1000)
	}
	// As many as MaxAdverts outstanding are taken: once there is room
	// they are read and answered.
	read(pattern(sdp.ZSize, 9))
	for i := range sdp.MaxAdverts {
		if h, m := p.recv(t); h.MID != sdp.MIDRdmaRdCompl || sdp.ParseLen(m) != 1000 {
			t.Fatalf("SrcAvail %d of %d outstanding: the source got %v (%d octets), want RdmaRdCompl of 1000", i+2, sdp.MaxAdverts, h.MID, sdp.ParseLen(m))
		}
	}
	for range sdp.MaxAdverts {
		read(pattern(1000, 9))
	}
	// One more is not.
	fill()
	for range sdp.MaxAdverts + 1 {
		avail(1000)
	}
	if h, _ := p.recv(t); h.MID != sdp.MIDAbortConn {
		t.Fatalf("after %d SrcAvails outstanding the peer got %v, want AbortConn", sdp.MaxAdverts+1, h.MID)
	}
	got, err := io.ReadAll(c)
	if !bytes.Equal(got, pattern(sdp.ZSize, 9)) {
		t.Errorf("read %d octets before the error, want the first SrcAvail's %d", len(got), sdp.ZSize)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read error %v, want a reset", err)
	}
}

// A SrcAvail stays outstanding until its RdmaRdCompl is sent, not only
// until it is read: a peer that gives no credits for the answers and
// sends SrcAvail after SrcAvail, each read at once, is reset past
// MaxAdverts instead of growing what waits to be sent (found in review).
func TestSrcAvailsUnansweredForLackOfCredits(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	src := newSource(t, p, 1<<16, 3)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for i := range sdp.MaxAdverts + 1 {
		b := src.avail(uint32(1+i), 1000)
		binary.BigEndian.PutUint16(b[2:], 0) // Bufs 0: no credit for the answer
		p.send(t, b)
		if i == sdp.MaxAdverts {
			break
		}
		got := make([]byte, 1000)
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, pattern(1000, 3)) {
			t.Fatalf("SrcAvail %d: %v", i+1, err)
		}
	}
	if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after %d SrcAvails unanswered: read error %v, want a reset", sdp.MaxAdverts+1, err)
	}
}

// A SrcAvailCancel with several SrcAvails waiting for room declines all of
// them in one SendSM, which comes after the RdmaRdCompls of those begun
// and answers every one outstanding, as our source takes a SendSM; the
// source's Bcopy of their data follows what was read (found in review).
func TestCancelWithSeveralQueued(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	src := newSource(t, p, sdp.ZSize, 9)
	p.send(t, src.avail(1, sdp.ZSize)) // fills the sink's region
	if h, _ := p.recv(t); h.MID != sdp.MIDRdmaRdCompl {
		t.Fatalf("got %v, want RdmaRdCompl", h.MID)
	}
	p.send(t, src.avail(2, 1000))
	p.send(t, src.avail(3, 1000))
	p.send(t, msg(sdp.MIDSrcAvailCancel, 4, nil))
	h, _ := p.recv(t)
	if h.MID != sdp.MIDSendSM {
		t.Fatalf("got %v, want SendSM", h.MID)
	}
	// The declined data by Bcopy, acknowledging the SendSM; a SrcAvail
	// the source sent before it saw the SendSM is dropped.
	stale := src.avail(5, 1000)
	p.send(t, stale)
	b := msg(sdp.MIDData, 6, pattern(2000, 1))
	binary.BigEndian.PutUint32(b[12:], h.MSeq) // MSeqAck
	p.send(t, b)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	want := append(pattern(sdp.ZSize, 9), pattern(2000, 1)...)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read: %v (equal %v)", err, bytes.Equal(got, want))
	}
	// Nothing more: the next message of ours is the answer to a
	// SrcAvail sent after the SendSM was seen.
	a := src.avail(7, 500)
	binary.BigEndian.PutUint32(a[12:], h.MSeq)
	p.send(t, a)
	got = make([]byte, 500)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, pattern(500, 9)) {
		t.Fatalf("read after the SendSM was seen: %v", err)
	}
	for {
		h, m := p.recv(t)
		if h.MID == sdp.MIDData && h.Len == sdp.BSDHLen {
			continue // a credit update
		}
		if h.MID != sdp.MIDRdmaRdCompl || sdp.ParseLen(m) != 500 {
			t.Fatalf("after SendSM the source got %v of %d, want RdmaRdCompl of 500", h.MID, sdp.ParseLen(m))
		}
		break
	}
}

// A half-closed connection that then receives by Read Zcopy answers with
// an RdmaRdCompl after its DisConn; Close does not wait out its linger for
// it (found in review: an unsignaled answer never completed).
func TestCloseAfterHalfCloseAndZcopy(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	p.send(t, msg(sdp.MIDData, 1, nil))
	if err := c.(*sdp.Conn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if h, _ := p.recv(t); h.MID != sdp.MIDDisConn {
		t.Fatalf("after CloseWrite the peer got %v", h.MID)
	}
	const n = 100 << 10
	src := newSource(t, p, n, 4)
	p.send(t, src.avail(2, n))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, pattern(n, 4)) {
		t.Fatalf("read: %v", err)
	}
	if h, _ := p.recv(t); h.MID != sdp.MIDRdmaRdCompl {
		t.Fatalf("the peer got %v, want RdmaRdCompl", h.MID)
	}
	c.(*sdp.Conn).SetLinger(30)
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Close took %v: it waited out its linger", d)
	}
}

// source is a raw peer's Read Zcopy source region of n octets, pattern
// seed.
type source struct {
	lmr *client.LMR
}

func newSource(t *testing.T, p *rawPeer, n int, seed byte) *source {
	t.Helper()
	buf, err := p.ia.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf.Bytes, pattern(n, seed))
	lmr, err := p.pz.RegisterLMR(buf, client.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	return &source{lmr: lmr}
}

// avail is a SrcAvail, MSeq mseq, of the region's first n octets.
func (s *source) avail(mseq uint32, n int) []byte {
	var x [16]byte
	sdp.SrcAvail{Len: uint32(n), STag: s.lmr.Context, VA: s.lmr.Address(0)}.Put(x[:])
	return msg(sdp.MIDSrcAvail, mseq, x[:])
}

// A peer whose process dies (its session with the daemon ends at once),
// and a daemon that goes away under the connection: a waiting Read and a
// Write both return an error, never hang.
func TestPeerOrDaemonDies(t *testing.T) {
	t.Run("peer", func(t *testing.T) {
		sock := startDaemon(t)
		ln := listen(t, sock)
		p, c := rawClient(t, sock, ln)
		defer c.Close()
		p.send(t, msg(sdp.MIDData, 1, nil)) // credits, as a dialer's first message
		errc := make(chan error, 1)
		go func() { _, err := c.Read(make([]byte, 10)); errc <- err }()
		time.Sleep(50 * time.Millisecond)
		p.ia.Close() // as the process's death closes its session
		select {
		case err := <-errc:
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("Read after the peer died: %v, want a reset", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Read hangs after the peer died")
		}
		if _, err := c.Write([]byte("x")); err == nil {
			t.Fatal("Write after the peer died succeeded")
		}
	})
	t.Run("daemon", func(t *testing.T) {
		sock, d := startServer(t)
		ln := listen(t, sock)
		c1, c2, err := pair(t, &sdp.Dialer{Socket: sock, NoFallback: true}, ln)
		if err != nil {
			t.Fatal(err)
		}
		defer c1.Close()
		defer c2.Close()
		errc := make(chan error, 1)
		go func() { _, err := c1.Read(make([]byte, 10)); errc <- err }()
		time.Sleep(50 * time.Millisecond)
		d.Close()
		select {
		case err := <-errc:
			if err == nil {
				t.Fatal("Read returned no error after the daemon went away")
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Read hangs after the daemon went away")
		}
		if _, err := c2.Write(make([]byte, 1<<20)); err == nil {
			t.Fatal("Write after the daemon went away succeeded")
		}
	})
}

// A connection's Zcopy region is readable by its own peer only: another
// peer of the same process, given the SrcAvail's STag and address (STags
// are easy to guess), is refused, as each connection has a PZ of its own.
func TestZcopyRegionOnlyItsPeers(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p1, c1 := rawClient(t, sock, ln)
	defer c1.Close()
	p2, c2 := rawClient(t, sock, ln)
	defer c2.Close()
	p1.send(t, msg(sdp.MIDData, 1, nil))
	go c1.Write(pattern(256<<10, 7))
	var sa sdp.SrcAvail
	for {
		h, m := p1.recv(t)
		if h.MID == sdp.MIDSrcAvail {
			sa = sdp.ParseSrcAvail(m)
			break
		}
	}
	if err := p2.ep.PostRead(1234, client.Segment{LMR: p2.lmr, Offset: 0, Length: 64},
		client.RemoteBuffer{Context: sa.STag, Address: sa.VA}, client.Signaled); err != nil {
		t.Fatal(err)
	}
	for {
		ev, _, err := p2.evd.WaitTimeout(10*time.Second, 1)
		if err != nil {
			t.Fatalf("waiting for the Read: %v", err)
		}
		if ev.Type != client.DTOCompletion || ev.Cookie != 1234 {
			continue
		}
		if ev.Status == completion.Success {
			t.Fatalf("another connection's peer read the Zcopy region: %q", p2.buf.Bytes[:64])
		}
		return
	}
}

// kernelAcceptQueue is the length of a listening socket's accept queue in
// the kernel (TCP_INFO's unacked, for a socket in LISTEN).
func kernelAcceptQueue(t *testing.T, tl *net.TCPListener) int {
	t.Helper()
	rc, err := tl.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatal(ierr)
	}
	return int(info.Unacked)
}

// A peer that opens more connections than the listener's backlog while
// the application accepts none: the listener takes no more than the
// backlog from the kernel (which holds the rest, as for a slow
// application), and every one is accepted, its octets whole, once the
// application accepts.
func TestListenerBacklog(t *testing.T) {
	sock := startDaemon(t)
	tl, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ln := sdp.NewListener(tl, sdp.ListenConfig{Socket: sock, DetectTimeout: 50 * time.Millisecond})
	defer ln.Close()
	const extra = 6
	n := sdp.DefaultBacklog + extra
	for i := range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "client %4d", i); err != nil {
			t.Fatal(err)
		}
	}
	// The listener takes its backlog and leaves the rest to the kernel.
	deadline := time.Now().Add(20 * time.Second)
	q := kernelAcceptQueue(t, tl)
	for q != extra && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		q = kernelAcceptQueue(t, tl)
	}
	if q != extra {
		t.Fatalf("%d connections in the kernel's accept queue, want the %d past the backlog of %d", q, extra, sdp.DefaultBacklog)
	}
	seen := map[string]bool{}
	for range n {
		c, err := acceptOne(ln, 20*time.Second)
		if err != nil {
			t.Fatalf("after %d accepted: %v", len(seen), err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, len("client 0000"))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("after %d accepted: %v", len(seen), err)
		}
		seen[string(b)] = true
		c.Close()
	}
	if len(seen) != n {
		t.Fatalf("%d different clients accepted, want %d", len(seen), n)
	}
	if q := kernelAcceptQueue(t, tl); q != 0 {
		t.Fatalf("%d connections left in the kernel's accept queue", q)
	}
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A client that sends the start of an MPA Request and stalls is given up
// after HelloTimeout: its connection is closed (it reads the end), and no
// descriptor is left behind, the daemon's or the listener's.
func TestStalledRequestLeavesNoDescriptor(t *testing.T) {
	sock := startDaemon(t)
	lc := sdp.ListenConfig{Socket: sock, DetectTimeout: 100 * time.Millisecond, HelloTimeout: 300 * time.Millisecond}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	stall := func(n int) {
		t.Helper()
		var cs []net.Conn
		for range n {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// A whole Request header promising private data that
			// never comes.
			if _, err := c.Write(append([]byte("MPA ID Req Frame"), 0, 1, 0, 100)); err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
		}
		for i, c := range cs {
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, err := c.Read(make([]byte, 1))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("stalled client %d: its connection is still open long after HelloTimeout", i)
			}
			c.Close()
		}
	}
	stall(1) // the listener's session with the daemon, opened once
	base := openFDs(t)
	stall(10)
	deadline := time.Now().Add(10 * time.Second)
	n := openFDs(t)
	for n > base && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n = openFDs(t)
	}
	if n > base {
		t.Fatalf("%d descriptors open after 10 stalled clients, %d before", n, base)
	}
}

// nextControl is the raw peer's next message that is not a credit update.
func (p *rawPeer) nextControl(t *testing.T) (sdp.BSDH, []byte) {
	t.Helper()
	for {
		h, m := p.recv(t)
		if h.MID == sdp.MIDData && h.Len == sdp.BSDHLen {
			continue
		}
		return h, m
	}
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// sinkAvail is a SinkAvail's extra header for a buffer of n octets.
func sinkAvail(n uint32) []byte { return append(be32(n), make([]byte, 16)...) }

// A peer's SinkAvailCancel is answered with SinkCancelAck (with a
// SinkAvail of its outstanding, and without), its ChRcvBuf with a
// ChRcvBufAck of the size we keep, and its ModeChanges of our receiving
// half to Buffered and back to Pipelined are taken: the connection goes
// on, a SrcAvail after them is read, and data flows.
func TestPeerRequestsAnswered(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	mseq := uint32(1)
	send := func(mid sdp.MID, data []byte) {
		t.Helper()
		p.send(t, msg(mid, mseq, data))
		mseq++
	}
	expect := func(mid sdp.MID) []byte {
		t.Helper()
		h, m := p.nextControl(t)
		if h.MID != mid {
			t.Fatalf("the peer got %v, want %v", h.MID, mid)
		}
		return m
	}
	send(sdp.MIDSinkAvail, sinkAvail(1<<16))
	send(sdp.MIDSinkAvailCancel, nil)
	expect(sdp.MIDSinkCancelAck)
	send(sdp.MIDSinkAvailCancel, nil)
	expect(sdp.MIDSinkCancelAck)
	send(sdp.MIDChRcvBuf, be32(8192))
	if m := expect(sdp.MIDChRcvBufAck); sdp.ParseLen(m) != 1<<16 {
		t.Fatalf("ChRcvBufAck of %d octets, want the 65536 we keep", sdp.ParseLen(m))
	}
	send(sdp.MIDModeChange, []byte{0x00, 0, 0, 0}) // our receiving half Buffered
	send(sdp.MIDData, []byte("buffered "))
	send(sdp.MIDModeChange, []byte{0x20, 0, 0, 0}) // and Pipelined again
	src := newSource(t, p, 1000, 2)
	p.send(t, src.avail(mseq, 1000))
	mseq++
	send(sdp.MIDData, []byte(" still up"))
	want := append(append([]byte("buffered "), pattern(1000, 2)...), " still up"...)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %q, %v", got, err)
	}
	if m := expect(sdp.MIDRdmaRdCompl); sdp.ParseLen(m) != 1000 {
		t.Fatalf("RdmaRdCompl of %d", sdp.ParseLen(m))
	}
}

// The ModeChanges we cannot follow, a SrcAvail where the peer's own
// ModeChange said it would send none, and more SinkAvails outstanding
// than our MaxAdverts reset the connection, after the data that came
// before.
func TestPeerModeChangesWeCannotFollow(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	cases := map[string][][]byte{
		"receiving half Combined": {{0x10, 0, 0, 0}},
		"the mode in force":       {{0x20, 0, 0, 0}},
		"sending half Buffered":   {{0x80, 0, 0, 0}},
		"sending half Combined":   {{0x90, 0, 0, 0}},
		"an undefined mode":       {{0x30, 0, 0, 0}},
		"SrcAvail after Buffered": {{0x00, 0, 0, 0}, nil},
		"SinkAvails past the max": nil,
	}
	for name, mchs := range cases {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			p, c := rawClient(t, sock, ln)
			defer c.Close()
			p.send(t, msg(sdp.MIDData, 1, []byte("good")))
			mseq := uint32(2)
			if mchs == nil {
				for range sdp.MaxAdverts + 1 {
					p.send(t, msg(sdp.MIDSinkAvail, mseq, sinkAvail(1<<16)))
					mseq++
				}
			}
			src := newSource(t, p, 1000, 1)
			for _, mch := range mchs {
				if mch == nil {
					p.send(t, src.avail(mseq, 1000))
				} else {
					p.send(t, msg(sdp.MIDModeChange, mseq, mch))
				}
				mseq++
			}
			readThenReset(t, c, "good")
		})
	}
}

// A peer that repeats a request while it gives no credit for our answer
// to the first is reset rather than queue answer after answer.
func TestPeerRepeatsRequestsWithoutCredits(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	for _, req := range []struct {
		mid  sdp.MID
		data []byte
	}{{sdp.MIDSinkAvailCancel, nil}, {sdp.MIDChRcvBuf, be32(8192)}} {
		t.Run(req.mid.String(), func(t *testing.T) {
			p, c := rawClient(t, sock, ln)
			defer c.Close()
			for mseq := uint32(1); mseq <= 2; mseq++ {
				b := msg(req.mid, mseq, req.data)
				binary.BigEndian.PutUint16(b[2:], 0) // Bufs 0: no credit
				p.send(t, b)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read error %v, want a reset", err)
			}
		})
	}
}

// Data after the peer's DisConn, a SrcAvail or a second DisConn is a
// protocol error: the peer is reset, Reads see the data before the
// DisConn and its EOF, never what came after; credits after it are no
// error.
func TestDataAfterDisConn(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	src := func(p *rawPeer) []byte { return newSource(t, p, 1000, 1).avail(4, 1000) }
	for name, after := range map[string]func(*rawPeer) []byte{
		"Data":     func(*rawPeer) []byte { return msg(sdp.MIDData, 4, []byte("after")) },
		"SrcAvail": src,
		"DisConn":  func(*rawPeer) []byte { return msg(sdp.MIDDisConn, 4, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			p, c := rawClient(t, sock, ln)
			defer c.Close()
			p.send(t, msg(sdp.MIDData, 1, []byte("good")))
			p.send(t, msg(sdp.MIDDisConn, 2, nil))
			p.send(t, msg(sdp.MIDData, 3, nil)) // credits: no error
			p.send(t, after(p))
			if h, _ := p.nextControl(t); h.MID != sdp.MIDAbortConn {
				t.Fatalf("the peer got %v, want AbortConn", h.MID)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(c)
			if string(got) != "good" || err != nil {
				t.Fatalf("read %q, %v; want %q and EOF", got, err, "good")
			}
		})
	}
}

// recvWithin is recv that gives up after d (ok false).
func (p *rawPeer) recvWithin(t *testing.T, d time.Duration) (sdp.BSDH, []byte, bool) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		ev, _, err := p.evd.WaitTimeout(max(time.Until(end), 0), 1)
		if errors.Is(err, client.ErrTimeout) {
			return sdp.BSDH{}, nil, false
		}
		if err != nil {
			t.Fatalf("raw peer: %v", err)
		}
		if ev.Type == client.DTOCompletion && ev.Opcode == completion.OpRecv {
			if ev.Status != completion.Success {
				t.Fatalf("raw peer's receive: %v", ev.Status)
			}
			m := append([]byte(nil), p.buf.Bytes[ev.Cookie<<16:ev.Cookie<<16+uint64(ev.Length)]...)
			p.ep.PostRecv(ev.Cookie, []client.Segment{{LMR: p.lmr, Offset: ev.Cookie << 16, Length: 1 << 16}})
			h, err := sdp.ParseBSDH(m)
			if err != nil {
				t.Fatalf("raw peer received: %v", err)
			}
			return h, m, true
		}
		if ev.Type == client.ConnectionEvent {
			t.Fatalf("raw peer: %v", ev.Conn)
		}
	}
}

// The last credit goes only to a message that gives credits and carries
// no data (Annex A4 CA4-82): an RdmaRdCompl owed when one credit is left
// and every receive posted is already advertised waits for the peer's
// credits. The peer here checks every message it gets: one sent on its
// last credit must grant more than the message before it.
func TestLastCreditOnlyGivesCredits(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	// More messages than the raw peer's ring of send buffers: each
	// from a place of its own. Each with MSeqAck 0 grants 2 credits
	// (Bufs 2: 0 − 1 + 1 + 2, nothing of ours received).
	sb, err := p.ia.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	slmr, err := p.pz.RegisterLMR(sb, client.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	mseq := uint32(1)
	send := func(b []byte) {
		t.Helper()
		if binary.BigEndian.Uint32(b[12:]) == 0 {
			binary.BigEndian.PutUint16(b[2:], 2)
		}
		off := uint64(mseq) * 256
		copy(sb.Bytes[off:], b)
		if err := p.ep.PostSend(99, []client.Segment{{LMR: slmr, Offset: off, Length: uint32(len(b))}}, 0); err != nil {
			t.Fatal(err)
		}
		mseq++
	}
	// Nine Data messages the application does not read hold nine of
	// its receives; a SrcAvail then frees its own, which makes the
	// connection send a credit update (a credit of the two), and the
	// RdmaRdCompl is owed with one left, nothing more to give.
	for range 9 {
		send(msg(sdp.MIDData, mseq, []byte("x")))
	}
	src := newSource(t, p, 1000, 1)
	send(src.avail(mseq, 1000))
	// The credits a message of ours grants the peer, whose next MSeq is
	// mseq.
	grant := func(h sdp.BSDH) int { return int(int32(h.MSeqAck-mseq)) + 1 + int(h.Bufs) }
	lastGrant := -1
	check := func(h sdp.BSDH) {
		t.Helper()
		// Our credits before it: the peer granted 2 as of MSeqAck 0.
		credits := int(int32(0-h.MSeq)) + 1 + 2
		if credits == 1 && grant(h) <= lastGrant {
			t.Fatalf("%v (MSeq %d) took the last credit and gave none (grant %d, before %d)", h.MID, h.MSeq, grant(h), lastGrant)
		}
		if credits < 1 {
			t.Fatalf("%v (MSeq %d) sent without a credit", h.MID, h.MSeq)
		}
		lastGrant = grant(h)
	}
	h, _ := p.recv(t)
	check(h)
	if h.MID != sdp.MIDData || h.Len != sdp.BSDHLen {
		t.Fatalf("got %v of %d octets, want a credit update", h.MID, h.Len)
	}
	if h, _, ok := p.recvWithin(t, time.Second); ok {
		check(h) // the old code sent its RdmaRdCompl here
		t.Fatalf("got %v on the last credit", h.MID)
	}
	// Credits (16, as of the credit update): the RdmaRdCompl goes.
	b := msg(sdp.MIDData, mseq, nil)
	binary.BigEndian.PutUint32(b[12:], h.MSeq)
	send(b)
	h, m := p.nextControl(t)
	if h.MID != sdp.MIDRdmaRdCompl || sdp.ParseLen(m) != 1000 {
		t.Fatalf("after the credits: %v", h.MID)
	}
}

// CloseWrite waiting for a credit honours a write deadline set while it
// waits, as a waiting Write does.
func TestCloseWriteTakesALaterDeadline(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	b := msg(sdp.MIDData, 1, nil)
	binary.BigEndian.PutUint16(b[2:], 0) // Bufs 0: no credit at all
	p.send(t, b)
	time.Sleep(100 * time.Millisecond) // let it arrive
	c.SetWriteDeadline(time.Now().Add(time.Hour))
	errc := make(chan error, 1)
	go func() { errc <- c.(*sdp.Conn).CloseWrite() }()
	time.Sleep(200 * time.Millisecond)
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("CloseWrite: %v, want the deadline's error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("CloseWrite still waits for the hour-long deadline it started with")
	}
}

// A peer's AbortConn resets the connection: Read gives what came before
// it, then ECONNRESET, and so does Write.
func TestPeerAbortConn(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	p, c := rawClient(t, sock, ln)
	defer c.Close()
	p.send(t, msg(sdp.MIDData, 1, []byte("good")))
	p.send(t, msg(sdp.MIDAbortConn, 2, nil))
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if string(got) != "good" || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read %q, %v; want %q and a reset", got, err, "good")
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Write after the AbortConn: %v, want a reset", err)
	}
}

// A listener that answers with a HelloAck of another major version is not
// taken: Dial fails (NoFallback) rather than speak to it; one of ours is.
func TestDialRefusesHelloAckOfAnotherVersion(t *testing.T) {
	sock := startDaemon(t)
	for _, version := range []uint8{0x11, sdp.Version} {
		p := newRawPeer(t, sock)
		crs, err := p.ia.CreateEVD(client.EVDOptions{Depth: 4, Kind: client.CREvents})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		psp, err := p.ia.CreatePSP(port, crs, false)
		if err != nil {
			t.Fatal(err)
		}
		defer psp.Free()
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			d := &sdp.Dialer{Socket: sock, NoFallback: true, HelloTimeout: 20 * time.Second}
			c, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(port)))
			ch <- res{c, err}
		}()
		ev, _, err := crs.WaitTimeout(20*time.Second, 1)
		if err != nil || ev.Type != client.ConnectionRequest {
			t.Fatalf("version %#x: waiting for the request: %+v %v", version, ev, err)
		}
		ack := sdp.HelloAck{BSDH: sdp.BSDH{Bufs: 16}, Version: version, MaxAdverts: 1, ActRcvSz: 1 << 16}
		if err := ev.CR.Accept(p.ep, ack.Marshal()); err != nil {
			t.Fatal(err)
		}
		r := <-ch
		if version != sdp.Version {
			if r.c != nil {
				r.c.Close()
			}
			if !errors.Is(r.err, sdp.ErrNoOffload) || !strings.Contains(r.err.Error(), "version") {
				t.Fatalf("a HelloAck of version %#x: %v, want ErrNoOffload", version, r.err)
			}
			continue
		}
		if r.err != nil {
			t.Fatalf("a HelloAck of our version: %v", r.err)
		}
		if _, ok := r.c.(*sdp.Conn); !ok {
			t.Fatalf("a HelloAck of our version: a %T", r.c)
		}
		r.c.Close()
	}
}

// readThenReset reads c to its end, which must be want and then a reset.
func readThenReset(t *testing.T, c net.Conn, want string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if string(got) != want {
		t.Errorf("read %q before the error, want %q", got, want)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read error %v, want a reset", err)
	}
}

// acceptAll accepts ln's connections until it is closed, into the channel
// it returns.
func acceptAll(ln net.Listener) chan net.Conn {
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	return accepted
}
