package xdpnet_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/internal/pcap"
	"github.com/softrnic/softrnic/internal/repair"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
	"github.com/softrnic/softrnic/xdpnet"
)

// The takeover tests: B's kernel has a TCP connection with A's (the peer
// is Linux throughout); B's Poller takes it over (TakeOver) in the middle
// of a transfer both ways, and the engine carries B's side on.

const (
	seedA = 0xa1
	seedB = 0xb2
)

// startImpaired is start with the engine's side degraded both ways: only
// the flows steered to the poller cross the impairment, so the kernel
// connection before the handover does not. (No reordering: the capture's
// order of B's segments is then their sending order, which the TSval
// check relies on.)
func startImpaired(tb testing.TB, cfg impair.Config) *env {
	rx, tx := cfg, cfg
	rx.Seed, tx.Seed = 11, 12
	return startWith(tb, xdpnet.Config{Mode: bpf.ModeGeneric, ImpairRX: rx, ImpairTX: tx})
}

// round is one connection taken over.
type round struct {
	n              int
	aConn, bConn   *net.TCPConn
	totalA, totalB uint64   // each side's stream
	wroteB, readB  uint64   // what B's application did before the handover
	aSum           [32]byte // of what A received
	stats          xdpnet.TakeoverStats
	local, remote  netip.AddrPort // B's side
	bActive        bool
	pcap           string // the capture on A's side, kept if the round fails
}

// keepCapture copies a failed round's capture to $SOFTRNIC_KEEP_PCAP, if
// set, for a look at what went between A and the engine.
func keepCapture(t *testing.T, path string) {
	dst := os.Getenv("SOFTRNIC_KEEP_PCAP")
	if dst == "" || path == "" {
		return
	}
	data, err := os.ReadFile(path)
	if err == nil {
		err = os.WriteFile(dst, data, 0o644)
	}
	if err != nil {
		t.Logf("keeping the capture: %v", err)
		return
	}
	t.Logf("capture kept in %s", dst)
}

// smallRcvBuf gives A's socket a small receive buffer, so that what B
// writes backs up in B's send queue.
func smallRcvBuf(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10) }); err != nil {
		return err
	}
	return serr
}

// connect makes the round's kernel connection: B dials A (B's port is
// ephemeral) or A dials B's kernel listener.
func (r *round) connect(t *testing.T, tp *topology.Pair, port uint16) {
	t.Helper()
	var err error
	if r.bActive {
		ln, lerr := tp.A.ListenTCPWith(netip.AddrPortFrom(tp.A.Addr.Addr(), port), smallRcvBuf)
		if lerr != nil {
			t.Fatal(lerr)
		}
		defer ln.Close()
		if r.bConn, err = tp.B.DialTCP(netip.AddrPortFrom(tp.A.Addr.Addr(), port), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
		if r.aConn, err = ln.AcceptTCP(); err != nil {
			t.Fatal(err)
		}
	} else {
		ln, lerr := tp.B.ListenTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), port))
		if lerr != nil {
			t.Fatal(lerr)
		}
		defer ln.Close()
		if r.aConn, err = tp.A.DialTCPWith(netip.AddrPortFrom(tp.B.Addr.Addr(), port), 5*time.Second, smallRcvBuf); err != nil {
			t.Fatal(err)
		}
		_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
		if r.bConn, err = ln.AcceptTCP(); err != nil {
			t.Fatal(err)
		}
	}
	r.local = r.bConn.LocalAddr().(*net.TCPAddr).AddrPort()
	r.remote = r.bConn.RemoteAddr().(*net.TCPAddr).AddrPort()
}

// runRound streams both ways, hands B's side to the engine with octets
// queued in every place, and checks both streams whole.
func runRound(t *testing.T, e *env, r *round, rng *rand.Rand) {
	tp := e.tp
	t.Helper()
	// A writes its whole stream at once; it blocks while B does not
	// read, so that A's octets are in flight and in B's receive queue
	// at the handover.
	// Its FIN waits for the handover: a connection the peer half-closed
	// is not ESTABLISHED, and is refused.
	aWrote := make(chan error, 1)
	handed := make(chan struct{})
	go func() {
		buf := make([]byte, r.totalA)
		sim.FillPattern(seedA, 0, buf)
		_, err := r.aConn.Write(buf)
		<-handed
		if err == nil {
			err = r.aConn.CloseWrite()
		}
		aWrote <- err
	}()
	// B's application writes part of its stream, more than A reads
	// before the handover (A reads nothing yet): sent-unacknowledged
	// and unsent octets in B's send queue.
	bBuf := make([]byte, r.totalB)
	sim.FillPattern(seedB, 0, bBuf)
	_ = r.bConn.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, _ := r.bConn.Write(bBuf[:rng.IntN(int(r.totalB))+1])
	r.wroteB = uint64(n)
	// B's application reads part of A's stream and leaves the rest.
	want := uint64(rng.IntN(int(min(r.totalA, 128<<10))))
	got := make([]byte, want)
	_ = r.bConn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(r.bConn, got); err != nil {
		t.Fatalf("round %d: B reads %d before the handover: %v", r.n, want, err)
	}
	for i, x := range got {
		if x != sim.Pattern(seedA, uint64(i)) {
			t.Fatalf("round %d: B's kernel stream differs at %d", r.n, i)
		}
	}
	r.readB = want
	_ = r.bConn.SetDeadline(time.Time{})
	time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)

	ep := newEndpoint(r.totalB)
	ep.Seed, ep.PeerSeed = seedB, seedA
	ep.Sent, ep.Recvd = r.wroteB, r.readB
	// A reads B's stream from the handover on.
	aRead := make(chan error, 1)
	go func() {
		h := sha256.New()
		var off uint64
		buf := make([]byte, 64<<10)
		_ = r.aConn.SetReadDeadline(time.Now().Add(2 * time.Minute))
		for {
			// Slowly until the handover, so that B's octets are
			// in flight and queued unsent when it comes.
			n := len(buf)
			select {
			case <-handed:
			default:
				n = 4 << 10
				time.Sleep(time.Millisecond)
			}
			k, err := r.aConn.Read(buf[:n])
			for i := range buf[:k] {
				if buf[i] != sim.Pattern(seedB, off+uint64(i)) {
					aRead <- fmt.Errorf("A's stream from B differs at %d", off+uint64(i))
					return
				}
			}
			h.Write(buf[:k])
			off += uint64(k)
			if err != nil {
				if errors.Is(err, io.EOF) && off == r.totalB {
					err = nil
				} else {
					err = fmt.Errorf("A read %d of %d: %w", off, r.totalB, err)
				}
				copy(r.aSum[:], h.Sum(nil))
				aRead <- err
				return
			}
		}
	}()
	// Another descriptor of B's socket, as an application that passed a
	// dup keeps: dead after the handover, and closing it sends nothing
	// (the capture check covers that).
	var dup *os.File
	if r.n%10 == 0 {
		f, err := r.bConn.File()
		if err != nil {
			t.Fatal(err)
		}
		dup = f
	}
	c, stats, err := e.p.TakeOver(r.bConn, ep)
	close(handed)
	if err != nil {
		t.Fatalf("round %d: take over: %v", r.n, err)
	}
	r.stats = stats
	// B's application may have written its whole stream before the
	// handover: then no Writable event ever comes for the endpoint to
	// send its FIN on (CI saw the connection wait in CLOSE-WAIT with
	// every octet sent). Pump on the poller, as Writable would.
	_ = e.p.Do(func(*tcp.Stack, tcp.Time) {
		if ep.Conn == nil {
			ep.Conn = c
		}
		ep.Pump()
	})
	if dup != nil {
		if _, err := unix.Write(int(dup.Fd()), []byte("late")); err == nil {
			t.Errorf("round %d: the application's other descriptor still writes after the handover", r.n)
		}
		if k, err := unix.Read(int(dup.Fd()), make([]byte, 16)); err == nil && k > 0 {
			t.Errorf("round %d: the application's other descriptor still reads after the handover", r.n)
		}
		dup.Close()
	}
	select {
	case <-ep.done:
	case <-time.After(2 * time.Minute):
		var state tcp.State
		var cs tcp.ConnStats
		var diag string
		_ = e.p.Do(func(_ *tcp.Stack, now tcp.Time) { state, cs, diag = c.State(), c.Stats, c.Diag(now) })
		t.Logf("round %d: the engine's connection: %s", r.n, diag)
		keepCapture(t, r.pcap)
		// What the poller and the steering program saw, and B's
		// kernel: where the peer's segments went (CI saw the engine
		// get none of them after a handover, twice, under load).
		steer, serr := e.p.Steering().Stats()
		counters, _ := tp.B.Counters()
		t.Fatalf("round %d: the engine's connection did not end (sent %d recvd %d of %d/%d; %v, %+v; handover %+v)\npoller %+v\nsteering %+v %v\nB's kernel: TcpOutRsts %d TcpInSegs %d TcpExtTCPAbortOnData %d",
			r.n, ep.Sent, ep.Recvd, r.totalB, r.totalA, state, cs, stats, e.p.Stats(), steer, serr,
			counters["Tcp:OutRsts"], counters["Tcp:InSegs"], counters["TcpExt:TCPAbortOnData"])
	}
	if err := <-aRead; err != nil {
		t.Fatalf("round %d: %v", r.n, err)
	}
	if !r.bActive {
		// B's port was its application's listener's (closed by now):
		// the reservation that keeps it from the kernel's new
		// connections must let the application listen there again.
		if err := tp.B.Do(func() error {
			ln, err := net.Listen("tcp4", r.local.String())
			if err == nil {
				ln.Close()
			}
			return err
		}); err != nil {
			t.Errorf("round %d: B's application cannot listen on its port again after the handover: %v", r.n, err)
		}
	}
	if err := <-aWrote; err != nil {
		t.Fatalf("round %d: A's write: %v", r.n, err)
	}
	if ep.Corrupt != nil || ep.Recvd != r.totalA || ep.Sent != r.totalB || ep.Err != nil || !ep.PeerClosed {
		t.Fatalf("round %d: engine received %d of %d (%v), sent %d of %d, ended with %v", r.n, ep.Recvd, r.totalA,
			ep.Corrupt, ep.Sent, r.totalB, ep.Err)
	}
	// Both directions by SHA-256 as well: A's whole view of B's stream
	// against the stream B's application and then the engine wrote.
	if r.aSum != sha256.Sum256(bBuf) {
		t.Fatalf("round %d: SHA-256 of B's stream at A differs", r.n)
	}
	r.aConn.Close()
}

// TestTakeOver: fifty kernel connections, B active or passive in turn,
// taken over by the engine in the middle of transfers both ways with
// octets queued in every place (A's in flight and unread in B's receive
// queue, B's sent and unacknowledged and unsent), on a lossy engine side;
// each direction checked octet by octet and by SHA-256. A capture on A's
// side shows no RST from B and every FIN of a connection at its stream's
// end (none from the kernel at the handover), B's TcpOutRsts does not
// move, and B's TSval never goes back. The peer's segments held during
// the handover reach the engine.
func TestTakeOver(t *testing.T) {
	testenv.RequireTool(t, "tcpdump")
	e := startImpaired(t, impair.Config{Loss: 0.01})
	tp := e.tp
	pcapPath := filepath.Join(t.TempDir(), "takeover.pcap")
	cap0, err := capture.Start(tp.A, tp.A.Link, "tcp and portrange 20000-20999", pcapPath)
	if err != nil {
		t.Fatal(err)
	}
	before, err := tp.B.Counters()
	if err != nil {
		t.Fatal(err)
	}
	rounds := 50
	if testing.Short() {
		rounds = 10
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var rs []*round
	var held, send, inFlight, unread int
	var slowest time.Duration
	var durations []time.Duration
	for i := range rounds {
		r := &round{n: i, bActive: i%2 == 0, pcap: pcapPath, totalA: uint64(64<<10 + rng.IntN(1<<20)), totalB: uint64(64<<10 + rng.IntN(1<<20))}
		r.connect(t, tp, uint16(20000+i))
		runRound(t, e, r, rng)
		rs = append(rs, r)
		held += r.stats.Held
		send += r.stats.Send
		inFlight += r.stats.InFlight
		unread += r.stats.Unread
		slowest = max(slowest, r.stats.Duration)
		durations = append(durations, r.stats.Duration)
	}
	after, err := tp.B.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if err := cap0.Stop(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(durations)
	t.Logf("%d handovers: %d octets of send queue carried (%d of them in flight), %d unread, %d segments held; handover median %v, slowest %v",
		rounds, send, inFlight, unread, held, durations[len(durations)/2], slowest)
	if send == 0 || inFlight == 0 || unread == 0 {
		t.Errorf("the handovers did not carry octets in every place: send %d, in flight %d, unread %d", send, inFlight, unread)
	}
	if held == 0 {
		t.Errorf("no segment of the peer's arrived during a handover: the test does not show they reach the engine")
	}
	if d := after["Tcp:OutRsts"] - before["Tcp:OutRsts"]; d != 0 {
		t.Errorf("B's kernel sent %d RSTs", d)
	}
	for _, p := range checkWire(t, pcapPath, rs, tp.B.Addr.Addr()) {
		t.Error(p)
	}
}

// checkWire reads the capture and returns what is wrong in it: per
// connection (by both ports), any RST from B, FINs from B at more than one sequence number
// (the engine's, at the stream's end, is the only one there should be),
// and B's TSval going back.
func checkWire(t *testing.T, path string, rs []*round, b netip.Addr) (problems []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rd, err := pcap.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	type conn struct {
		finEnd                     uint32
		finSeen                    bool
		fins                       map[uint32]bool
		rsts                       int
		firstEngineTS              uint32
		lastKernelTS, lastEngineTS uint32
		engineSeen                 bool
		tsBack, overtaken          int
		kernelCrossed              int
		back                       string
		segs                       int
	}
	// By both ports: where B dials out, its kernel may give two rounds
	// the same ephemeral port (their 4-tuples differ by A's), and by
	// B's port alone their segments were counted as one connection's
	// (CI: "FINs from B at 2 sequence numbers" in two rounds at once).
	type ports struct{ b, a uint16 }
	byPorts := map[ports]*conn{}
	for _, r := range rs {
		byPorts[ports{r.local.Port(), r.remote.Port()}] = &conn{fins: map[uint32]bool{}, firstEngineTS: r.stats.TSVal}
	}
	for {
		p, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		eth := header.Ethernet(p.Data)
		if !eth.IsValid() || eth.Type() != header.EtherTypeIPv4 {
			continue
		}
		ip := header.IPv4(eth.Payload())
		if len(ip) < header.IPv4MinLen || ip.Src() != b || ip.Protocol() != header.IPProtocolTCP {
			continue
		}
		if ip.TotalLen() > len(ip) || ip.TotalLen() < ip.HeaderLen() {
			continue
		}
		seg := header.TCP(ip[ip.HeaderLen():ip.TotalLen()]) // not the Ethernet padding
		if len(seg) < header.TCPMinLen {
			continue
		}
		c := byPorts[ports{seg.SrcPort(), seg.DstPort()}]
		if c == nil {
			continue
		}
		c.segs++
		if seg.Flags()&header.TCPFlagFIN != 0 {
			fin := seg.Seq() + uint32(len(seg.Payload())) // where the FIN is
			c.fins[fin] = true
			c.finEnd, c.finSeen = fin+1, true
		}
		// A reset after the FIN, at its end, is the engine answering
		// a late segment of the peer's once its connection is gone
		// (as Linux would); any other is a problem.
		if seg.Flags()&header.TCPFlagRST != 0 && !(c.finSeen && seg.Seq() == c.finEnd) {
			c.rsts++
		}
		var o header.TCPOptions
		if header.ParseTCPOptions(seg.Options(), &o) && o.HasTimestamp {
			// TakeOver starts the engine's clock above every TSval
			// the kernel sent: a segment below the engine's first
			// is the kernel's. The engine's must never go back (a
			// kernel segment stamped above the engine's first would
			// show as one). The kernel's last few may reach A after
			// the engine's first (the engine's AF_XDP transmit
			// passes the kernel's queues), and the kernel's own
			// segments, sent from two CPUs, now and then cross on
			// veth: the peer takes both as reordering.
			engine := int32(o.TSVal-c.firstEngineTS) >= 0
			last := &c.lastKernelTS
			if engine {
				last = &c.lastEngineTS
				c.engineSeen = true
			} else if c.engineSeen {
				c.overtaken++
			}
			if !engine && *last != 0 && int32(o.TSVal-*last) < 0 {
				c.kernelCrossed++
			}
			if engine && *last != 0 && int32(o.TSVal-*last) < 0 {
				if c.tsBack == 0 {
					c.back = fmt.Sprintf("%d after %d (engine's %v, first %d), seq %d, %d octets", o.TSVal, *last, engine,
						c.firstEngineTS, seg.Seq(), len(seg.Payload()))
				}
				c.tsBack++
			}
			*last = o.TSVal
		}
	}
	for _, r := range rs {
		c := byPorts[ports{r.local.Port(), r.remote.Port()}]
		if c.segs == 0 {
			problems = append(problems, fmt.Sprintf("round %d: no segment of B's in the capture", r.n))
		}
		if c.rsts != 0 {
			problems = append(problems, fmt.Sprintf("round %d: %d RSTs from B", r.n, c.rsts))
		}
		if len(c.fins) > 1 {
			problems = append(problems, fmt.Sprintf("round %d: FINs from B at %d sequence numbers, want one (the engine's): %v", r.n, len(c.fins), c.fins))
		}
		if c.tsBack != 0 {
			problems = append(problems, fmt.Sprintf("round %d: the engine's TSval went back %d times, first %s", r.n, c.tsBack, c.back))
		}
		if c.overtaken > 8 {
			problems = append(problems, fmt.Sprintf("round %d: %d of the kernel's segments reached A after the engine's first", r.n, c.overtaken))
		}
	}
	return problems
}

// TestTakeOverWrongOrderShowsTheReset: dropping the kernel's connection
// before its flow is steered away lets the peer's next segment draw a
// reset from B's kernel, and the capture and TcpOutRsts show it: the
// checks of TestTakeOver can see what they look for.
func TestTakeOverWrongOrderShowsTheReset(t *testing.T) {
	testenv.RequireTool(t, "tcpdump")
	e := start(t, bpf.ModeGeneric, tcp.Options{})
	tp := e.tp
	pcapPath := filepath.Join(t.TempDir(), "wrong.pcap")
	cap0, err := capture.Start(tp.A, tp.A.Link, "tcp and portrange 20000-20999", pcapPath)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := tp.B.Counters()
	r := &round{n: 0, bActive: true}
	r.connect(t, tp, 20500)
	rc, err := r.bConn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	s, err := repair.Enter(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Drop(); err != nil {
		t.Fatal(err)
	}
	r.bConn.Close()
	if _, err := r.aConn.Write([]byte("anyone there?")); err != nil {
		t.Fatal(err)
	}
	_ = r.aConn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.aConn.Read(make([]byte, 1)); !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("A's read after the wrong order: %v, want a reset", err)
	}
	after, _ := tp.B.Counters()
	if err := cap0.Stop(); err != nil {
		t.Fatal(err)
	}
	if d := after["Tcp:OutRsts"] - before["Tcp:OutRsts"]; d == 0 {
		t.Errorf("TcpOutRsts did not move")
	}
	problems := checkWire(t, pcapPath, []*round{r}, tp.B.Addr.Addr())
	if len(problems) == 0 {
		t.Errorf("the capture check saw nothing wrong with a connection B reset")
	}
	t.Logf("the capture check saw: %v", problems)
}

// TestTakeOverRefusals: connections that cannot be taken over are refused
// with a clear error and go on working in the kernel: one B half-closed
// (not ESTABLISHED), one on B's loopback (its packets do not arrive on
// the interface), one whose process lacks CAP_NET_ADMIN (EPERM).
func TestTakeOverRefusals(t *testing.T) {
	e := start(t, bpf.ModeGeneric, tcp.Options{})
	tp := e.tp
	ep := newEndpoint(0)

	// Half-closed by B: FIN_WAIT.
	r := &round{n: 0, bActive: true}
	r.connect(t, tp, 20600)
	if err := r.bConn.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.p.TakeOver(r.bConn, ep); !errors.Is(err, repair.ErrRefused) {
		t.Errorf("half-closed: %v, want ErrRefused", err)
	} else {
		t.Logf("half-closed: %v", err)
	}
	stillWorks(t, r.aConn, r.bConn, false)

	// Without CAP_NET_ADMIN: the thread that asks drops it from its
	// effective set (capabilities are per thread), and gets it back.
	r = &round{n: 1, bActive: false}
	r.connect(t, tp, 20601)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := dropCap(unix.CAP_NET_ADMIN); err != nil {
			errc <- err
			return
		}
		_, _, err := e.p.TakeOver(r.bConn, ep)
		if rerr := raiseCap(unix.CAP_NET_ADMIN); rerr != nil {
			// The thread must not go back to the pool without it.
			panic(rerr)
		}
		errc <- err
	}()
	if err := <-errc; !errors.Is(err, repair.ErrPermission) {
		t.Errorf("without CAP_NET_ADMIN: %v, want ErrPermission", err)
	} else {
		t.Logf("without CAP_NET_ADMIN: %v", err)
	}
	stillWorks(t, r.aConn, r.bConn, true)

	// ECN negotiated: both kernels ask for it.
	for _, h := range []topology.Host{tp.A, tp.B} {
		if out, err := h.Command("sysctl", "-qw", "net.ipv4.tcp_ecn=1").CombinedOutput(); err != nil {
			t.Fatalf("tcp_ecn: %v: %s", err, out)
		}
	}
	r = &round{n: 2, bActive: true}
	r.connect(t, tp, 20602)
	if _, _, err := e.p.TakeOver(r.bConn, ep); !errors.Is(err, repair.ErrRefused) {
		t.Errorf("ECN: %v, want ErrRefused", err)
	} else {
		t.Logf("ECN: %v", err)
	}
	stillWorks(t, r.aConn, r.bConn, true)
	for _, h := range []topology.Host{tp.A, tp.B} {
		_ = h.Command("sysctl", "-qw", "net.ipv4.tcp_ecn=2").Run()
	}

	// Signed with TCP-MD5: both sides hold the key before connecting.
	if md5a, md5b, err := md5Pair(t, tp, 20603); err != nil {
		t.Errorf("a TCP-MD5 connection: %v", err)
	} else {
		if _, _, err := e.p.TakeOver(md5b, ep); !errors.Is(err, repair.ErrRefused) || !strings.Contains(err.Error(), "TCP-MD5") {
			t.Errorf("TCP-MD5: %v, want ErrRefused naming it", err)
		} else {
			t.Logf("TCP-MD5: %v", err)
		}
		stillWorks(t, md5a, md5b, true)
	}

	// MPTCP: Go asks for it on both ends; the kernel falls back to
	// plain TCP where it cannot, and then there is nothing to refuse.
	if ma, mb, err := mptcpPair(tp, 20604); err != nil {
		t.Errorf("an MPTCP connection: %v", err)
	} else if mptcp, _ := mb.MultipathTCP(); !mptcp {
		t.Errorf("the kernel made plain TCP of an MPTCP connection between the namespaces")
		ma.Close()
		mb.Close()
	} else {
		if _, _, err := e.p.TakeOver(mb, ep); !errors.Is(err, repair.ErrRefused) || !strings.Contains(err.Error(), "MPTCP") {
			t.Errorf("MPTCP: %v, want ErrRefused naming it", err)
		} else {
			t.Logf("MPTCP: %v", err)
		}
		stillWorks(t, ma, mb, true)
	}

	// Urgent data from A that B has not read.
	r = &round{n: 3, bActive: false}
	r.connect(t, tp, 20605)
	if _, err := r.aConn.Write([]byte("before the mark")); err != nil {
		t.Fatal(err)
	}
	arc, _ := r.aConn.SyscallConn()
	var oerr error
	if err := arc.Control(func(fd uintptr) { oerr = unix.Sendto(int(fd), []byte("!"), unix.MSG_OOB, nil) }); err != nil || oerr != nil {
		t.Fatalf("send urgent: %v %v", err, oerr)
	}
	time.Sleep(50 * time.Millisecond)
	if _, _, err := e.p.TakeOver(r.bConn, ep); !errors.Is(err, repair.ErrRefused) || !strings.Contains(err.Error(), "urgent") {
		t.Errorf("urgent data: %v, want ErrRefused naming it", err)
	} else {
		t.Logf("urgent data: %v", err)
	}
	r.aConn.Close()
	r.bConn.Close()

	// On B's loopback: not the poller's address.
	var lc, ls *net.TCPConn
	err := tp.B.Do(func() error {
		ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return err
		}
		defer ln.Close()
		if lc, err = net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr)); err != nil {
			return err
		}
		ls, err = ln.AcceptTCP()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	defer ls.Close()
	if _, _, err := e.p.TakeOver(lc, ep); !errors.Is(err, repair.ErrRefused) {
		t.Errorf("loopback: %v, want ErrRefused", err)
	} else {
		t.Logf("loopback: %v", err)
	}
	stillWorks(t, ls, lc, true)
}

// stillWorks: the connection carries octets each way (from a to b only
// when b half-closed).
func stillWorks(t *testing.T, a, b *net.TCPConn, both bool) {
	t.Helper()
	pairs := [][2]*net.TCPConn{{a, b}}
	if both {
		pairs = append(pairs, [2]*net.TCPConn{b, a})
	}
	for _, p := range pairs {
		msg := []byte("still here")
		if _, err := p[0].Write(msg); err != nil {
			t.Fatalf("after the refusal: write: %v", err)
		}
		got := make([]byte, len(msg))
		_ = p[1].SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(p[1], got); err != nil || string(got) != string(msg) {
			t.Fatalf("after the refusal: read %q: %v", got, err)
		}
	}
	a.Close()
	b.Close()
}

// dropCap and raiseCap clear and set a capability in the calling thread's
// effective set (it stays permitted).
func dropCap(c int) error  { return setCap(c, false) }
func raiseCap(c int) error { return setCap(c, true) }

func setCap(c int, on bool) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	bit := uint32(1) << (c % 32)
	if on {
		data[c/32].Effective |= bit
	} else {
		data[c/32].Effective &^= bit
	}
	return unix.Capset(&hdr, &data[0])
}

// md5Pair is a connection from A to B's kernel signed with TCP-MD5 (RFC
// 2385): the key is set for the peer on A's socket before it connects and
// on B's listener before the SYN comes.
func md5Pair(t *testing.T, tp *topology.Pair, port uint16) (a, b *net.TCPConn, err error) {
	t.Helper()
	key := func(peer netip.Addr) func(_, _ string, c syscall.RawConn) error {
		return func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				sig := unix.TCPMD5Sig{Keylen: 16}
				sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&sig.Addr))
				sa.Family, sa.Addr = unix.AF_INET, peer.As4()
				copy(sig.Key[:], "a shared secret!")
				_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_MD5SIG,
					uintptr(unsafe.Pointer(&sig)), unsafe.Sizeof(sig), 0)
				if e != 0 {
					serr = e
				}
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	ln, err := tp.B.ListenTCPWith(netip.AddrPortFrom(tp.B.Addr.Addr(), port), key(tp.A.Addr.Addr()))
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	if a, err = tp.A.DialTCPWith(netip.AddrPortFrom(tp.B.Addr.Addr(), port), 5*time.Second, key(tp.B.Addr.Addr())); err != nil {
		return nil, nil, err
	}
	_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
	if b, err = ln.AcceptTCP(); err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// mptcpPair is an MPTCP connection from A to B (Go's SetMultipathTCP on
// both ends).
func mptcpPair(tp *topology.Pair, port uint16) (a, b *net.TCPConn, err error) {
	var ln net.Listener
	if err := tp.B.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp4", netip.AddrPortFrom(tp.B.Addr.Addr(), port).String())
		return err
	}); err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	if err := tp.A.Do(func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		c, err := d.Dial("tcp4", netip.AddrPortFrom(tp.B.Addr.Addr(), port).String())
		if err == nil {
			a = c.(*net.TCPConn)
		}
		return err
	}); err != nil {
		return nil, nil, err
	}
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, c.(*net.TCPConn), nil
}

// TestHoldAndGiveBack: a flow held and given back before any drop (the
// path of a takeover that fails after steering) goes on in the kernel:
// A's segments sent while it was held, and those still on their way
// when it is given back, are dropped rather than reset, and A's
// retransmissions reach B's kernel. Repair mode entered and left keeps
// the socket's SO_REUSEADDR.
func TestHoldAndGiveBack(t *testing.T) {
	e := start(t, bpf.ModeGeneric, tcp.Options{})
	tp := e.tp
	before, _ := tp.B.Counters()
	r := &round{n: 0, bActive: true}
	r.connect(t, tp, 20700)
	defer r.aConn.Close()
	defer r.bConn.Close()
	id := tcp.FourTuple{LocalAddr: r.local.Addr(), RemoteAddr: r.remote.Addr(), LocalPort: r.local.Port(), RemotePort: r.remote.Port()}
	if err := e.p.Hold(id); err != nil {
		t.Fatal(err)
	}
	rc, err := r.bConn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	_ = rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
	s, err := repair.Enter(rc)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 200<<10)
	sim.FillPattern(seedA, 0, msg)
	go func() { _, _ = r.aConn.Write(msg) }()
	time.Sleep(20 * time.Millisecond) // A's first segments are held
	if err := s.Abandon(); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Unhold(id); err != nil {
		t.Fatal(err)
	}
	var reuse int
	_ = rc.Control(func(fd uintptr) { reuse, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR) })
	if reuse != 1 {
		t.Errorf("SO_REUSEADDR %d after repair mode, want 1", reuse)
	}
	got := make([]byte, len(msg))
	_ = r.bConn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(r.bConn, got); err != nil {
		t.Fatalf("B's kernel after the give-back: %v", err)
	}
	for i := range got {
		if got[i] != msg[i] {
			t.Fatalf("B's stream differs at %d", i)
		}
	}
	if _, err := r.bConn.Write([]byte("and back")); err != nil {
		t.Fatal(err)
	}
	after, _ := tp.B.Counters()
	if st := e.p.Stats(); after["Tcp:OutRsts"] != before["Tcp:OutRsts"] {
		t.Errorf("B's kernel sent %d RSTs (poller %+v)", after["Tcp:OutRsts"]-before["Tcp:OutRsts"], st)
	}
}
