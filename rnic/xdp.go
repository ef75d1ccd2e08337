package rnic

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// XDPOptions configure a device on the accelerated datapath: softrnic's
// TCP engine on AF_XDP sockets, one poller per receive queue, with the XDP
// steering program sending it the RNIC's flows.
type XDPOptions struct {
	// Interface and Addr: the interface served and its IPv4 address.
	Interface string
	Addr      netip.Addr
	// Mode of the XDP program: auto (native where the driver has it),
	// native or generic.
	Mode bpf.Mode
	// Pollers is the number of pollers, each owning one receive queue
	// (queue i for poller i); 0 means one per receive queue of the
	// interface, at most one per CPU.
	Pollers int
	// Pin pins poller i to CPUs[i mod len(CPUs)], or with no CPUs to
	// CPU i modulo the number of CPUs.
	Pin  bool
	CPUs []int
	// TCP configures every poller's Stack.
	TCP tcp.Options
	// ImpairRX and ImpairTX degrade every poller's link in process (see
	// xdpnet.Config); each poller draws from its own seed.
	ImpairRX, ImpairTX impair.Config
	// Warn receives the pollers' warnings about the link (see
	// xdpnet.Config.Warn).
	Warn func(msg string)
	// Spin is how long a poller keeps polling after its last work
	// (xdpnet's default when 0).
	Spin time.Duration
	// NAPI says where the kernel runs the interface's receive work
	// (xdpnet.NAPIMode; the zero value is xdpnet.NAPIAuto).
	NAPI xdpnet.NAPIMode
}

// xdpPath is the accelerated datapath of a device.
type xdpPath struct {
	steering *bpf.Steering
	pollers  []*xdpnet.Poller
	napi     *xdpnet.NAPIControl
	cancel   context.CancelFunc
	runs     sync.WaitGroup
	addr     netip.Addr
}

// OpenXDP returns a device whose QPs run on the accelerated datapath.
// Call it on a thread in the interface's network namespace. It attaches
// the steering program, opens one AF_XDP socket per poller and starts the
// pollers; Close stops them and detaches the program.
func OpenXDP(o XDPOptions) (_ *Device, err error) {
	queues := xdpnet.RXQueues(o.Interface)
	if o.Pollers <= 0 {
		o.Pollers = min(queues, runtime.NumCPU())
	}
	if o.Pollers > queues {
		return nil, fmt.Errorf("rnic: %d pollers but %s has %d receive queues: %w", o.Pollers, o.Interface, queues, ErrInvalidParam)
	}
	x := &xdpPath{addr: o.Addr}
	group := xdpnet.NewGroup()
	defer func() {
		if err != nil {
			x.close()
		}
	}()
	// The interface checks (address, MTU, native XDP limits) come first,
	// with the messages xdpnet gives; then the program is attached once
	// and shared.
	ifi, err := xdpnet.Check(xdpnet.Config{Interface: o.Interface, Addr: o.Addr, Mode: o.Mode, TCP: o.TCP})
	if err != nil {
		return nil, err
	}
	x.steering, err = bpf.Attach(bpf.Options{Interface: o.Interface, Mode: o.Mode})
	if err != nil {
		return nil, err
	}
	cpu := func(i int) int {
		if len(o.CPUs) > 0 {
			return o.CPUs[i%len(o.CPUs)]
		}
		return i % runtime.NumCPU()
	}
	for i := range o.Pollers {
		irx, itx := o.ImpairRX, o.ImpairTX
		irx.Seed, itx.Seed = irx.Seed+uint64(2*i), itx.Seed+uint64(2*i+1)
		p, err := xdpnet.NewPoller(xdpnet.Config{Interface: o.Interface, Queue: i, Addr: o.Addr, Steering: x.steering,
			Group: group, TCP: o.TCP, Pin: o.Pin, CPU: cpu(i), Spin: o.Spin,
			ImpairRX: irx, ImpairTX: itx, Warn: o.Warn})
		if err != nil {
			return nil, err
		}
		x.pollers = append(x.pollers, p)
	}
	// After the program is attached: veth has no NAPI to thread before.
	x.napi, err = xdpnet.StartNAPI(o.Interface, ifi.Index, o.NAPI, x.framesReceived)
	if errors.Is(err, xdpnet.ErrNAPI) && o.NAPI == xdpnet.NAPIAuto {
		if o.Warn != nil {
			o.Warn(fmt.Sprintf("NAPI threading left as it is: %v", err))
		}
		x.napi, err = xdpnet.StartNAPI(o.Interface, ifi.Index, xdpnet.NAPIKeep, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("rnic: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	for i, p := range x.pollers {
		x.runs.Add(1)
		go func() {
			defer x.runs.Done()
			// A poller whose datapath fails (its socket or the
			// interface gone) is the operator's business.
			if err := p.Run(ctx); err != nil && o.Warn != nil {
				o.Warn(fmt.Sprintf("poller of queue %d stopped: %v", i, err))
			}
		}()
	}
	d := Open()
	d.xdp = x
	if o.Warn != nil {
		d.SetWarn(o.Warn)
	}
	return d, nil
}

func (x *xdpPath) close() {
	if x.cancel != nil {
		x.cancel()
		x.runs.Wait()
	}
	// The NAPI setting goes back while the program still holds veth's
	// NAPI instances.
	if x.napi != nil {
		_ = x.napi.Close()
	}
	for _, p := range x.pollers {
		_ = p.Close()
	}
	if x.steering != nil {
		_ = x.steering.Close()
	}
}

// framesReceived is what the pollers have taken from their RX rings.
func (x *xdpPath) framesReceived() uint64 {
	var n uint64
	for _, p := range x.pollers {
		n += p.FramesReceived()
	}
	return n
}

// poller is the poller of a completion vector.
func (x *xdpPath) poller(vector int) *xdpnet.Poller {
	return x.pollers[vector%len(x.pollers)]
}

// Poller is the poller the QP runs on, its CQs' (seed 004); nil on the
// kernel datapath.
func (q *QP) Poller() *xdpnet.Poller { return q.dev.Poller(q.Vector()) }

// Poller is the poller of a completion vector; nil on the kernel datapath.
func (d *Device) Poller(vector int) *xdpnet.Poller {
	if d.xdp == nil {
		return nil
	}
	return d.xdp.poller(vector)
}

// Pollers returns the accelerated datapath's pollers, nil on the kernel
// datapath.
func (d *Device) Pollers() []*xdpnet.Poller {
	if d.xdp == nil {
		return nil
	}
	return d.xdp.pollers
}
