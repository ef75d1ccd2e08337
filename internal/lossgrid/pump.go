package lossgrid

import (
	"errors"
	"os"
	"time"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/internal/tun"
	"github.com/softrnic/softrnic/tcp"
)

// The pump is the link between the bridge's two sides: one goroutine owns
// both impairment stages (A→B and B→A) and, for a side played by the
// engine, that side's tcp.Stack; reader goroutines hand it the packets
// the kernels send on the TUN devices. A packet of a kernel side is
// pushed into its stage as read; a packet of an engine side as Output
// builds it. What a stage lets out goes to the other side: WritePacket
// for a kernel, Stack.Input for an engine. So every pairing of kernel and
// engine crosses the same stages, in the same goroutine.

// side indexes: A sends the stream, B receives it.
const (
	sideA = 0
	sideB = 1
)

type frame struct {
	side int
	b    []byte
}

// readers read both TUN devices for the bridge's whole life; the pump of
// the current run takes their frames.
type readers struct {
	frames chan frame
	free   chan []byte
	done   chan struct{}
}

func startReaders(br *topology.TunBridge) *readers {
	r := &readers{frames: make(chan frame, 1024), free: make(chan []byte, 1280), done: make(chan struct{})}
	for range cap(r.free) {
		r.free <- make([]byte, 2048)
	}
	for i, d := range []*tun.Device{br.DevA, br.DevB} {
		go func() {
			for {
				var b []byte
				select {
				case b = <-r.free:
				case <-r.done:
					return
				}
				n, err := d.ReadPacket(b)
				if errors.Is(err, os.ErrClosed) {
					return
				}
				if err != nil || n == 0 {
					r.free <- b
					continue
				}
				select {
				case r.frames <- frame{side: i, b: b[:n]}:
				case <-r.done:
					return
				}
			}
		}()
	}
	return r
}

// pump is one run's link.
type pump struct {
	devs   [2]*tun.Device
	rd     *readers
	start  time.Time
	stages [2]*impair.Stage // by the side a packet leaves: [A] is A→B
	stacks [2]*tcp.Stack    // nil for a kernel side
	// port is B's listening port: the run's data direction is A → this
	// port, and only it is tapped.
	port     uint16
	tap      wire
	calls    chan func(now tcp.Time)
	stop     chan struct{}
	finished chan struct{}
	outBuf   []byte
	popBuf   []byte
	ipID     uint16
	more     bool
	// WriteErrors counts packets a TUN device refused.
	writeErrors uint64
}

func (p *pump) now() time.Duration { return time.Since(p.start) }

// tnow is the engines' clock: the pump's plus a second, so that no
// instant is zero.
func tnow(d time.Duration) tcp.Time { return tcp.Time(d + time.Second) }

// do runs fn on the pump goroutine and waits for it.
func (p *pump) do(fn func(now tcp.Time)) {
	done := make(chan struct{})
	select {
	case p.calls <- func(now tcp.Time) { fn(now); close(done) }:
		<-done
	case <-p.finished:
	}
}

func (p *pump) loop() {
	defer close(p.finished)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var wake <-chan time.Time
		if at, ok := p.nextWake(); ok {
			timer.Reset(max(at-p.now(), 0))
			wake = timer.C
		} else {
			timer.Stop()
		}
		select {
		case f := <-p.rd.frames:
			p.frame(f)
		batch:
			for range 63 {
				select {
				case f := <-p.rd.frames:
					p.frame(f)
				default:
					break batch
				}
			}
		case <-wake:
		case fn := <-p.calls:
			fn(tnow(p.now()))
		case <-p.stop:
			return
		}
		p.serve()
	}
}

func (p *pump) nextWake() (time.Duration, bool) {
	if p.more {
		return p.now(), true
	}
	var t time.Duration
	ok := false
	for i := range 2 {
		if d, has := p.stages[i].Next(); has && (!ok || d < t) {
			t, ok = d, true
		}
		if s := p.stacks[i]; s != nil {
			if at, has := s.NextTimer(); has && (!ok || time.Duration(at)-time.Second < t) {
				t, ok = time.Duration(at)-time.Second, true
			}
		}
	}
	return t, ok
}

// frame takes a packet a kernel side sent.
func (p *pump) frame(f frame) {
	defer func() { p.rd.free <- f.b[:cap(f.b)] }()
	if p.stacks[f.side] != nil {
		return // that side's kernel is not in this run
	}
	ip := header.IPv4(f.b)
	if !ip.IsValid(len(f.b)) || ip.Protocol() != header.IPProtocolTCP {
		return
	}
	p.enter(f.side, p.now(), f.b[:ip.TotalLen()])
}

// enter pushes a packet leaving side into the link.
func (p *pump) enter(side int, now time.Duration, pkt []byte) {
	if side == sideA {
		if t := header.TCP(header.IPv4(pkt).Payload()); len(t) >= header.TCPMinLen && t.DstPort() == p.port {
			p.tap.sent(now, t)
		}
	}
	p.stages[side].Push(now, pkt)
}

// rxBatch is the most packets an engine side takes in before it may
// answer, as xdpnet's poller takes at most 64 RX descriptors per turn.
// Without it an engine receiver behind an engine sender in this one
// goroutine took a whole window's segments per turn and answered them
// with one ACK: on a link that holds a reordered packet until three
// later ones pass (or 10 ms), that lone ACK waited the 10 ms, and
// engine → engine at reorder 25% ran at 0.15× Linux's goodput, stalled
// between loss probes.
const rxBatch = 64

// serve moves what is due until nothing is: packets out of the stages
// (at most rxBatch into an engine side per turn), engine timers, engine
// output into the stages.
func (p *pump) serve() {
	for range 64 {
		now := p.now()
		moved := false
		p.more = false
		for from := range 2 {
			to := 1 - from
			for k := 0; ; k++ {
				if k == rxBatch && p.stacks[to] != nil {
					p.more = true
					break
				}
				n, ok := p.stages[from].Pop(now, p.popBuf)
				if !ok {
					break
				}
				moved = true
				pkt := p.popBuf[:n]
				ip := header.IPv4(pkt)
				if from == sideA {
					if t := header.TCP(ip.Payload()); len(t) >= header.TCPMinLen && t.DstPort() == p.port {
						p.tap.delivered(t)
					}
				}
				if s := p.stacks[to]; s != nil {
					s.Input(tnow(now), ip.Src(), ip.Dst(), ip.Payload())
				} else if err := p.devs[to].WritePacket(pkt); err != nil {
					p.writeErrors++
				}
			}
		}
		for side, s := range p.stacks {
			if s == nil {
				continue
			}
			s.Advance(tnow(now))
			for k := 0; ; k++ {
				if k == 1024 {
					p.more = true
					break
				}
				n, src, dst := s.Output(tnow(now), p.outBuf[header.IPv4MinLen:])
				if n == 0 {
					break
				}
				moved = true
				pkt := p.outBuf[:header.IPv4MinLen+n]
				header.IPv4(pkt).Encode(&header.IPv4Fields{
					TotalLen: uint16(len(pkt)), ID: p.ipID, DontFragment: true,
					TTL: 64, Protocol: header.IPProtocolTCP, Src: src, Dst: dst,
				})
				p.ipID++
				p.enter(side, now, pkt)
			}
		}
		if !moved {
			return
		}
	}
	p.more = true
}
