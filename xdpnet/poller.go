// Package xdpnet is the network layer of the accelerated datapath: a Poller
// runs one tcp.Stack over one AF_XDP socket bound to one receive queue of an
// interface, with the bpf steering program sending it the RNIC's TCP flows.
//
// # Goroutines
//
// A Poller has one loop, Run, on a locked OS thread that has entered the
// network namespace NewPoller was called in. The loop owns everything on the
// datapath: the Stack and its Handlers, the UMEM frames (two FreeLists: RX
// frames for the fill ring, TX frames for Output), the four rings, the
// neighbour cache, the flows and listen ports it registered with the
// steering program and the kernel sockets that reserve their ports.
//
// Other goroutines hand it work with Do (and Listen, Connect, CloseListener,
// which use Do): the call goes on a bounded channel and an eventfd wakes the
// loop if it sleeps; the caller waits until the function ran on the loop.
// Handlers run on the loop and must not call Do (it would wait for itself).
//
// One turn of the loop: take Do calls; drain up to a batch of the RX ring
// (Ethernet → IPv4 header and checksum → Stack.Input) and refill the fill
// ring; fire due timers (Stack.Advance); recycle completed TX frames; drain
// Stack.Output into TX frames (Ethernet and IPv4 headers in front, the
// destination MAC from the neighbour cache) and kick the kernel when the
// TX ring asks for it. While a turn finds work, and for Config.Spin after
// the last that did, the loop goes round again at once; then it sleeps in
// ppoll(2) on the socket and the eventfd until a frame arrives, a call
// comes, or the next TCP timer is due. A 2-core host cannot afford blind
// busy-polling: the kernel's softirq and the applications need the core.
//
// # Steering and ports
//
// Listen reserves the port by binding (not listening) a kernel TCP socket
// to Config.Addr and the port, then listens on the Stack and adds the port
// to the steering program's listen map. A SYN steered to a listened port
// gets its 4-tuple added to the flow map before the Stack sees it, so the
// rest of the handshake is steered too. Connect lets the kernel pick the
// local port (bind to port 0 of a TCP socket, kept bound), adds the flow,
// then connects the Stack from that port. A flow whose connection has left
// the Stack (after TIME-WAIT, a reset or an abort) is removed from the map
// and its reservation socket closed, by a sweep that runs at most every
// 100 ms while the Stack has fewer connections than the poller has flows.
// Connections must be opened through the Poller's methods, not
// Stack.Listen or Stack.Connect directly, or none of this happens.
//
// # Neighbours
//
// The destination MAC of a segment is the kernel's neighbour entry for its
// destination, read with an RTM_GETNEIGH netlink request and cached for
// neighbourTTL. When the kernel has none, the poller sends an empty UDP
// datagram to the peer's discard port from a kernel socket, which makes
// the kernel resolve it (its ARP replies are not TCP, so the steering
// program passes them to the kernel), and drops the segment: TCP
// retransmits it. Connect resolves before it sends the SYN. A peer off the
// link is reached through the gateway of the kernel's route to it
// (RTM_GETROUTE); a peer the kernel routes through another interface is
// refused. Changes are followed: a second netlink socket subscribed to
// neighbour and route notifications is drained every sweep, and what
// changed is read again at its next use (everything is read again after
// neighbourTTL anyway).
//
// # Offloads
//
// Frames received from a peer that has TX checksum offload or TSO/GSO on
// carry partial checksums and super-packets (on veth, the other end's
// features). The Stack drops the segments with bad checksums; Stats counts
// them (BadTCPChecksum, BadIPChecksum), and a transfer that stalls with
// those counters rising means the peer's offloads must go off
// (`ethtool -K <peer> tx off tso off gso off`).
//
// # Stalls
//
// The loop stores the number of each turn in an atomic as the turn starts
// (its heartbeat), and nothing else for stall detection. A watchdog
// outside the Poller (softrnicd has one) calls CheckStall about once a
// second: a loop that stays inside one turn, or leaves Do and Async calls
// untaken, for the watchdog's threshold is stalled, and each such episode
// is reported once and counted in Stats.Stalls. A loop asleep in ppoll
// with nothing queued is idle, however long it sleeps (see stall.go).
package xdpnet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xsk"
)

// Errors, testable with errors.Is.
var (
	// ErrClosed: the Poller's loop has stopped or the Poller is closed.
	ErrClosed = errors.New("xdpnet: poller closed")
	// ErrInterface: the interface is missing, down, lacks the address or
	// cannot carry the configured MTU.
	ErrInterface = errors.New("xdpnet: interface not usable")
	// ErrNoNeighbour: the peer's link-layer address could not be resolved.
	ErrNoNeighbour = errors.New("xdpnet: neighbour not resolved")
)

// Config describes a Poller.
type Config struct {
	// Interface is the name of the interface, in the network namespace
	// of the thread that calls NewPoller.
	Interface string
	// Queue is the receive queue the AF_XDP socket binds to.
	Queue int
	// Addr is the RNIC's IPv4 address: the interface's own address,
	// which the engine's connections use.
	Addr netip.Addr
	// Mode is the XDP mode of the steering program, when the Poller
	// attaches it (Steering nil).
	Mode bpf.Mode
	// Steering, when not nil, is a steering program already attached to
	// the interface and shared with other pollers; the Poller does not
	// close it. Nil: the Poller attaches its own and closes it.
	Steering *bpf.Steering
	// TCP configures the Stack. MTU 0 takes the interface's; a zero
	// Secret is replaced by a random one.
	TCP tcp.Options
	// Frames is the number of UMEM frames of 4096 octets, half for
	// receiving and half for sending (default 4096: 16 MiB).
	Frames int
	// Spin is how long the loop keeps polling after the last turn that
	// found work before it sleeps (default defaultSpin).
	Spin time.Duration
	// Pin, with CPU, pins the loop's OS thread to that CPU.
	Pin bool
	CPU int
	// ImpairRX and ImpairTX degrade what this poller receives and sends
	// the way tc-netem would (loss, duplication, reordering, delay), in
	// process: the tests' bad network on kernels without sch_netem.
	ImpairRX, ImpairTX impair.Config
	// Warn, when not nil, receives warnings about the link meant for the
	// operator (each at most once per poller): segments with bad TCP
	// checksums, the sign of a peer sending with offloads on.
	Warn func(msg string)
	// Group, when not nil, is the group of pollers of the interface this
	// one joins (see Group).
	Group *Group
}

const (
	frameSize = 4096
	// rxBatch is the most RX descriptors taken per turn of the loop,
	// txBatch the most segments produced per TX ring reservation.
	rxBatch = 64
	txBatch = 64
	// frameHeaders are the Ethernet and IPv4 (no options) headers in
	// front of each TCP segment sent.
	frameHeaders = header.EthernetLen + header.IPv4MinLen
	// maxSleep bounds one sleep, so that sweeps and neighbour refreshes
	// happen without a timer; waitCompletion bounds it while TX frames
	// are all in flight (their completions do not wake poll).
	maxSleep       = time.Second
	waitCompletion = 200 * time.Microsecond
	sweepInterval  = 100 * time.Millisecond
)

// Stats count what a Poller did. Read them with Poller.Stats.
type Stats struct {
	// RXFrames: frames taken from the RX ring; RXNotIPv4, RXMalformed,
	// BadIPChecksum, RXNotForUs (fragments, not TCP, another
	// destination): dropped before the Stack.
	RXFrames, RXNotIPv4, RXMalformed, BadIPChecksum, RXNotForUs uint64
	// BadTCPChecksum: segments the Stack dropped for their checksum;
	// rising, it means the peer sends partial checksums (offloads on).
	BadTCPChecksum uint64
	// TXFrames: frames submitted; TXNoNeighbour: segments dropped for
	// want of a destination MAC; Kicks: TX wakeups.
	TXFrames, TXNoNeighbour, Kicks uint64
	// FlowErrors: flow map updates that failed.
	FlowErrors uint64
	// NetlinkEvents: neighbour and route changes the kernel notified.
	NetlinkEvents uint64
	// HandedOff: frames passed to the poller that owns their flow;
	// HandoffDrops: dropped because its ring was full; MovingDrops:
	// dropped while their connection moved between pollers, or handed
	// to this poller after it had moved on to another.
	HandedOff, HandoffDrops, MovingDrops uint64
	// Sleeps: times the loop slept in ppoll, for Slept in all; Wakeups
	// by eventfd; Turns of the loop.
	Sleeps, Wakeups, Turns uint64
	Slept                  time.Duration
	// YieldBackoffs: spins that stopped yielding the CPU after a yield
	// that did not come back soon (see yield).
	YieldBackoffs uint64
	// Stalls: episodes in which the loop had work and made no progress
	// for a watchdog's threshold (CheckStall); read live, not published
	// by the loop, since a stalled loop publishes nothing.
	Stalls uint64
	// Flows and Listens currently registered with the steering program.
	Flows, Listens int
	// ImpairRX and ImpairTX count what the impaired link did.
	ImpairRX, ImpairTX impair.Stats
	// Stack is the Stack's own counters.
	Stack tcp.StackStats
	// Socket is the kernel's counters of the AF_XDP socket.
	Socket xsk.Statistics
}

// Poller runs one tcp.Stack over one AF_XDP socket. Make it with
// NewPoller, run it with Run, reach its Stack with Do; Close after Run
// returned.
type Poller struct {
	cfg      Config
	ifindex  int
	mac      [6]byte
	mtu      int
	steering *bpf.Steering
	ownSteer bool
	umem     *xsk.UMEM
	sock     *xsk.Socket
	nsfd     int // the network namespace Run enters
	eventfd  int
	neigh    *neighbours

	calls        chan call
	asyncMu      sync.Mutex
	async        []func()     // Async functions waiting for the loop
	asyncPending atomic.Int32 // len(async), read without asyncMu
	asyncSpare   []func()     // the loop's: the slice runAsync last emptied
	sleeping     atomic.Bool
	// woken: the eventfd was written since the loop last went to sleep
	// (Wake writes it once per sleep).
	woken atomic.Bool
	// rxStage and txStage impair the link (nil: not impaired); scratch
	// takes a frame out of rxStage.
	rxStage, txStage *impair.Stage
	scratch          []byte
	// in and out are the handoff rings from and to the other pollers of
	// the Group, made before any runs.
	in       []*handoff
	out      map[*Poller]*handoff
	quit     chan struct{} // closed when Run ends or Close runs
	quitOnce sync.Once
	stopReq  atomic.Bool // Run returns at its next turn
	closed   atomic.Bool
	mu       sync.Mutex // guards running against Close
	running  bool
	stopped  chan struct{} // closed when Run returns

	// Owned by the loop.
	stack          *tcp.Stack
	start          time.Time
	rxFree         *xsk.FreeList
	txFree         *xsk.FreeList
	inFlight       uint32 // TX frames submitted and not yet completed
	more           bool   // Output may have more: TX frames or ring ran out
	ipID           uint16
	flows          map[tcp.FourTuple]*flow
	sources        []Source
	listens        map[uint16]*listen
	lastSweep      tcp.Time
	warnedChecksum bool
	stats          Stats
	statsShadow    atomic.Pointer[Stats] // published for Stats from other goroutines
	// received counts the frames taken from the RX ring (one atomic add
	// per batch): Stats.RXFrames when published, FramesReceived live.
	received atomic.Uint64
	// beat is the heartbeat: the number of the turn the loop is in,
	// stored as it starts (one atomic store per turn), read by
	// CheckStall. looping is true while Run is in its loop.
	beat    atomic.Uint64
	looping atomic.Bool

	// The watchdog's (stall.go): its view of the loop, and the stalls
	// it counted.
	watch  stallWatch
	stalls atomic.Uint64
}

type call struct {
	fn   func(s *tcp.Stack, now tcp.Time)
	done chan struct{}
}

// NewPoller checks the interface, creates the UMEM and the AF_XDP socket on
// cfg.Queue, attaches the steering program (unless cfg.Steering is given)
// and puts the socket in its XSKMAP. Call it on an OS thread in the
// interface's network namespace; Run later enters the same namespace.
func NewPoller(cfg Config) (_ *Poller, err error) {
	if cfg.Frames == 0 {
		cfg.Frames = 4096
	}
	if cfg.Frames < 64 || cfg.Frames&(cfg.Frames-1) != 0 {
		return nil, fmt.Errorf("xdpnet: %d frames: want a power of two ≥ 64", cfg.Frames)
	}
	if cfg.Spin == 0 {
		cfg.Spin = defaultSpin
	}
	if cfg.Queue < 0 || cfg.Queue >= bpf.MaxQueues {
		return nil, fmt.Errorf("xdpnet: queue %d out of range 0..%d", cfg.Queue, bpf.MaxQueues-1)
	}
	ifi, err := checkInterface(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.TCP.MTU == 0 {
		cfg.TCP.MTU = ifi.MTU
	}
	if cfg.TCP.Secret == ([16]byte{}) {
		if _, err := rand.Read(cfg.TCP.Secret[:]); err != nil {
			return nil, fmt.Errorf("xdpnet: secret: %w", err)
		}
	}
	stack, err := tcp.NewStack(cfg.TCP)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: %w", err)
	}
	p := &Poller{
		cfg:     cfg,
		ifindex: ifi.Index,
		mac:     [6]byte(ifi.HardwareAddr),
		mtu:     cfg.TCP.MTU,
		nsfd:    -1,
		eventfd: -1,
		calls:   make(chan call, 16),
		quit:    make(chan struct{}),
		stopped: make(chan struct{}),
		stack:   stack,
		flows:   make(map[tcp.FourTuple]*flow),
		listens: make(map[uint16]*listen),
	}
	defer func() {
		if err != nil {
			p.release()
		}
	}()
	p.nsfd, err = unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: open network namespace: %w", err)
	}
	p.eventfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: eventfd: %w", err)
	}
	if p.neigh, err = newNeighbours(ifi.Index); err != nil {
		return nil, err
	}
	p.umem, err = xsk.NewUMEM(xsk.UMEMOptions{FrameSize: frameSize, FrameCount: uint32(cfg.Frames), Name: "xdpnet"})
	if err != nil {
		return nil, fmt.Errorf("xdpnet: %w", err)
	}
	half := uint32(cfg.Frames / 2)
	ring := min(half, xsk.DefaultRingSize)
	p.sock, err = xsk.NewSocket(p.umem, xsk.SocketOptions{
		Ifindex: ifi.Index, QueueID: uint32(cfg.Queue),
		RXSize: ring, TXSize: ring, FillSize: ring, CompletionSize: ring,
	})
	if err != nil {
		return nil, fmt.Errorf("xdpnet: %s queue %d: %w", cfg.Interface, cfg.Queue, err)
	}
	p.rxFree = xsk.NewFreeList(frameSize, 0, half)
	p.txFree = xsk.NewFreeList(frameSize, half, half)
	p.sock.Fill().Refill(p.rxFree, ring)

	if !cfg.ImpairRX.IsZero() {
		p.rxStage, p.scratch = impair.New(cfg.ImpairRX), make([]byte, frameSize)
	}
	if !cfg.ImpairTX.IsZero() {
		p.txStage = impair.New(cfg.ImpairTX)
	}
	if cfg.Group != nil {
		p.start = cfg.Group.start
		cfg.Group.join(p)
	}
	p.steering = cfg.Steering
	if p.steering == nil {
		p.steering, err = bpf.Attach(bpf.Options{Interface: cfg.Interface, Mode: cfg.Mode})
		if err != nil {
			return nil, fmt.Errorf("xdpnet: %w", err)
		}
		p.ownSteer = true
	}
	// checkInterface refused an explicit generic mode on a coalescing
	// interface before anything was attached; here the mode the program
	// runs in is known when it was not asked for (auto, or shared).
	if p.steering.Mode() != cfg.Mode {
		if err := checkCoalescing(cfg.Interface, p.steering.Mode()); err != nil {
			return nil, err
		}
	}
	if err := p.steering.SetSocket(cfg.Queue, p.sock.FD()); err != nil {
		return nil, fmt.Errorf("xdpnet: %w", err)
	}
	return p, nil
}

const (
	// defaultSpin is the longest spin after work. The loop starts at
	// spinMin and grows towards it only under load (see Run): measured on
	// two cores, two daemons and two perftest-style processes, a fixed
	// 50 µs spin made an 8-byte RDMA Write round trip 173 µs (median)
	// against 94 µs with 1 µs, while a fixed 2 µs spin cut a 64 KiB Write
	// stream to a third. Since the poller takes posts and forwards
	// completions itself, a 10 µs minimum catches an application's next
	// post or Read response without a sleep: 8-byte Read round trip
	// 28-30 µs against 68-95 µs with 2 µs, bandwidth unchanged; 25 µs
	// was worse again.
	defaultSpin = 50 * time.Microsecond
	spinMin     = 10 * time.Microsecond
	// yieldHog and the backoffs: see yield.
	yieldHog        = 200 * time.Microsecond
	yieldBackoffMin = 10 * time.Millisecond
	yieldBackoffMax = 2 * time.Second
	quickWake       = 20 * time.Microsecond
)

// offloadWarnAfter is how many segments dropped for their TCP checksum
// make checkOffloads warn: one can be corruption on the wire, a run of
// them is the peer's offloads.
const offloadWarnAfter = 3

// checkOffloads warns, once, when the Stack starts dropping segments for
// their TCP checksum: a veth peer (or any sender) with TX checksum offload,
// TSO or GSO on hands over partial checksums and super-packets, which
// nothing on this path completes. Corruption on a real wire looks the
// same but is rare; a run of them is the offloads.
func (p *Poller) checkOffloads() {
	bad := p.stack.Stats.BadChecksum
	if p.warnedChecksum || bad < offloadWarnAfter || p.cfg.Warn == nil {
		return
	}
	p.warnedChecksum = true
	p.cfg.Warn(fmt.Sprintf("%s queue %d: %d TCP segments dropped for bad checksums: the peer probably sends with offloads on "+
		"(on a veth peer: ethtool -K PEER tx off tso off gso off)", p.cfg.Interface, p.cfg.Queue, bad))
}

// Check says, in words, what makes the interface unusable for cfg, before
// anything is attached to it.
func Check(cfg Config) (*net.Interface, error) { return checkInterface(cfg) }

// checkInterface says, in words, what makes the interface unusable. The
// coalescing check needs the XDP mode: it is made here for an explicit
// ModeGeneric, and by NewPoller once the program is attached otherwise.
func checkInterface(cfg Config) (*net.Interface, error) {
	if !cfg.Addr.Is4() {
		return nil, fmt.Errorf("%w: address %v is not IPv4", ErrInterface, cfg.Addr)
	}
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInterface, cfg.Interface, err)
	}
	if ifi.Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("%w: %s is down", ErrInterface, ifi.Name)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("%w: %s has no Ethernet address", ErrInterface, ifi.Name)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("%w: addresses of %s: %w", ErrInterface, ifi.Name, err)
	}
	found := false
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == cfg.Addr {
				found = true
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("%w: %v is not an address of %s", ErrInterface, cfg.Addr, ifi.Name)
	}
	mtu := ifi.MTU
	if cfg.TCP.MTU > mtu {
		return nil, fmt.Errorf("%w: TCP MTU %d above %s's MTU %d", ErrInterface, cfg.TCP.MTU, ifi.Name, mtu)
	}
	if cfg.TCP.MTU != 0 {
		mtu = cfg.TCP.MTU
	}
	if mtu+header.EthernetLen > frameSize {
		return nil, fmt.Errorf("%w: MTU %d does not fit a %d-octet UMEM frame", ErrInterface, mtu, frameSize)
	}
	// veth runs native XDP only with the peer's MTU ≤ 3506 (a page per
	// frame); the pair's MTUs are normally equal, so check ours here and
	// let bpf.Attach report the kernel's ERANGE otherwise.
	if cfg.Mode == bpf.ModeNative && ifi.MTU > vethNativeMaxMTU && driverName(ifi.Name) == "veth" {
		return nil, fmt.Errorf("%w: native XDP on veth needs MTU ≤ %d, %s has %d",
			ErrInterface, vethNativeMaxMTU, ifi.Name, ifi.MTU)
	}
	if err := checkCoalescing(ifi.Name, cfg.Mode); err != nil {
		return nil, err
	}
	return ifi, nil
}

const vethNativeMaxMTU = 3506

// driverName is the interface's driver (ETHTOOL_GDRVINFO), "" if unknown.
func driverName(ifname string) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, ifname)
	if err != nil {
		return ""
	}
	return unix.ByteSliceToString(info.Driver[:])
}

// CPU is the CPU the loop is pinned to, -1 when not pinned.
func (p *Poller) CPU() int {
	if !p.cfg.Pin {
		return -1
	}
	return p.cfg.CPU
}

// FramesReceived is the number of frames the loop has taken from its RX
// ring, read now (Stats publishes them every 100 ms).
func (p *Poller) FramesReceived() uint64 { return p.received.Load() }

// Steering returns the steering program the Poller uses.
func (p *Poller) Steering() *bpf.Steering { return p.steering }

// Run is the loop. It returns when ctx is done (nil) or the datapath
// fails. It locks its goroutine to an OS thread in the Poller's network
// namespace and leaves that thread locked, so that the thread ends with
// it. Run may be called once.
func (p *Poller) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.closed.Load() || p.running {
		p.mu.Unlock()
		return fmt.Errorf("xdpnet: run: %w", ErrClosed)
	}
	p.running = true
	p.mu.Unlock()
	defer close(p.stopped)
	defer p.quitOnce.Do(func() { close(p.quit) })
	runtime.LockOSThread() // never unlocked: the thread may have changed namespace
	if err := unix.Setns(p.nsfd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("xdpnet: run: enter network namespace: %w", err)
	}
	if p.cfg.Pin {
		var set unix.CPUSet
		set.Set(p.cfg.CPU)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("xdpnet: run: pin to CPU %d: %w", p.cfg.CPU, err)
		}
	}
	stop := context.AfterFunc(ctx, p.requestStop)
	defer stop()
	if p.cfg.Group == nil {
		p.start = time.Now()
	}
	lastWork := p.now()
	// The spin adapts between spinMin and Config.Spin: a sleep that ends
	// soon (work arrives within quickWake) means the loop is under load,
	// and the next spin doubles; a longer one halves it. Under a stream
	// the loop stops paying for sleeping and waking on every ACK; with
	// sparse work it gives the CPU back at once.
	maxSpin := tcp.Time(p.cfg.Spin)
	minSpin := min(tcp.Time(spinMin), maxSpin)
	spin := minSpin
	var y yielding
	p.looping.Store(true)
	defer p.looping.Store(false)
	for {
		if p.stopReq.Load() {
			p.shutdown()
			return nil
		}
		work, err := p.turn()
		if err != nil {
			p.shutdown()
			return err
		}
		now := p.now()
		if work {
			lastWork = now
			continue
		}
		if now-lastWork < spin {
			if now >= y.again {
				p.yield(now, &y)
			}
			continue
		}
		slept, err := p.sleep(now)
		if err != nil {
			p.shutdown()
			return err
		}
		lastWork = p.now()
		if slept {
			p.stats.Slept += time.Duration(lastWork - now)
		}
		if lastWork-now < tcp.Time(quickWake) {
			spin = min(spin*2, maxSpin)
		} else {
			spin = max(spin/2, minSpin)
		}
	}
}

// now is the engine's clock: time since Run started, plus a second so that
// it is never the zero Time.
func (p *Poller) now() tcp.Time { return tcp.Time(time.Since(p.start)) + tcp.Time(time.Second) }

// turn is one round of the loop; it reports whether it found work.
func (p *Poller) turn() (bool, error) {
	p.stats.Turns++
	p.beat.Store(p.stats.Turns)
	work := false
	for range 4 {
		select {
		case c := <-p.calls:
			c.fn(p.stack, p.now())
			// Do callers may read Stats next: publish first.
			p.publishStats()
			close(c.done)
			work = true
			continue
		default:
		}
		break
	}
	// Sources first: a work request posted there kicks its connection
	// through Async, served in this same turn.
	if len(p.sources) > 0 && p.pollSources() {
		work = true
	}
	if p.runAsync() {
		work = true
	}
	if p.receive() {
		work = true
	}
	now := p.now()
	if len(p.in) > 0 && p.receiveHandoffs(now) {
		work = true
	}
	if p.rxStage != nil && p.receiveImpaired(now) {
		work = true
	}
	p.stack.Advance(now)
	sent, err := p.transmit(now)
	if err != nil {
		return work, err
	}
	if sent {
		work = true
	}
	if now-p.lastSweep >= tcp.Time(sweepInterval) {
		p.lastSweep = now
		p.stats.NetlinkEvents += uint64(p.neigh.follow())
		p.sweep(now)
		p.checkOffloads()
		p.publishStats()
	}
	return work, nil
}

// sleep waits in ppoll on the socket and the eventfd until a frame, a call
// or the next timer; slept is false when work came first and it did not
// wait. Run, which reads the clock around it, counts Stats.Slept.
func (p *Poller) sleep(now tcp.Time) (slept bool, err error) {
	d := maxSleep
	if t, ok := p.stack.NextTimer(); ok {
		d = min(d, max(time.Duration(t-now), 0))
	}
	if p.more || p.inFlight > 0 {
		d = min(d, waitCompletion)
	}
	for _, st := range []*impair.Stage{p.rxStage, p.txStage} {
		if st == nil {
			continue
		}
		if t, ok := st.Next(); ok {
			d = min(d, max(t-time.Duration(now), 0))
		}
	}
	if len(p.calls) > 0 || d == 0 {
		return false, nil
	}
	// Async callers and other pollers handing frames over look at
	// sleeping after queueing: either they see it and wake us, or we see
	// their work here. woken goes down first, so that this sleep gets
	// its own wakeup.
	p.woken.Store(false)
	p.sleeping.Store(true)
	defer p.sleeping.Store(false)
	if len(p.sources) > 0 {
		defer p.sourcesAwake()
		if p.sourcesSleeping() {
			return false, nil
		}
	}
	if p.asyncPending.Load() > 0 || p.handedWaiting() {
		return false, nil
	}
	p.stats.Sleeps++
	ts := unix.NsecToTimespec(int64(d))
	fds := [2]unix.PollFd{
		{Fd: int32(p.sock.FD()), Events: unix.POLLIN},
		{Fd: int32(p.eventfd), Events: unix.POLLIN},
	}
	_, err = unix.Ppoll(fds[:], &ts, nil)
	if err != nil && !errors.Is(err, unix.EINTR) {
		return true, fmt.Errorf("xdpnet: ppoll: %w", err)
	}
	if fds[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
		return true, fmt.Errorf("xdpnet: ppoll: socket revents %#x", fds[0].Revents)
	}
	if fds[1].Revents&unix.POLLIN != 0 {
		p.stats.Wakeups++
		var b [8]byte
		_, _ = unix.Read(p.eventfd, b[:])
	}
	return true, nil
}

// yield lets a thread waiting for this CPU run during a spin: the
// application whose next post the spin hopes to catch may need the CPU to
// make it (sched_yield returns at once when nothing waits). A thread that
// does not yield back keeps the CPU for a scheduler slice, milliseconds
// with work waiting here: after such a yield the loop spins without
// yielding for a while, twice as long after each such yield in a row (a
// busy-polling application), from yieldBackoffMin up to yieldBackoffMax.
// y is the loop's state.
func (p *Poller) yield(now tcp.Time, y *yielding) {
	_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	if y.yielded(now, p.now()) {
		p.stats.YieldBackoffs++
	}
}

// yielding is Run's state for yield.
type yielding struct {
	again   tcp.Time // no yield before
	backoff tcp.Time // the last backoff, 0 after a yield that came back soon
}

// yielded records a yield from start to end and reports whether it backs
// off.
func (y *yielding) yielded(start, end tcp.Time) bool {
	if end-start <= tcp.Time(yieldHog) {
		y.backoff = 0
		return false
	}
	y.backoff = min(max(2*y.backoff, tcp.Time(yieldBackoffMin)), tcp.Time(yieldBackoffMax))
	y.again = end + y.backoff
	return true
}

// requestStop makes Run return at its next turn.
func (p *Poller) requestStop() {
	p.stopReq.Store(true)
	p.wake()
}

// wake makes a sleeping loop return from ppoll.
func (p *Poller) wake() {
	var b [8]byte
	b[0] = 1
	_, _ = unix.Write(p.eventfd, b[:])
}

// Wake wakes the loop if it sleeps, at most once per sleep: for work
// queued where sleep looks after setting sleeping (Async, handoff rings),
// or a Source's work that came another way than its doorbell.
func (p *Poller) Wake() {
	if p.sleeping.Load() && !p.woken.Swap(true) {
		p.wake()
	}
}

// Do runs fn on the loop with the Stack and the loop's clock, and waits for
// it. It fails with ErrClosed when the loop has stopped. fn must not keep
// the Stack, and must not block. Do must not be called from the loop
// (from a Handler or from fn).
func (p *Poller) Do(fn func(s *tcp.Stack, now tcp.Time)) error {
	c := call{fn: fn, done: make(chan struct{})}
	select {
	case p.calls <- c:
	case <-p.quit:
		return ErrClosed
	}
	p.wake()
	select {
	case <-c.done:
		return nil
	case <-p.quit:
		// The loop may have run fn just before it stopped.
		select {
		case <-c.done:
			return nil
		default:
		}
		return ErrClosed
	}
}

// Async queues fn to run on the loop and returns at once; the loop is
// woken if it sleeps. Functions run in the order queued; fn must not
// block. Safe from any goroutine, the loop's included. After the loop
// stopped, queued functions never run.
func (p *Poller) Async(fn func()) {
	p.asyncMu.Lock()
	p.async = append(p.async, fn)
	p.asyncPending.Add(1)
	p.asyncMu.Unlock()
	p.Wake()
}

// runAsync runs the functions Async queued; it reports whether there were any.
func (p *Poller) runAsync() bool {
	if p.asyncPending.Load() == 0 {
		return false
	}
	p.asyncMu.Lock()
	fns := p.async
	p.async = p.asyncSpare[:0]
	p.asyncPending.Store(0)
	p.asyncMu.Unlock()
	for i, fn := range fns {
		fn()
		fns[i] = nil
	}
	p.asyncSpare = fns
	return len(fns) > 0
}

// Stats returns the counters as the loop last published them (every
// 100 ms, after each Do, and when Run ends), with the socket's kernel
// counters and Stalls read now.
func (p *Poller) Stats() Stats {
	var st Stats
	if s := p.statsShadow.Load(); s != nil {
		st = *s
	}
	if p.sock != nil && !p.closed.Load() {
		st.Socket, _ = p.sock.Statistics()
	}
	st.Stalls = p.stalls.Load()
	return st
}

func (p *Poller) publishStats() {
	st := p.stats
	st.RXFrames = p.received.Load()
	st.Stack = p.stack.Stats
	st.BadTCPChecksum = p.stack.Stats.BadChecksum
	st.Flows, st.Listens = len(p.flows), len(p.listens)
	if p.rxStage != nil {
		st.ImpairRX = p.rxStage.Stats
	}
	if p.txStage != nil {
		st.ImpairTX = p.txStage.Stats
	}
	p.statsShadow.Store(&st)
}

// shutdown runs on the loop as Run ends: listeners closed, flows and
// listen ports removed from the steering program, reservations released.
// Connections still open are abandoned: their segments then reach the
// kernel, which resets them.
func (p *Poller) shutdown() {
	for port := range p.listens {
		p.closeListener(port)
	}
	for id, f := range p.flows {
		p.removeFlow(id, f)
	}
	p.publishStats()
}

// Close stops Run if it runs and waits for it, then releases the socket,
// the UMEM and, if the Poller attached it, the steering program. Safe to
// call twice.
func (p *Poller) Close() error {
	p.mu.Lock()
	if p.closed.Load() {
		p.mu.Unlock()
		return nil
	}
	p.closed.Store(true)
	running := p.running
	p.mu.Unlock()
	p.requestStop()
	if running {
		<-p.stopped
	}
	p.quitOnce.Do(func() { close(p.quit) })
	return p.release()
}

func (p *Poller) release() error {
	var errs []error
	if p.steering != nil {
		if p.ownSteer {
			errs = append(errs, p.steering.Close())
		} else {
			errs = append(errs, p.steering.ClearSocket(p.cfg.Queue))
		}
	}
	if p.sock != nil {
		errs = append(errs, p.sock.Close())
	}
	if p.umem != nil {
		errs = append(errs, p.umem.Close())
	}
	if p.neigh != nil {
		errs = append(errs, p.neigh.close())
	}
	for _, fd := range []int{p.eventfd, p.nsfd} {
		if fd >= 0 {
			errs = append(errs, unix.Close(fd))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("xdpnet: close: %w", err)
	}
	return nil
}

// RXQueues is the number of receive queues of an interface in the calling
// thread's network namespace (ETHTOOL_GCHANNELS: the rx or combined
// channels), 1 when the driver does not say.
func RXQueues(ifname string) int {
	// struct ethtool_channels: cmd, then max and current rx, tx, other,
	// combined counts.
	ch := [9]uint32{unix.ETHTOOL_GCHANNELS}
	if ethtool(ifname, unsafe.Pointer(&ch)) != nil {
		return 1
	}
	return max(int(ch[5]), int(ch[8]), 1)
}

// ethtool runs one SIOCETHTOOL request on ifname; data points at the
// command's structure, its first word the command.
func ethtool(ifname string, data unsafe.Pointer) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = data
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return errno
	}
	return nil
}

// checkCoalescing refuses generic XDP on an interface that coalesces what
// it receives (GRO or LRO on): generic XDP runs after GRO, so the program
// would see super-packets that no AF_XDP frame holds, and the RNIC's
// connections would stall on drops. Native XDP runs before GRO.
func checkCoalescing(ifname string, mode bpf.Mode) error {
	if mode != bpf.ModeGeneric {
		return nil
	}
	get := func(cmd uint32) (uint32, bool) {
		v := [2]uint32{cmd, 0} // struct ethtool_value
		err := ethtool(ifname, unsafe.Pointer(&v))
		return v[1], err == nil
	}
	const ethFlagLRO = 1 << 15
	if gro, ok := get(unix.ETHTOOL_GGRO); ok && gro != 0 {
		return fmt.Errorf("%w: generic XDP on %s with GRO on: coalesced segments do not fit AF_XDP frames; "+
			"turn it off (ethtool -K %s gro off) or use native XDP", ErrInterface, ifname, ifname)
	}
	if flags, ok := get(unix.ETHTOOL_GFLAGS); ok && flags&ethFlagLRO != 0 {
		return fmt.Errorf("%w: generic XDP on %s with LRO on: coalesced segments do not fit AF_XDP frames; "+
			"turn it off (ethtool -K %s lro off) or use native XDP", ErrInterface, ifname, ifname)
	}
	return nil
}
