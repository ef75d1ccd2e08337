// Package topology builds the project's test network: two hosts, each a network
// namespace, joined by one veth pair. Tests use it through NewTest, which tears
// everything down when the test ends, failed or not; hack/topology.sh gives
// people the same network from the shell.
//
// The hosts are made with iproute2 and ethtool (the commands an operator would
// type), so a failure reads the way it would at a shell. Go code runs inside a
// host through Host.Do, which moves one locked OS thread into the namespace;
// programs run inside it through Host.Command.
package topology

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/testenv"
)

// Options describe the pair of hosts. The zero value is the default topology:
// 192.0.2.1/24 and 192.0.2.2/24 (RFC 5737 documentation range), MTU 1500, one
// queue, offloads off.
type Options struct {
	// Prefix starts the namespace names; a unique suffix is appended so that
	// parallel tests and processes never collide. Default "srn".
	Prefix string
	// AddrA and AddrB are the addresses of the two veth ends.
	AddrA, AddrB netip.Prefix
	// MTU of both veth ends. Native XDP on veth needs an MTU of at most 3506.
	MTU int
	// Queues is the number of receive and transmit queues of each veth end.
	Queues int
	// Offloads leaves TX checksum offload, TSO and GSO on. Off by default:
	// with them on, frames carry partial checksums and super-packets.
	Offloads bool
	// NoLink makes the two namespaces with their loopback only, no veth
	// pair: the caller links them (TunBridge does, through itself).
	NoLink bool
}

func (o *Options) setDefaults() {
	if o.Prefix == "" {
		o.Prefix = "srn"
	}
	if !o.AddrA.IsValid() {
		o.AddrA = netip.MustParsePrefix("192.0.2.1/24")
	}
	if !o.AddrB.IsValid() {
		o.AddrB = netip.MustParsePrefix("192.0.2.2/24")
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	if o.Queues == 0 {
		o.Queues = 1
	}
}

// Host is one end of the pair: a network namespace with one veth interface.
type Host struct {
	// Namespace is the name of the network namespace (see `ip netns list`).
	Namespace string
	// Link is the name of the veth interface inside the namespace.
	Link string
	// Addr is the interface address with its prefix length.
	Addr netip.Prefix
}

// Pair is two hosts joined by a veth pair.
type Pair struct {
	A, B Host
	opts Options
}

var seq atomic.Uint32

// New creates the two namespaces, the veth pair between them, addresses, MTU,
// queues and offload settings. On error nothing is left behind.
func New(opts Options) (_ *Pair, err error) {
	opts.setDefaults()
	if opts.Queues < 1 || opts.Queues > 64 {
		return nil, fmt.Errorf("topology: queues %d out of range 1..64", opts.Queues)
	}
	if opts.AddrA.Addr().Is4() != opts.AddrB.Addr().Is4() {
		return nil, errors.New("topology: addresses of different families")
	}
	id := fmt.Sprintf("%s%d-%d", opts.Prefix, os.Getpid(), seq.Add(1))
	p := &Pair{
		A:    Host{Namespace: id + "a", Link: "veth-a", Addr: opts.AddrA},
		B:    Host{Namespace: id + "b", Link: "veth-b", Addr: opts.AddrB},
		opts: opts,
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
		}
	}()
	for _, h := range []Host{p.A, p.B} {
		if err := run("ip", "netns", "add", h.Namespace); err != nil {
			return nil, err
		}
	}
	if opts.NoLink {
		p.A.Link, p.B.Link = "", ""
		for _, h := range []Host{p.A, p.B} {
			if err := run("ip", "-n", h.Namespace, "link", "set", "lo", "up"); err != nil {
				return nil, err
			}
		}
		return p, nil
	}
	q := strconv.Itoa(opts.Queues)
	if err := run("ip", "link", "add", p.A.Link, "netns", p.A.Namespace,
		"numtxqueues", q, "numrxqueues", q, "type", "veth",
		"peer", "name", p.B.Link, "netns", p.B.Namespace,
		"numtxqueues", q, "numrxqueues", q); err != nil {
		return nil, err
	}
	for _, h := range []Host{p.A, p.B} {
		steps := [][]string{
			{"ip", "-n", h.Namespace, "link", "set", "lo", "up"},
			{"ip", "-n", h.Namespace, "link", "set", h.Link, "mtu", strconv.Itoa(opts.MTU)},
			{"ip", "-n", h.Namespace, "addr", "add", h.Addr.String(), "dev", h.Link},
			{"ip", "-n", h.Namespace, "link", "set", h.Link, "up"},
		}
		if !opts.Offloads {
			steps = append(steps, []string{"ip", "netns", "exec", h.Namespace,
				"ethtool", "-K", h.Link, "tx", "off", "tso", "off", "gso", "off"})
		}
		for _, s := range steps {
			if err := run(s[0], s[1:]...); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// NewTest is New for a test: it stops the test (skip outside CI, fail in CI)
// when the host cannot make namespaces, and removes the pair when the test ends.
func NewTest(t testing.TB, opts Options) *Pair {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireTool(t, "ip")
	if !opts.Offloads {
		testenv.RequireTool(t, "ethtool")
	}
	p, err := New(opts)
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("topology cleanup: %v", err)
		}
	})
	return p
}

// Close kills every process still running in either namespace and deletes the
// namespaces, which removes the veth pair with them. It is safe to call twice.
func (p *Pair) Close() error {
	var errs []error
	for _, h := range []Host{p.A, p.B} {
		if !exists(h.Namespace) {
			continue
		}
		h.killAll()
		if err := run("ip", "netns", "del", h.Namespace); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killAll sends SIGKILL to every process in the namespace and waits briefly for
// them to go, so that deleting the namespace does not leave them behind.
func (h Host) killAll() {
	deadline := time.Now().Add(2 * time.Second)
	for {
		out, err := exec.Command("ip", "netns", "pids", h.Namespace).Output()
		if err != nil {
			return
		}
		others := 0
		for _, s := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(s); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				others++
			}
		}
		// A thread of this process may be in the namespace: it is not
		// ours to kill, nor to wait for.
		if others == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Command returns a command that runs inside the host's namespace.
func (h Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.Namespace, name}, args...)...)
}

// Interface returns the host's veth interface as seen inside its namespace:
// its index and hardware address are those the namespace knows it by.
func (h Host) Interface() (*net.Interface, error) {
	var ifi *net.Interface
	err := h.Do(func() (err error) {
		ifi, err = net.InterfaceByName(h.Link)
		return err
	})
	return ifi, err
}

// ListenTCP opens a kernel TCP listener on addr in the host's namespace.
// The listener is IPv4 only ("tcp4"): addr must be an IPv4 address or the
// unspecified one.
func (h Host) ListenTCP(addr netip.AddrPort) (*net.TCPListener, error) {
	return h.ListenTCPWith(addr, nil)
}

// ListenTCPWith is ListenTCP with control run on the socket before it
// binds (socket options: SO_RCVBUF, TCP_CONGESTION; see
// net.ListenConfig.Control). Accepted sockets inherit what it set.
func (h Host) ListenTCPWith(addr netip.AddrPort, control func(network, address string, c syscall.RawConn) error) (*net.TCPListener, error) {
	var ln *net.TCPListener
	err := h.Do(func() error {
		lc := net.ListenConfig{Control: control}
		l, err := lc.Listen(context.Background(), "tcp4", addr.String())
		if err == nil {
			ln = l.(*net.TCPListener)
		}
		return err
	})
	return ln, err
}

// DialTCP connects from the host's namespace to addr with the kernel's TCP,
// over IPv4 ("tcp4"): addr must be an IPv4 address.
func (h Host) DialTCP(addr netip.AddrPort, timeout time.Duration) (*net.TCPConn, error) {
	return h.DialTCPWith(addr, timeout, nil)
}

// DialTCPWith is DialTCP with control run on the socket before it
// connects (see net.Dialer.Control).
func (h Host) DialTCPWith(addr netip.AddrPort, timeout time.Duration, control func(network, address string, c syscall.RawConn) error) (*net.TCPConn, error) {
	var c *net.TCPConn
	err := h.Do(func() error {
		d := net.Dialer{Timeout: timeout, Control: control}
		conn, err := d.Dial("tcp4", addr.String())
		if err == nil {
			c = conn.(*net.TCPConn)
		}
		return err
	})
	return c, err
}

// Do runs fn on an OS thread that has entered the host's network namespace.
// Sockets that fn opens belong to the namespace and stay there after Do
// returns; goroutines that fn starts do not run in the namespace.
func (h Host) Do(fn func() error) error {
	target, err := unix.Open("/run/netns/"+h.Namespace, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("topology: open namespace %s: %w", h.Namespace, err)
	}
	defer unix.Close(target)

	errc := make(chan error, 1)
	// A fresh goroutine, so a thread that cannot be restored dies with it.
	go func() {
		runtime.LockOSThread()
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		orig, err := unix.Open(self, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("topology: open own namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("topology: enter namespace %s: %w", h.Namespace, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it exits with this goroutine
			// instead of running other goroutines in the wrong namespace.
			errc <- errors.Join(ferr, fmt.Errorf("topology: leave namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func exists(ns string) bool {
	_, err := os.Stat("/run/netns/" + ns)
	return err == nil
}

func run(name string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()))
	}
	return nil
}
