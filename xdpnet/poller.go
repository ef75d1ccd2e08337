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
// steering program and the kernel sockets that reserve the listen ports.
// The local ports of its active connections are in a port table (ports.go)
// that the pollers of a Group share under a mutex, since a flow may move
// between them.
//
// Other goroutines reach the loop through the calls of calls.go. Do runs
// a function on the loop and waits for it: the call goes on a bounded
// channel and an eventfd of the loop's own wakes the loop if it sleeps.
// Listen, CloseListener, Connect, Dial, Move, AddSource and RemoveSource
// are Do calls. Async queues a function and returns at once. Handlers run
// on the loop and must not call Do (it would wait for itself); they may
// call Async. A Source (an application's rings in shared memory) is polled
// by the loop itself, and its producer rings the Doorbell, a second
// eventfd the loop sleeps on, only when the loop sleeps. The two are apart
// because a doorbell leaves the process: every epoll instance that watches
// one of its descriptors (a Go program's runtime watches every
// non-blocking descriptor it wraps in an os.File) sits on the eventfd's
// wait queue, which each write and read walks. With a doorbell per
// endpoint that made each wake-up cost as many callbacks as there were
// endpoints: measured with 3,000 QPs, a third of the daemon's CPU went to
// eventfd writes, and every connection set up or torn down paid for all
// the others. The pollers of a Group hand each other the frames of flows
// they do not own through single-producer rings (group.go). The package
// itself starts goroutines only in napi.go (StartNAPI, and NAPIControl in
// adaptive mode).
//
// One turn of the loop (loop.go): take Do calls; poll the Sources and run
// the Async functions; drain up to a batch of the RX ring (Ethernet → IPv4
// header and checksum → Stack.Input) and refill the fill ring, then the
// frames other pollers handed over; fire due timers (Stack.Advance);
// recycle completed TX frames; drain Stack.Output into TX frames (Ethernet
// and IPv4 headers in front, the destination MAC from the neighbour cache)
// and kick the kernel when the TX ring asks for it; every sweepInterval,
// follow the kernel's neighbour and route changes, sweep the flows and
// publish the Stats. While a turn finds work, and for a spin after the
// last that did (adapting up to Config.Spin), the loop goes round again at
// once; then it sleeps in ppoll(2) on the socket and the eventfds until a
// frame arrives, a call comes, or the next TCP timer is due. A 2-core host
// cannot afford blind busy-polling: the kernel's softirq and the
// applications need the core.
//
// # Files
//
// poller.go: Config, NewPoller, Close. loop.go: Run, the turn, sleeping
// and spinning. calls.go: what other goroutines call. datapath.go: frames
// between the rings and the Stack. ports.go: steering and port
// reservations. limits.go: errors that name the host's limits. neigh.go: neighbours and routes. group.go: the pollers of
// one interface. interface.go: what makes an interface usable. stats.go:
// the counters. stall.go: the watchdog's side. napi.go: the kernel's NAPI
// threading. The ethtool requests are internal/ethtool's.
//
// # Steering and ports
//
// Listen reserves the port by binding (not listening) a kernel TCP socket
// to Config.Addr and the port, then listens on the Stack and adds the port
// to the steering program's listen map. A SYN steered to a listened port
// gets its 4-tuple added to the flow map before the Stack sees it, so the
// rest of the handshake is steered too; passive connections hold no
// descriptor of their own. Connect takes a local port from the port table
// (one kernel socket bound to port 0, kept bound, per port however many
// connections to different remote ends share it: see portTable), adds the
// flow, then connects the Stack from that port. A flow whose connection
// has left the Stack (after TIME-WAIT, a reset or an abort) is removed
// from the map and its port released by the sweep, which every
// sweepInterval (100 ms) looks at a bounded share of the flows; a passive
// flow whose connection never appeared (a SYN answered with a cookie and
// no ACK) goes after synGrace. Connections must be opened through the
// Poller's methods, not Stack.Listen or Stack.Connect directly, or none of
// this happens. When a limit of the host stops a Listen or a Connect
// (descriptors, local ports, the flow table, kernel memory) the error
// wraps ErrResources and names the limit.
//
// # Neighbours
//
// The destination MAC of a segment is the kernel's neighbour entry for its
// destination, read with an RTM_GETNEIGH netlink request and cached for
// neighbourTTL (neigh.go, on github.com/vishvananda/netlink). When the
// kernel has none, the poller sends an empty UDP datagram to the peer's
// discard port from a kernel socket, which makes the kernel resolve it
// (its ARP replies are not TCP, so the steering program passes them to the
// kernel), and drops the segment: TCP retransmits it. Connect resolves
// before it sends the SYN. A peer off the link is reached through the
// gateway of the kernel's route to it (RTM_GETROUTE); a peer the kernel
// routes through another interface is refused. Changes are followed: a
// netlink socket subscribed to neighbour and route notifications is
// drained every sweep, and what changed is read again at its next use
// (everything is read again after neighbourTTL anyway).
//
// # Offloads
//
// Frames received from a peer that has TX checksum offload or TSO/GSO on
// carry partial checksums and super-packets (on veth, the other end's
// features). The Stack drops the segments with bad checksums; Stats counts
// them (BadTCPChecksum, BadIPChecksum), and a transfer that stalls with
// those counters rising means the peer's offloads must go off
// (`ethtool -K <peer> tx off tso off gso off`); Config.Warn is told once.
// Generic XDP runs after GRO and would see coalesced super-packets: Check
// and NewPoller refuse it on an interface with GRO or LRO on.
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
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
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
	// ErrGone: the connection to move is no longer there.
	ErrGone = errors.New("xdpnet: connection gone")
	// ErrResources: a limit of the host stopped the call — descriptors,
	// kernel memory, local ports, the steering program's flow table; the
	// error names the limit (see resourceErr).
	ErrResources = errors.New("xdpnet: out of resources")
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
	// ConnStallAfter is how long a connection may wait on the wire with
	// nothing acknowledged or received before Warn is told of it with
	// its state (default 10 s; see checkConn).
	ConnStallAfter time.Duration
	// Group, when not nil, is the group of pollers of the interface this
	// one joins (see Group).
	Group *Group
}

// frameSize is the size of a UMEM frame.
const frameSize = 4096

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
	// eventfd wakes the loop for Do, Async, Wake and frames handed
	// over; it never leaves the Poller. doorbell is the eventfd whose
	// descriptors Doorbell hands out.
	eventfd  int
	doorbell int
	neigh    *neighbours

	calls chan call
	// callsQueued counts Do calls queued or about to be, for the loop
	// to see before it sleeps (sleep) what it would otherwise need an
	// eventfd write for.
	callsQueued  atomic.Int32
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
	stack     *tcp.Stack
	start     time.Time
	rxFree    *xsk.FreeList
	txFree    *xsk.FreeList
	inFlight  uint32 // TX frames submitted and not yet completed
	more      bool   // Output may have more: TX frames or ring ran out
	ipID      uint16
	flows     map[tcp.FourTuple]*flow
	flowsMost int     // flows' high-water mark (shrink)
	flowList  []*flow // the flows, in sweep's order
	sweepAt   int     // where the next sweep starts in flowList
	ports     *portTable
	sources   []Source
	listens   map[uint16]*listen
	// held are the flows being taken over from the kernel (Hold):
	// steered here, their segments kept until Import.
	held           map[tcp.FourTuple]*heldFlow
	lastSweep      tcp.Time
	warnedChecksum bool
	// limitWarned is when warnLimit last warned, limitDrops what it
	// counted since.
	limitWarned tcp.Time
	limitDrops  int
	stats       Stats
	statsShadow atomic.Pointer[Stats] // published for Stats from other goroutines
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
		cfg:      cfg,
		ifindex:  ifi.Index,
		mac:      [6]byte(ifi.HardwareAddr),
		mtu:      cfg.TCP.MTU,
		nsfd:     -1,
		eventfd:  -1,
		doorbell: -1,
		calls:    make(chan call, 16),
		quit:     make(chan struct{}),
		stopped:  make(chan struct{}),
		stack:    stack,
		flows:    make(map[tcp.FourTuple]*flow),
		listens:  make(map[uint16]*listen),
		held:     make(map[tcp.FourTuple]*heldFlow),
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
		return nil, fmt.Errorf("xdpnet: eventfd: %w", resourceErr(err))
	}
	// Non-blocking as the wake eventfd: a client that drains it between
	// the loop's ppoll and its read must not block the loop.
	p.doorbell, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: doorbell eventfd: %w", resourceErr(err))
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
	} else {
		p.ports = newPortTable(cfg.Addr)
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

// CPU is the CPU the loop is pinned to, -1 when not pinned.
func (p *Poller) CPU() int {
	if !p.cfg.Pin {
		return -1
	}
	return p.cfg.CPU
}

// Steering returns the steering program the Poller uses.
func (p *Poller) Steering() *bpf.Steering { return p.steering }

// Name says which poller this is, for logs: interface, queue and CPU.
func (p *Poller) Name() string {
	if p.cfg.Pin {
		return fmt.Sprintf("xdp poller %s queue %d (CPU %d)", p.cfg.Interface, p.cfg.Queue, p.cfg.CPU)
	}
	return fmt.Sprintf("xdp poller %s queue %d", p.cfg.Interface, p.cfg.Queue)
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
		p.neigh.close()
	}
	// A Group's table is released by its pollers' shutdowns, flow by
	// flow; a table of the Poller's own goes whole.
	if p.ports != nil && p.cfg.Group == nil {
		p.ports.closeAll()
	}
	for _, fd := range []int{p.eventfd, p.doorbell, p.nsfd} {
		if fd >= 0 {
			errs = append(errs, unix.Close(fd))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("xdpnet: close: %w", err)
	}
	return nil
}
