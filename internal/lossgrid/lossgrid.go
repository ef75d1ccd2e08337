// Package lossgrid is the TCP loss benchmark: a bulk stream over a bad
// link, run over the same impaired link in the same place by Linux ↔
// Linux, engine ↔ Linux, Linux ↔ engine and engine ↔ engine, so that the
// engine's goodput and recovery can be read as ratios to Linux's.
//
// The link is topology.TunBridge: two namespaces joined only by this
// process, whose pump applies one internal/impair Stage per direction to
// every packet. A side is either its namespace's kernel (sockets in it)
// or a tcp.Stack in the pump standing in for it; the stream always goes
// from A (sender) to B (receiver, listening). Each point of the grid
// applies its impairment to both directions, with the same seeds for
// every pairing. What the sender did is counted on the wire (WireStats),
// the same way for both stacks, and from each stack's own counters
// (Linux's nstat in A's namespace, the engine's ConnStats).
package lossgrid

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/internal/tun"
	"github.com/softrnic/softrnic/tcp"
)

// Kind is what plays a side.
type Kind string

// Kinds.
const (
	Linux  Kind = "linux"
	Engine Kind = "engine"
)

// Pair is a sender and a receiver.
type Pair struct{ Sender, Receiver Kind }

func (p Pair) String() string { return string(p.Sender) + "→" + string(p.Receiver) }

// Pairs are the four pairings, Linux → Linux first: it is the reference.
var Pairs = []Pair{{Linux, Linux}, {Engine, Linux}, {Linux, Engine}, {Engine, Engine}}

// Point is one impairment of the grid, applied to both directions.
type Point struct {
	Name   string
	Impair impair.Config
}

// Grid is issue 18's grid: each impairment alone, then the mixes.
func Grid() []Point {
	return []Point{
		{"clean", impair.Config{}},
		{"loss 0.1%", impair.Config{Loss: 0.001}},
		{"loss 1%", impair.Config{Loss: 0.01}},
		{"loss 5%", impair.Config{Loss: 0.05}},
		{"reorder 5%", impair.Config{Reorder: 0.05}},
		{"reorder 25%", impair.Config{Reorder: 0.25}},
		{"duplicate 1%", impair.Config{Duplicate: 0.01}},
		{"delay 1ms±200us", impair.Config{Delay: time.Millisecond, Jitter: 200 * time.Microsecond}},
		{"delay 10ms±2ms", impair.Config{Delay: 10 * time.Millisecond, Jitter: 2 * time.Millisecond}},
		{"mix", impair.Config{Loss: 0.01, Reorder: 0.05, Duplicate: 0.01, Delay: time.Millisecond, Jitter: 200 * time.Microsecond}},
		{"worst mix", impair.Config{Loss: 0.05, Reorder: 0.25, Duplicate: 0.01, Delay: 10 * time.Millisecond, Jitter: 2 * time.Millisecond}},
	}
}

// Options configure a run of the grid.
type Options struct {
	// Duration of each stream, from its handshake (default 3 s).
	Duration time.Duration
	// Seed keys the impairments: the same for every pairing of a point
	// in a round; round r is keyed by Seed + r.
	Seed uint64
	// Rounds is how many times the whole grid runs (default 1); the
	// targets are read from the median of each point's rounds, since
	// one 3 s stream on a busy 2-core machine can land well or badly.
	Rounds int
	// Points and Pairs to run (default Grid() and Pairs).
	Points []Point
	Pairs  []Pair
	// Engine configures the engine's stacks (its zero value is the
	// daemon's default).
	Engine tcp.Options
	// LinuxCC is the congestion control of the Linux sides (default
	// "cubic", the engine's default, so that the two compare like with
	// like: a host's own default may be BBR, which does not back off on
	// loss at all).
	LinuxCC string
	// Progress, if set, gets a line per stream.
	Progress io.Writer
}

// LinkStats are what the link's stages did, per direction.
type LinkStats struct {
	// Data is A→B (the stream), Acks B→A.
	Data, Acks impair.Stats
	// DataLoss is the fraction of A's packets the link dropped.
	DataLoss float64
	// TunErrors counts packets a TUN device refused; QueueDrops those
	// a kernel side sent that its TUN queue dropped before the pump
	// read them (the pump fell behind: a loss the impairment did not
	// make, which the tap does not see).
	TunErrors, QueueDrops uint64
}

// Result is one stream.
type Result struct {
	Point, Impair, Pair string
	// Round (from 0) and the Seed its impairments were keyed by.
	Round   int
	Seed    uint64
	Seconds float64
	Octets  uint64
	Mbps    float64
	// Verified: every octet the receiver got was the sender's, in order.
	Verified bool
	Err      string `json:",omitempty"`
	Wire     WireStats
	Link     LinkStats
	// Sender is the sender's own account: the engine's ConnStats, or
	// Linux's TCP counters (nstat) in A's namespace over the stream.
	Sender map[string]uint64
}

// Run runs every point with every pairing over one bridge.
func Run(br *topology.TunBridge, o Options) ([]Result, error) {
	if o.Duration <= 0 {
		o.Duration = 3 * time.Second
	}
	if o.Points == nil {
		o.Points = Grid()
	}
	if o.Pairs == nil {
		o.Pairs = Pairs
	}
	if o.LinuxCC == "" {
		o.LinuxCC = "cubic"
	}
	o.Rounds = max(o.Rounds, 1)
	rd := startReaders(br)
	defer close(rd.done)
	var out []Result
	port := uint16(5000)
	for round := range o.Rounds {
		for pi, pt := range o.Points {
			for _, pr := range o.Pairs {
				port++
				r := runOne(br, rd, o, round, pt, uint64(pi), pr, port)
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "round %d %-16s %-14s %8.1f Mbit/s  rtx %5d (spurious %4d)  RTOs %2d (%.2f s)  link loss %.2f%%  %s\n",
						round, pt.Name, pr, r.Mbps, r.Wire.Retransmits, r.Wire.Spurious, r.Wire.RTOs, r.Wire.RTOSeconds,
						100*r.Link.DataLoss, verdict(r))
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

func verdict(r Result) string {
	switch {
	case r.Err != "":
		return "ERROR: " + r.Err
	case !r.Verified:
		return "NOT verified"
	}
	return "verified"
}

// stream is the two ends of one run's connection, whoever plays them.
type stream struct {
	recvd   atomic.Uint64
	corrupt atomic.Pointer[error]
	stop    atomic.Bool
	wg      sync.WaitGroup
	conns   []*net.TCPConn
	mu      sync.Mutex
	errs    []error
	sender  *endpoint // engine sender
	recvr   *endpoint // engine receiver
}

// keep records a kernel connection for the run's end to reset; one that
// comes after the end (an accept late on a failed run) is reset now, so
// that no goroutine is left reading it.
func (s *stream) keep(c *net.TCPConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop.Load() {
		abort(c)
		return false
	}
	s.conns = append(s.conns, c)
	return true
}

// abort resets c (SO_LINGER 0): the run is over, whatever is queued.
func abort(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

func (s *stream) fail(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

const seedA = 0x5eed

func runOne(br *topology.TunBridge, rd *readers, o Options, round int, pt Point, pointIdx uint64, pr Pair, port uint16) (res Result) {
	seed := o.Seed + uint64(round)
	res = Result{Point: pt.Name, Impair: pt.Impair.String(), Pair: pr.String(), Round: round, Seed: seed}
	cfgAB, cfgBA := pt.Impair, pt.Impair
	cfgAB.Seed = seed*1000 + pointIdx*2 + 1
	cfgBA.Seed = seed*1000 + pointIdx*2 + 2
	p := &pump{
		devs:     [2]*tun.Device{br.DevA, br.DevB},
		rd:       rd,
		start:    time.Now(),
		stages:   [2]*impair.Stage{impair.New(cfgAB), impair.New(cfgBA)},
		port:     port,
		calls:    make(chan func(tcp.Time)),
		stop:     make(chan struct{}),
		finished: make(chan struct{}),
		outBuf:   make([]byte, 65536),
		popBuf:   make([]byte, 65536),
	}
	for i, k := range []Kind{pr.Sender, pr.Receiver} {
		if k != Engine {
			continue
		}
		opts := o.Engine
		if _, err := rand.Read(opts.Secret[:]); err != nil {
			res.Err = err.Error()
			return res
		}
		s, err := tcp.NewStack(opts)
		if err != nil {
			res.Err = err.Error()
			return res
		}
		p.stacks[i] = s
	}
	// Frames left from the last run (its kernels' last words) are not
	// this run's.
	for len(rd.frames) > 0 {
		f := <-rd.frames
		rd.free <- f.b[:cap(f.b)]
	}
	drops0 := tunDrops(br)
	go p.loop()
	st := &stream{}
	defer func() {
		st.stop.Store(true)
		st.mu.Lock()
		for _, c := range st.conns {
			abort(c)
		}
		st.mu.Unlock()
		p.do(func(tcp.Time) {
			for _, e := range []*endpoint{st.sender, st.recvr} {
				if e != nil && e.conn != nil {
					e.conn.Abort()
				}
			}
		})
		st.wg.Wait()
		close(p.stop)
		<-p.finished
	}()
	dst := netip.AddrPortFrom(br.AddrB, port)

	// B listens.
	var ln *net.TCPListener
	if pr.Receiver == Linux {
		var err error
		if ln, err = br.B.ListenTCPWith(dst, withCC(o.LinuxCC)); err != nil {
			res.Err = err.Error()
			return res
		}
		defer ln.Close()
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			c, err := ln.AcceptTCP()
			if err != nil {
				if !st.stop.Load() {
					st.fail(err)
				}
				return
			}
			if !st.keep(c) {
				return
			}
			receiveKernel(st, c)
		}()
	} else {
		var err error
		p.do(func(tcp.Time) {
			st.recvr = &endpoint{st: st}
			_, err = p.stacks[sideB].Listen(br.AddrB, port, st.recvr)
		})
		if err != nil {
			res.Err = err.Error()
			return res
		}
	}

	// A connects and sends.
	var before map[string]uint64
	if pr.Sender == Linux {
		var err error
		if before, err = nstat(br.A); err != nil {
			res.Err = err.Error()
			return res
		}
		c, err := br.A.DialTCPWith(dst, 5*time.Second, withCC(o.LinuxCC))
		if err != nil {
			res.Err = "connect: " + err.Error()
			return res
		}
		if !st.keep(c) {
			res.Err = "stopped while connecting"
			return res
		}
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			sendKernel(st, c)
		}()
	} else {
		var err error
		p.do(func(now tcp.Time) {
			st.sender = &endpoint{st: st, send: true}
			st.sender.conn, err = p.stacks[sideA].Connect(now, br.AddrA, 0, dst, st.sender)
		})
		if err != nil {
			res.Err = "connect: " + err.Error()
			return res
		}
		deadline := time.Now().Add(5 * time.Second)
		for up := false; !up; {
			p.do(func(tcp.Time) { up = st.sender.established })
			if !up {
				if time.Now().After(deadline) {
					res.Err = "connect: no handshake in 5 s"
					return res
				}
				time.Sleep(time.Millisecond)
			}
		}
	}

	received := func() uint64 {
		if pr.Receiver == Linux {
			return st.recvd.Load()
		}
		var n uint64
		p.do(func(tcp.Time) { n = st.recvr.recvd })
		return n
	}
	t0, n0 := time.Now(), received()
	time.Sleep(o.Duration)
	t1, n1 := time.Now(), received()
	res.Seconds = t1.Sub(t0).Seconds()
	res.Octets = n1 - n0
	res.Mbps = float64(res.Octets) * 8 / res.Seconds / 1e6

	p.do(func(tcp.Time) {
		res.Wire = p.tap.WireStats
		res.Link.Data, res.Link.Acks = p.stages[sideA].Stats, p.stages[sideB].Stats
		res.Link.TunErrors = p.writeErrors
		if e := st.sender; e != nil && e.conn != nil {
			res.Sender = engineCounters(e.conn.Stats)
		}
	})
	res.Link.QueueDrops = tunDrops(br) - drops0
	if d := res.Link.Data; d.Pushed > 0 {
		res.Link.DataLoss = float64(d.Lost) / float64(d.Pushed)
	}
	if pr.Sender == Linux {
		after, err := nstat(br.A)
		if err != nil {
			res.Err = err.Error()
			return res
		}
		res.Sender = map[string]uint64{}
		for k, v := range after {
			res.Sender[k] = v - before[k]
		}
	}
	st.mu.Lock()
	errs := errors.Join(st.errs...)
	st.mu.Unlock()
	if c := st.corrupt.Load(); c != nil {
		errs = errors.Join(errs, *c)
	}
	if errs != nil {
		res.Err = errs.Error()
	}
	res.Verified = errs == nil && res.Octets > 0
	return res
}

// sendKernel writes the pattern on c until the stream stops.
func sendKernel(st *stream, c *net.TCPConn) {
	buf := make([]byte, 256<<10)
	var off uint64
	for !st.stop.Load() && off < maxStream {
		fill(seedA, off, buf)
		n, err := c.Write(buf)
		off += uint64(n)
		if err != nil {
			if !st.stop.Load() {
				st.fail(fmt.Errorf("linux sender: %w", err))
			}
			return
		}
	}
}

// receiveKernel reads c, checking the pattern, until the stream stops.
func receiveKernel(st *stream, c *net.TCPConn) {
	buf := make([]byte, 256<<10)
	var off uint64
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if st.corrupt.Load() == nil {
				if err := check(seedA, off, buf[:n]); err != nil {
					st.corrupt.Store(&err)
				}
			}
			off += uint64(n)
			st.recvd.Store(off)
		}
		if err != nil {
			if !st.stop.Load() {
				st.fail(fmt.Errorf("linux receiver: %w", err))
			}
			return
		}
	}
}

// maxStream bounds a stream below 4 GiB: the wire tap counts offsets in
// 32 bits.
const maxStream = 3 << 30

// endpoint is an engine end of the stream, run on the pump goroutine.
type endpoint struct {
	st          *stream
	send        bool
	conn        *tcp.Conn
	established bool
	sent, recvd uint64
	buf         []byte
}

func (e *endpoint) Receive(c *tcp.Conn, b []byte) int {
	if e.st.corrupt.Load() == nil {
		if err := check(seedA, e.recvd, b); err != nil {
			e.st.corrupt.Store(&err)
		}
	}
	e.recvd += uint64(len(b))
	return len(b)
}

func (e *endpoint) Event(c *tcp.Conn, ev tcp.Event) {
	e.conn = c
	switch ev {
	case tcp.EventEstablished:
		e.established = true
		e.pump()
	case tcp.EventWritable:
		e.pump()
	case tcp.EventReadable:
		var b [16 << 10]byte
		for {
			n := c.Read(b[:])
			if n == 0 {
				break
			}
			e.Receive(c, b[:n])
		}
	case tcp.EventClosed:
		if err := c.Err(); err != nil && !e.st.stop.Load() {
			e.st.fail(fmt.Errorf("engine: %w", err))
		}
	}
}

// pump writes as much of the pattern as the send buffer takes.
func (e *endpoint) pump() {
	if !e.send || e.st.stop.Load() {
		return
	}
	if e.buf == nil {
		e.buf = make([]byte, 64<<10)
	}
	for e.sent < maxStream {
		k := min(len(e.buf), max(e.conn.SendSpace(), 1))
		fill(seedA, e.sent, e.buf[:k])
		n, err := e.conn.Write(e.buf[:k])
		e.sent += uint64(n)
		if err != nil || n < k {
			return
		}
	}
}

// engineCounters is the engine sender's account of its recovery.
func engineCounters(s tcp.ConnStats) map[string]uint64 {
	return map[string]uint64{
		"SegmentsOut": s.SegmentsOut, "Retransmits": s.Retransmits, "FastRetransmits": s.FastRetransmits,
		"RTOs": s.RTOs, "LostRetransmits": s.LostRetransmits, "DSACKsIn": s.DSACKsIn,
		"SpuriousRecoveries": s.SpuriousRecoveries, "Reorderings": s.Reorderings, "LossProbes": s.LossProbes,
		"ProbeRepairs": s.ProbeRepairs, "LossTimeouts": s.LossTimeouts, "DupAcksIn": s.DupAcksIn,
	}
}

// nstatKeys are the Linux counters a sender's recovery shows in.
var nstatKeys = []string{
	"Tcp:OutSegs", "Tcp:RetransSegs", "TcpExt:TCPTimeouts", "TcpExt:TCPLossProbes", "TcpExt:TCPLossProbeRecovery",
	"TcpExt:TCPSackRecovery", "TcpExt:TCPFastRetrans", "TcpExt:TCPSlowStartRetrans", "TcpExt:TCPLostRetransmit",
	"TcpExt:TCPDSACKRecv", "TcpExt:TCPSpuriousRTOs", "TcpExt:TCPSACKReorder", "TcpExt:TCPTSReorder",
	"TcpExt:TCPDSACKUndo", "TcpExt:TCPFullUndo", "TcpExt:TCPPartialUndo", "TcpExt:TCPLossUndo",
}

// nstat reads nstatKeys in h's namespace.
func nstat(h topology.Host) (map[string]uint64, error) {
	all, err := h.Counters()
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(nstatKeys))
	for _, k := range nstatKeys {
		out[k] = all[k]
	}
	return out, nil
}

// tunDrops is the packets both TUN devices dropped on transmit (towards
// the pump) so far; 0 where ip cannot say.
func tunDrops(br *topology.TunBridge) uint64 {
	var n uint64
	for _, h := range []topology.Host{br.A, br.B} {
		out, err := exec.Command("ip", "-n", h.Namespace, "-s", "-j", "link", "show", "dev", h.Link).Output()
		if err != nil {
			continue
		}
		var links []struct {
			Stats64 struct {
				TX struct {
					Dropped uint64 `json:"dropped"`
				} `json:"tx"`
			} `json:"stats64"`
		}
		if json.Unmarshal(out, &links) == nil && len(links) == 1 {
			n += links[0].Stats64.TX.Dropped
		}
	}
	return n
}

// withCC sets a socket's congestion control (TCP_CONGESTION: as root any
// the kernel has, where a namespace's default may only be one of
// tcp_allowed_congestion_control).
func withCC(cc string) func(network, address string, rc syscall.RawConn) error {
	return func(network, address string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("TCP_CONGESTION %q: %w", cc, serr)
		}
		return nil
	}
}
