package xdpnet

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// NAPIMode says where the kernel runs the receive work of the interface
// the RNIC serves: the NAPI poll that takes each frame the peer sent, runs
// the XDP program and copies the frame into an AF_XDP socket.
//
// On veth that work normally runs in the softirq of the sender's
// transmit, so a host streaming into a veth pays for its peer's receive as
// well as its own send, on its own CPU, while the receiving poller waits
// for work. Threaded NAPI (/sys/class/net/IFACE/threaded) runs it in a
// kernel thread the scheduler can put on the other CPU instead: measured
// on two cores and MTU 1500, a 64 KiB RDMA Write stream went from 3.8 to
// 5.1 Gbit/s, and the ceiling of bare copy-mode AF_XDP (BenchmarkXSKRx in
// package xsk) from 3.8 to 7-9.4. But waking that thread for each frame of
// a sparse exchange tripled the 8-byte Write round trip (21 µs to 67 µs).
// NAPIAdaptive therefore turns threading on only while the interface
// receives a stream and off again when it stops, as a NIC's adaptive
// interrupt moderation trades latency for rate.
type NAPIMode int

const (
	// NAPIAuto, the default: NAPIAdaptive on veth, where the figures
	// above were measured, NAPIKeep on other drivers, whose receive
	// work runs where their interrupts are steered.
	NAPIAuto NAPIMode = iota
	// NAPIAdaptive: threaded while the pollers receive at least
	// napiOnRate frames per second, not threaded once they receive less
	// than napiOffRate.
	NAPIAdaptive
	// NAPIThreaded: always threaded.
	NAPIThreaded
	// NAPISoftirq: never threaded.
	NAPISoftirq
	// NAPIKeep: the interface's setting is left alone.
	NAPIKeep
)

var napiModeNames = map[NAPIMode]string{
	NAPIAuto: "auto", NAPIAdaptive: "adaptive", NAPIThreaded: "threaded", NAPISoftirq: "softirq", NAPIKeep: "keep",
}

func (m NAPIMode) String() string {
	if s, ok := napiModeNames[m]; ok {
		return s
	}
	return fmt.Sprintf("NAPIMode(%d)", int(m))
}

// ParseNAPIMode parses a mode by its String name.
func ParseNAPIMode(s string) (NAPIMode, error) {
	for m, name := range napiModeNames {
		if s == name {
			return m, nil
		}
	}
	return 0, fmt.Errorf("xdpnet: NAPI mode %q: want auto, adaptive, threaded, softirq or keep", s)
}

// The adaptive policy. A sample is the frames received in napiSample; the
// interface turns threaded after napiOnSamples samples in a row at or
// above napiOnRate, and back after napiOffSamples in a row below
// napiOffRate. An 8-byte ping-pong receives some 50,000 frames a second
// per host (15,000 while threaded), a 64 KiB Write stream over 300,000
// (data on one side, ACKs on the other). Going back is quick because the
// exchange that suffers from threading is short: make bench's 3000-round
// write_lat, started right after a stream, ran entirely within a 200 ms
// wait and measured 76 µs instead of 21.
const (
	napiSample     = 20 * time.Millisecond
	napiOnRate     = 150_000
	napiOffRate    = 100_000
	napiOnSamples  = 3
	napiOffSamples = 2
)

// ErrNAPI: the interface's NAPI threading cannot be read or set here.
var ErrNAPI = errors.New("xdpnet: NAPI threading not settable")

// NAPIControl applies a NAPIMode to an interface. Make it with StartNAPI
// once the XDP program is attached (veth has no NAPI instances to thread
// before); Close restores the setting the interface had.
//
// In NAPIAdaptive one goroutine samples the receive counter it was given
// and writes the sysfs file when the policy says; nothing runs on the
// pollers but the counter's atomic adds.
type NAPIControl struct {
	file     *os.File
	original []byte
	mode     NAPIMode
	frames   func() uint64
	quit     chan struct{}
	done     chan struct{}
	mu       sync.Mutex // guards threaded and switches against Close
	threaded bool
	switches int
	closed   bool
}

// StartNAPI applies mode to the interface ifname, whose index is ifindex,
// in the calling thread's network namespace. frames returns the frames the
// interface's pollers have received so far (NAPIAdaptive samples it). The
// setting is /sys/class/net/IFACE/threaded of the calling thread's network
// namespace (see openThreaded); when it cannot be opened, or the kernel
// refuses, the error wraps ErrNAPI. NAPIKeep touches
// nothing and returns a NAPIControl that does nothing; NAPIAuto becomes
// NAPIAdaptive or NAPIKeep by the interface's driver.
func StartNAPI(ifname string, ifindex int, mode NAPIMode, frames func() uint64) (*NAPIControl, error) {
	if mode == NAPIAuto {
		mode = NAPIKeep
		if driverName(ifname) == "veth" {
			mode = NAPIAdaptive
		}
	}
	c := &NAPIControl{mode: mode, frames: frames}
	switch {
	case mode == NAPIKeep:
		return c, nil
	case mode == NAPIAdaptive && frames == nil:
		return nil, errors.New("xdpnet: adaptive NAPI needs a frame counter")
	case mode < NAPIAuto || mode > NAPIKeep:
		return nil, fmt.Errorf("xdpnet: %v", mode)
	}
	var err error
	c.file, err = openThreaded(ifname, ifindex)
	if err != nil {
		return nil, err
	}
	c.original, err = c.read()
	if err == nil {
		err = c.set(mode == NAPIThreaded)
	}
	if err != nil {
		c.file.Close()
		return nil, err
	}
	if mode == NAPIAdaptive {
		c.quit, c.done = make(chan struct{}), make(chan struct{})
		go c.adapt()
	}
	return c, nil
}

func (c *NAPIControl) read() ([]byte, error) {
	b := make([]byte, 16)
	n, err := c.file.ReadAt(b, 0)
	if n == 0 {
		return nil, fmt.Errorf("%w: read %s: %v", ErrNAPI, c.file.Name(), err)
	}
	return bytes.TrimSpace(b[:n]), nil
}

func (c *NAPIControl) write(v []byte) error {
	if _, err := c.file.WriteAt(v, 0); err != nil {
		return fmt.Errorf("%w: write %q to %s: %v", ErrNAPI, v, c.file.Name(), err)
	}
	return nil
}

// set turns threading on or off; the caller holds mu or owns c alone.
func (c *NAPIControl) set(on bool) error {
	v := []byte("0")
	if on {
		v = []byte("1")
	}
	if err := c.write(v); err != nil {
		return err
	}
	if on != c.threaded {
		c.switches++
	}
	c.threaded = on
	return nil
}

// adapt is NAPIAdaptive's goroutine.
func (c *NAPIControl) adapt() {
	defer close(c.done)
	t := time.NewTicker(napiSample)
	defer t.Stop()
	p := napiPolicy{last: c.frames(), at: time.Now()}
	for {
		select {
		case <-c.quit:
			return
		case now := <-t.C:
			want, change := p.sample(c.frames(), now)
			if !change {
				continue
			}
			c.mu.Lock()
			if !c.closed {
				// A refusal leaves the setting as it was; the
				// policy asks again at its next change.
				_ = c.set(want)
			}
			c.mu.Unlock()
		}
	}
}

// napiPolicy is NAPIAdaptive's decision, apart from the clock and sysfs.
type napiPolicy struct {
	last     uint64
	at       time.Time
	threaded bool
	run      int // samples in a row that argue for a change
}

// sample takes the counter's value at now and says whether threading
// should change, and to what.
func (p *napiPolicy) sample(frames uint64, now time.Time) (threaded, change bool) {
	d := now.Sub(p.at)
	if d <= 0 {
		return p.threaded, false
	}
	rate := float64(frames-p.last) / d.Seconds()
	p.last, p.at = frames, now
	argues := rate >= napiOnRate
	if p.threaded {
		argues = rate < napiOffRate
	}
	if argues {
		p.run++
	} else {
		p.run = 0
	}
	need := napiOnSamples
	if p.threaded {
		need = napiOffSamples
	}
	if p.run < need {
		return p.threaded, false
	}
	p.threaded, p.run = !p.threaded, 0
	return p.threaded, true
}

// Threaded reports whether the interface's NAPI is threaded now, and how
// many times this NAPIControl switched it.
func (c *NAPIControl) Threaded() (threaded bool, switches int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.threaded, c.switches
}

// Mode is the mode applied (never NAPIAuto).
func (c *NAPIControl) Mode() NAPIMode { return c.mode }

// Close stops the adaptive goroutine and restores the interface's original
// setting. Safe to call twice.
func (c *NAPIControl) Close() error {
	c.mu.Lock()
	if c.closed || c.file == nil {
		c.closed = true
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if c.quit != nil {
		close(c.quit)
		<-c.done
	}
	err := c.write(c.original)
	if cerr := c.file.Close(); err == nil {
		err = cerr
	}
	return err
}

// openThreaded opens the interface's sysfs "threaded" file. /sys shows the
// network namespace of whoever mounted it: the right one under ip netns
// exec, which mounts a sysfs of the namespace, but not in a process that
// entered the namespace otherwise (nsenter, a test's thread). When
// /sys/class/net has no interface of that name and index, the file is
// opened through a sysfs mounted for the calling thread's namespace on a
// thread of its own, in a mount namespace of its own, which ends with the
// thread; the file stays open.
func openThreaded(ifname string, ifindex int) (*os.File, error) {
	name := "/sys/class/net/" + ifname + "/threaded"
	if sysfsHas(ifname, ifindex) {
		f, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNAPI, err)
		}
		return f, nil
	}
	netns, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open network namespace: %v", ErrNAPI, err)
	}
	defer unix.Close(netns)
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result, 1)
	go offMainThread(func() error {
		// Never unlocked: the thread's mount namespace is private, so
		// the thread ends with this goroutine.
		runtime.LockOSThread()
		f, err := func() (*os.File, error) {
			if err := unix.Setns(netns, unix.CLONE_NEWNET); err != nil {
				return nil, fmt.Errorf("enter network namespace: %v", err)
			}
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return nil, fmt.Errorf("unshare mount namespace: %v", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
				return nil, fmt.Errorf("make / a slave mount: %v", err)
			}
			if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
				return nil, fmt.Errorf("mount sysfs: %v", err)
			}
			if !sysfsHas(ifname, ifindex) {
				return nil, fmt.Errorf("no interface %s with index %d in this namespace's sysfs", ifname, ifindex)
			}
			return os.OpenFile(name, os.O_RDWR, 0)
		}()
		done <- result{f, err}
		return nil
	})
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNAPI, name, r.err)
	}
	return r.f, nil
}

// sysfsHas reports whether /sys/class/net, as this thread sees it, has the
// interface with that name and index.
func sysfsHas(ifname string, ifindex int) bool {
	b, err := os.ReadFile("/sys/class/net/" + ifname + "/ifindex")
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	return err == nil && n == ifindex
}
