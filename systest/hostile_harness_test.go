package systest

// The harness of TestHostilePeers (hostile_test.go): a softrnicd under test
// whose log is kept and whose stacks can be had (SIGQUIT), a verified stream
// that runs through it beside each case and notices when it stops, the
// hostile peer's kernel TCP socket with the tricks the cases need (a small
// receive buffer, a filter that drops everything it would receive), and the
// consumer's endpoints in this process over package client.
//
// Goroutines: each case runs its body on one goroutine while the test's
// goroutine watches it (deadline, stream stall); the stream has one; the
// hostile peer's script has one; each daemon has one waiting for its exit.
// None of them calls t: they report to the case's caseLog, which the test
// goroutine copies into t, so that a body abandoned after a hang cannot
// touch a finished test.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/mpa"
)

// caseLog collects what a case found, from any goroutine.
type caseLog struct {
	mu    sync.Mutex
	errs  []string
	notes []string
	// hang is the first sign of a stall: the stream stopped, the case
	// overran its deadline, or the daemon ignored SIGTERM.
	hang string
}

func (l *caseLog) Errorf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Sprintf(format, args...))
}

func (l *caseLog) Logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notes = append(l.notes, fmt.Sprintf(format, args...))
}

// hung records a stall and reports whether it is the first.
func (l *caseLog) hung(format string, args ...any) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	l.errs = append(l.errs, "HANG: "+msg)
	if l.hang != "" {
		return false
	}
	l.hang = msg
	return true
}

func (l *caseLog) snapshot() (errs, notes []string, hang string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...), append([]string(nil), l.notes...), l.hang
}

// syncBuffer is a bytes.Buffer for a process's output read while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// daemonProc is a softrnicd started for a test, with its output kept.
type daemonProc struct {
	name string
	sock string
	cmd  *exec.Cmd
	out  *syncBuffer
	// done is closed when the process has ended; err is then its exit.
	done chan struct{}
	err  error
	quit sync.Once
}

// startDaemonProc runs softrnicd on host h with its socket at sock and
// waits until it answers there. GOTRACEBACK=all makes a SIGQUIT print every
// goroutine.
func startDaemonProc(h topology.Host, dir, name, sock string, args ...string) (*daemonProc, error) {
	cmd := h.Command(filepath.Join(dir, "softrnicd"), append([]string{"--iface", h.Link, "--socket", sock, "--log-level", "info"}, args...)...)
	cmd.Env = append(os.Environ(), "GOTRACEBACK=all")
	d := &daemonProc{name: name, sock: sock, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.out, d.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("unixpacket", sock); err == nil {
			c.Close()
			return d, nil
		}
		select {
		case <-d.done:
			return nil, fmt.Errorf("%s ended before answering on %s: %v\n%s", name, sock, d.err, d.out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.kill()
			return nil, fmt.Errorf("%s never answered on %s\n%s", name, sock, d.out.String())
		}
	}
}

func (d *daemonProc) running() bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

// terminate sends SIGTERM and waits up to limit for the process to end; it
// returns how long it took and whether it ended.
func (d *daemonProc) terminate(limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && d.running() {
		return 0, false
	}
	select {
	case <-d.done:
		return time.Since(start), true
	case <-time.After(limit):
		return time.Since(start), false
	}
}

// dumpStacks sends SIGQUIT once, which makes the Go runtime print every
// goroutine's stack to the log and exit, and waits for it to end (killing
// it if it does not). It reports whether this call sent the signal.
func (d *daemonProc) dumpStacks() bool {
	sent := false
	d.quit.Do(func() {
		if !d.running() {
			return
		}
		sent = true
		_ = d.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-d.done:
		case <-time.After(5 * time.Second):
			d.kill()
		}
	})
	return sent
}

// kill ends the process with SIGKILL and waits for it.
func (d *daemonProc) kill() {
	_ = d.cmd.Process.Kill()
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
	}
}

// app is one application session with a daemon: an IA with a PZ and one
// registered buffer.
type app struct {
	ia  *client.IA
	pz  *client.PZ
	buf *client.Buffer
	lmr *client.LMR
}

func openApp(sock, name string, size int) (*app, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ia, err := client.Open(ctx, client.Options{Socket: sock, Name: name})
	if err != nil {
		return nil, err
	}
	a := &app{ia: ia}
	fail := func(err error) (*app, error) {
		ia.Close()
		return nil, err
	}
	if a.pz, err = ia.CreatePZ(); err != nil {
		return fail(err)
	}
	if a.buf, err = ia.Alloc(size); err != nil {
		return fail(err)
	}
	if a.lmr, err = a.pz.RegisterLMR(a.buf, client.LocalWrite|client.RemoteWrite|client.RemoteRead); err != nil {
		return fail(err)
	}
	return a, nil
}

// endpoint is an EP with event dispatchers of its own.
type endpoint struct {
	a               *app
	ep              *client.EP
	recv, req, conn *client.EVD
}

// endpoint makes an EP (IRD and ORD 8, queues of 64) after mod changes
// its attributes.
func (a *app) endpoint(mod func(*client.EPAttr)) (*endpoint, error) {
	e := &endpoint{a: a}
	var err error
	for _, x := range []struct {
		p    **client.EVD
		kind client.EVDKind
	}{{&e.recv, client.DTOEvents}, {&e.req, client.DTOEvents}, {&e.conn, client.ConnectionEvents}} {
		if *x.p, err = a.ia.CreateEVD(client.EVDOptions{Depth: 256, Kind: x.kind}); err != nil {
			return nil, err
		}
	}
	attr := client.EPAttr{PZ: a.pz, RecvEVD: e.recv, RequestEVD: e.req, ConnectEVD: e.conn, SQDepth: 64, RQDepth: 64, IRD: 8, ORD: 8}
	if mod != nil {
		mod(&attr)
	}
	if e.ep, err = a.ia.CreateEP(attr); err != nil {
		return nil, err
	}
	return e, nil
}

// waitEvent waits up to d for the next event of evd.
func waitEvent(evd *client.EVD, d time.Duration) (client.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return evd.Wait(ctx)
}

// waitConn waits up to d for a connection event of e.
func (e *endpoint) waitConn(d time.Duration) (client.ConnEvent, error) {
	ev, err := waitEvent(e.conn, d)
	if err != nil {
		return 0, err
	}
	if ev.Type != client.ConnectionEvent {
		return 0, fmt.Errorf("connect EVD gave event type %d, not a connection event", ev.Type)
	}
	return ev.Conn, nil
}

// pattern fills b with octets that depend on seq (splitmix64).
func pattern(b []byte, seq uint64) {
	x := seq*0x9e3779b97f4a7c15 + 1
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(w[:], z^z>>31)
		copy(b[i:], w[:])
	}
}

// stream is the verified traffic that runs through the daemon under test
// beside each case, on another QP of the same poller: A RDMA-Writes a block
// of a known pattern into B's memory and then Sends its sequence number; B
// checks the block when the Send arrives. One block is in flight at a time,
// so the stream never waits for anything but the daemons.
type stream struct {
	count atomic.Int64
	mu    sync.Mutex
	// last is when the last block was verified, winStart when the
	// current window of observation opened, maxGap the longest wait for
	// a block in it.
	last, winStart time.Time
	maxGap         time.Duration
	err            error
	stop           chan struct{}
	done           chan struct{}
}

const (
	streamBlock = 4096
	streamSlots = 8
	// Offsets in the stream's and the good connection's 64 KiB buffers.
	streamMsgOff = 60 << 10
	goodOff      = 48 << 10
	goodLen      = 64
)

func (s *stream) verified() {
	now := time.Now()
	s.mu.Lock()
	from := s.last
	if s.winStart.After(from) {
		from = s.winStart
	}
	s.maxGap = max(s.maxGap, now.Sub(from))
	s.last = now
	s.mu.Unlock()
	s.count.Add(1)
}

// openWindow starts a window of observation.
func (s *stream) openWindow() {
	s.mu.Lock()
	s.winStart, s.maxGap = time.Now(), 0
	s.mu.Unlock()
}

// stalled is how long the stream has gone without a verified block.
func (s *stream) stalled() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(s.last)
}

// window is the longest gap between verified blocks since openWindow,
// counting the one still open.
func (s *stream) window() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	from := s.last
	if s.winStart.After(from) {
		from = s.winStart
	}
	return max(s.maxGap, time.Since(from))
}

func (s *stream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// halt stops the stream and waits for its goroutine.
func (s *stream) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

var errStreamStopped = errors.New("stream stopped")

// runStream connects sa (on the daemon under test) to a PSP of sb's daemon
// at bAddr:port and starts the stream; cr is the PSP's request EVD.
func runStream(sa, sb *app, bAddr netip.Addr, port uint16, cr *client.EVD) (*stream, error) {
	ae, err := sa.endpoint(nil)
	if err != nil {
		return nil, fmt.Errorf("stream EP on A: %w", err)
	}
	be, err := sb.endpoint(nil)
	if err != nil {
		return nil, fmt.Errorf("stream EP on B: %w", err)
	}
	if err := ae.ep.Connect(netip.AddrPortFrom(bAddr, port).String(), nil, 5*time.Second); err != nil {
		return nil, fmt.Errorf("stream connect: %w", err)
	}
	ev, err := waitEvent(cr, 5*time.Second)
	if err != nil || ev.CR == nil {
		return nil, fmt.Errorf("stream: no connection request at B (%v, %+v)", err, ev)
	}
	if err := ev.CR.Accept(be.ep, nil); err != nil {
		return nil, fmt.Errorf("stream accept: %w", err)
	}
	for _, e := range []*endpoint{ae, be} {
		if c, err := e.waitConn(5 * time.Second); err != nil || c != client.Established {
			return nil, fmt.Errorf("stream connection: %v %v", c, err)
		}
	}
	s := &stream{stop: make(chan struct{}), done: make(chan struct{}), last: time.Now()}
	go s.loop(ae, be)
	return s, nil
}

func (s *stream) loop(ae, be *endpoint) {
	defer close(s.done)
	src, dst := ae.a.buf.Bytes, be.a.buf.Bytes
	want := make([]byte, streamBlock)
	wait := func(evd *client.EVD) (client.Event, error) {
		for {
			select {
			case <-s.stop:
				return client.Event{}, errStreamStopped
			default:
			}
			ev, err := waitEvent(evd, 200*time.Millisecond)
			if errors.Is(err, client.ErrTimeout) {
				continue
			}
			return ev, err
		}
	}
	fail := func(format string, args ...any) {
		s.mu.Lock()
		s.err = fmt.Errorf(format, args...)
		s.mu.Unlock()
	}
	// Bounded: a case never lasts this long; the test stops the stream.
	for seq := uint64(1); seq < 1<<40; seq++ {
		select {
		case <-s.stop:
			return
		default:
		}
		slot := (seq % streamSlots) * streamBlock
		pattern(src[:streamBlock], seq)
		binary.LittleEndian.PutUint64(src[streamMsgOff:], seq)
		if err := be.ep.PostRecv(seq, []client.Segment{{LMR: be.a.lmr, Offset: streamMsgOff, Length: 8}}); err != nil {
			fail("block %d: B post receive: %v", seq, err)
			return
		}
		if err := ae.ep.PostWrite(seq, []client.Segment{{LMR: ae.a.lmr, Length: streamBlock}},
			client.RemoteBuffer{Context: be.a.lmr.Context, Address: be.a.lmr.Address(slot)}, client.Signaled); err != nil {
			fail("block %d: A post Write: %v", seq, err)
			return
		}
		if err := ae.ep.PostSend(seq, []client.Segment{{LMR: ae.a.lmr, Offset: streamMsgOff, Length: 8}}, client.Signaled); err != nil {
			fail("block %d: A post Send: %v", seq, err)
			return
		}
		ev, err := wait(be.recv)
		if err != nil {
			if err != errStreamStopped {
				fail("block %d: B receive: %v", seq, err)
			}
			return
		}
		if ev.Status != completion.Success || ev.Cookie != seq || ev.Length != 8 {
			fail("block %d: B receive completed %+v", seq, ev)
			return
		}
		pattern(want, seq)
		if got := binary.LittleEndian.Uint64(dst[streamMsgOff:]); got != seq {
			fail("block %d: the Send carried %d", seq, got)
			return
		}
		if !bytes.Equal(dst[slot:slot+streamBlock], want) {
			fail("block %d: the Written block differs from what A wrote", seq)
			return
		}
		for range 2 {
			ev, err := wait(ae.req)
			if err != nil {
				if err != errStreamStopped {
					fail("block %d: A completion: %v", seq, err)
				}
				return
			}
			if ev.Status != completion.Success {
				fail("block %d: A's Write or Send completed %v", seq, ev.Status)
				return
			}
		}
		s.verified()
	}
}

// peerConn is the hostile peer's end: a kernel TCP socket in the other
// namespace, scripted by a case.
type peerConn struct {
	c   *net.TCPConn
	log *caseLog
	// ready is closed by signal, when the script has reached the point
	// the consumer waits for (or has ended).
	ready     chan struct{}
	readyOnce sync.Once
	// finish is closed when the consumer side of the case is done: a
	// script that holds its connection open waits for it.
	finish chan struct{}
}

func newPeerConn(c *net.TCPConn, log *caseLog, finish chan struct{}) *peerConn {
	return &peerConn{c: c, log: log, ready: make(chan struct{}), finish: finish}
}

func (p *peerConn) signal() { p.readyOnce.Do(func() { close(p.ready) }) }

// hold keeps the connection as it is until the consumer is done (at most
// 20 s).
func (p *peerConn) hold() error {
	select {
	case <-p.finish:
	case <-time.After(20 * time.Second):
	}
	return nil
}

func (p *peerConn) write(b []byte) error {
	_ = p.c.SetWriteDeadline(time.Now().Add(3 * time.Second))
	_, err := p.c.Write(b)
	return err
}

func (p *peerConn) readFull(n int, d time.Duration) ([]byte, error) {
	_ = p.c.SetReadDeadline(time.Now().Add(d))
	b := make([]byte, n)
	_, err := io.ReadFull(p.c, b)
	return b, err
}

// readStartup reads one MPA Request (reply false) or Reply frame whole and
// returns it with its octets.
func (p *peerConn) readStartup(reply bool, d time.Duration) (mpa.Frame, []byte, error) {
	hdr, err := p.readFull(mpa.FrameHeaderLen, d)
	if err != nil {
		return mpa.Frame{}, hdr, fmt.Errorf("read MPA frame header: %w", err)
	}
	n, err := mpa.FrameLen(hdr)
	if err != nil {
		return mpa.Frame{}, hdr, err
	}
	rest, err := p.readFull(n-mpa.FrameHeaderLen, d)
	if err != nil {
		return mpa.Frame{}, hdr, fmt.Errorf("read MPA private data: %w", err)
	}
	wire := append(hdr, rest...)
	f, _, err := mpa.ParseFrame(wire, reply)
	return f, wire, err
}

// reset closes the connection with a RST.
func (p *peerConn) reset() error {
	_ = p.c.SetLinger(0)
	return p.c.Close()
}

// expectClosed reads and discards until the daemon closes the connection
// (FIN or RST), for at most d.
func (p *peerConn) expectClosed(d time.Duration) error {
	start := time.Now()
	_ = p.c.SetReadDeadline(start.Add(d))
	n, err := io.Copy(io.Discard, p.c)
	switch {
	case err == nil, errors.Is(err, syscall.ECONNRESET):
		p.log.Logf("peer: the daemon closed the connection %v after the misbehaviour (%d more octets; %v)", time.Since(start).Round(time.Millisecond), n, errOrEOF(err))
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("the daemon still holds the connection open %v later (%d octets read meanwhile)", d, n)
	}
	return fmt.Errorf("reading until closed: %w", err)
}

func errOrEOF(err error) string {
	if err == nil {
		return "FIN"
	}
	return "RST"
}

// readULPDU reads the FPDU stream with the given framing until one ULPDU is
// whole, for at most d.
func (p *peerConn) readULPDU(crc, markers bool, d time.Duration) ([]byte, error) {
	asm := mpa.NewAssembler(crc, markers)
	_ = p.c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	var got [][]byte
	for total := 0; total < 1<<20; {
		n, err := p.c.Read(buf)
		total += n
		if n > 0 {
			var perr error
			if got, perr = asm.Feed(buf[:n], got); perr != nil {
				return nil, fmt.Errorf("FPDU stream (CRC %v, markers %v): %w", crc, markers, perr)
			}
			if len(got) > 0 {
				return got[0], nil
			}
		}
		if err != nil {
			return nil, fmt.Errorf("waiting for an FPDU: %w", err)
		}
	}
	return nil, errors.New("no whole FPDU in 1 MiB")
}

// dropInput makes the peer's kernel discard every segment that reaches the
// socket from now on but a RST (a socket filter: for TCP it sees the
// segment from its TCP header on): its TCP never sees, so never
// acknowledges, what we send, and still learns of our abort.
func (p *peerConn) dropInput() error {
	rc, err := p.c.SyscallConn()
	if err != nil {
		return err
	}
	const tcpFlags, rst = 13, 0x04
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: tcpFlags},
		{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, K: rst, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog)
	}); err != nil {
		return err
	}
	return serr
}

// Linux TCP states (include/net/tcp_states.h).
const (
	tcpEstablished = 1
	tcpClose       = 7
	tcpCloseWait   = 8
)

// tcpState is the peer socket's TCP state, read without reading the
// socket.
func (p *peerConn) tcpState() (uint8, error) {
	rc, err := p.c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var info *unix.TCPInfo
	var serr error
	if err := rc.Control(func(fd uintptr) {
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return info.State, nil
}

// expectReset waits up to d for the daemon to reset (or close) the
// connection, without reading from it: a peer that reads would open its
// window and let a stuck daemon carry on.
func (p *peerConn) expectReset(d time.Duration) error {
	start := time.Now()
	for {
		st, err := p.tcpState()
		if err != nil {
			return err
		}
		if st == tcpClose || st == tcpCloseWait {
			how := "RST"
			if st == tcpCloseWait {
				how = "FIN"
			}
			p.log.Logf("peer: the connection was ended (%s) %v after the consumer's abort", how, time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(start) > d {
			return fmt.Errorf("the connection is still in TCP state %d %v after the consumer's abort: the daemon never reset it", st, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rcvbufControl sets SO_RCVBUF (when n > 0) before listen or connect, so
// that the window the peer offers is small from the SYN on.
func rcvbufControl(n int) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		if n <= 0 {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, n)
		}); err != nil {
			return err
		}
		return serr
	}
}

// peerListen opens the hostile server's kernel listener on h.
func peerListen(h topology.Host, port uint16, rcvbuf int) (*net.TCPListener, error) {
	return h.ListenTCPWith(netip.AddrPortFrom(h.Addr.Addr(), port), rcvbufControl(rcvbuf))
}

// peerDial connects the hostile client from h to addr.
func peerDial(h topology.Host, addr netip.AddrPort, rcvbuf int) (*net.TCPConn, error) {
	return h.DialTCPWith(addr, 3*time.Second, rcvbufControl(rcvbuf))
}

// checkSend checks that ulpdu is an untagged RDMAP Send carrying want.
func checkSend(ulpdu, want []byte) error {
	h := ddp.Header(ulpdu)
	if !h.IsValid() || h.Tagged() {
		return fmt.Errorf("ULPDU of %d octets is not a whole untagged DDP segment", len(ulpdu))
	}
	if op := h.Opcode(); op != ddp.OpSend {
		return fmt.Errorf("opcode %v, want Send", op)
	}
	if got := h.Payload(); !bytes.Equal(got, want) {
		return fmt.Errorf("Send payload %q, want %q", got, want)
	}
	return nil
}

// terminateFPDU is an FPDU with a lone Terminate (layer LLP) reporting
// cause, framed with crc and markers as the peer's direction negotiated.
func terminateFPDU(cause ddp.TerminateError, crc, markers bool) []byte {
	f := ddp.TerminateFields{Error: cause}
	body := make([]byte, ddp.UntaggedHeaderLen+f.Len())
	ddp.Untagged(body).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpTerminate, QN: ddp.QNTerminate, MSN: 1})
	ddp.Terminate(body[ddp.UntaggedHeaderLen:]).Encode(&f)
	return mpa.NewFramer(crc, markers).Append(nil, body, nil)
}

// checkTerminate checks that ulpdu is a Terminate with cause.
func checkTerminate(ulpdu []byte, cause ddp.TerminateError) error {
	h := ddp.Header(ulpdu)
	if !h.IsValid() || h.Tagged() || h.Opcode() != ddp.OpTerminate {
		return fmt.Errorf("ULPDU of %d octets is not a Terminate", len(ulpdu))
	}
	t := ddp.Terminate(ulpdu[ddp.UntaggedHeaderLen:])
	if !t.IsValid() {
		return errors.New("malformed Terminate body")
	}
	if got := t.Cause(); got != cause {
		return fmt.Errorf("Terminate cause %v, want %v", got, cause)
	}
	return nil
}

// tail is the end of a long log, at most n octets, cut at a line start.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "…\n" + s
}
