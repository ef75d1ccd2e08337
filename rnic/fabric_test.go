package rnic

import (
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"testing"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/topology"
)

// The behaviour matrix of the device (every operation, every remote error
// class, every MPA variant, the connection manager's outcomes) runs on both
// LLPs a QP can have (issue 15). A test asks onBothDatapaths for a fabric
// per datapath and takes its hosts, its listen address and the address to
// connect to from it, so the same assertions meet both:
//
//   - "kernel": two devices from Open in the test's own namespace, over
//     loopback (kernelConn);
//   - "xdp": two network namespaces joined by a veth pair
//     (topology.NewTest), one device from OpenXDP in each, opened on a
//     thread in its namespace (engineConn). The server is host B, the
//     client host A. It needs root, namespaces, iproute2 and ethtool:
//     outside CI the subtest is skipped saying what is missing, in CI
//     (CI=true) it fails.
//
// The xdp fabric is made once per test and its two devices serve every
// hosts call, so a test that connects many times (a case per MPA variant
// or error class) pays for one topology and two devices; each hosts call
// still has a PD and CQs of its own, so no case sees another's
// completions.

// datapaths are the subtests' names, one per LLP.
var datapaths = []string{"kernel", "xdp"}

// firstPort is the xdp fabric's first listening port (the iWARP port).
const firstPort = 4791

// fabric is where a test's server and client hosts run on one datapath.
type fabric struct {
	datapath string
	// tp, srvDev and cliDev are the xdp fabric's (nil on the kernel
	// datapath): the namespaces and one device in each.
	tp             *topology.Pair
	srvDev, cliDev *Device
	// port is the next port listenAddr gives on xdp: the engine listener
	// takes no port 0, and a Listen on a fresh port never meets a
	// connection an earlier listener of the test left closing.
	port int
}

// onBothDatapaths runs fn as subtests "kernel" and "xdp", each with its
// fabric.
func onBothDatapaths(t *testing.T, fn func(t *testing.T, f *fabric)) {
	t.Helper()
	for _, dp := range datapaths {
		t.Run(dp, func(t *testing.T) { fn(t, newFabric(t, dp)) })
	}
}

// newFabric makes the fabric of datapath dp for t; it is torn down when t
// ends.
func newFabric(t *testing.T, dp string) *fabric {
	t.Helper()
	f := &fabric{datapath: dp, port: firstPort}
	switch dp {
	case "kernel":
	case "xdp":
		// topology.NewTest stops the test (skip, or fail in CI) when
		// root or a tool is missing.
		f.tp = topology.NewTest(t, topology.Options{})
		// One poller each, on CPUs of their own where there are two:
		// the devices' pollers do not spin on one CPU.
		f.srvDev = newXDPSide(t, f.tp.B, XDPOptions{Mode: bpf.ModeNative, Pollers: 1, CPUs: []int{0}}).dev
		f.cliDev = newXDPSide(t, f.tp.A, XDPOptions{Mode: bpf.ModeNative, Pollers: 1, CPUs: []int{1 % runtime.NumCPU()}}).dev
	default:
		t.Fatalf("unknown datapath %q", dp)
	}
	return f
}

// hosts returns a server and a client host, each with a PD and CQs of its
// own (vector 0), for t. On the kernel datapath each is a new device; on
// xdp they are the fabric's devices, B's and A's.
func (f *fabric) hosts(t testing.TB) (srv, cli *host) {
	t.Helper()
	if f.tp == nil {
		return newHost(t), newHost(t)
	}
	return hostOn(t, f.srvDev), hostOn(t, f.cliDev)
}

// hostOn is a host with a new PD and CQs on an existing device, which
// outlives it.
func hostOn(t testing.TB, d *Device) *host {
	t.Helper()
	h := &host{t: t, dev: d}
	var err error
	h.pd, err = d.AllocPD()
	must(t, err)
	h.scq, err = d.CreateCQ(4096, 0)
	must(t, err)
	h.rcq, err = d.CreateCQ(4096, 0)
	must(t, err)
	return h
}

// listenAddr is the address for the server's next Listen: loopback with
// port 0 on the kernel datapath, host B's address with a port no earlier
// Listen of the fabric used on xdp.
func (f *fabric) listenAddr() string {
	if f.tp == nil {
		return "127.0.0.1:0"
	}
	f.port++
	return net.JoinHostPort(f.tp.B.Addr.Addr().String(), strconv.Itoa(f.port-1))
}

// connectAddr is the address a client connects to to reach ln.
func (f *fabric) connectAddr(ln *Listener) string { return ln.Addr().String() }

// listen starts a device listener of the server's on listenAddr; it is
// closed when t ends.
func (f *fabric) listen(t testing.TB, srv *host, opts ListenOptions) *Listener {
	t.Helper()
	ln, err := srv.dev.Listen(f.listenAddr(), opts)
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

// listenTCP opens a plain kernel TCP listener where the server host is
// (loopback, or host B's address): a peer that is not an RNIC. Flows to it
// are not the RNIC's, so on xdp B's steering program passes them to B's
// kernel. It is closed when t ends.
func (f *fabric) listenTCP(t testing.TB) *net.TCPListener {
	t.Helper()
	var ln *net.TCPListener
	if f.tp == nil {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		must(t, err)
		ln = l.(*net.TCPListener)
	} else {
		var err error
		ln, err = f.tp.B.ListenTCP(netip.AddrPortFrom(f.tp.B.Addr.Addr(), 0))
		must(t, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// pair connects a client QP of cli to a server QP of srv across the
// fabric, as pair does over loopback.
func (f *fabric) pair(t testing.TB, srv, cli *host, sattr, cattr QPAttr, prep func(s, c *QP)) (s, c *QP) {
	t.Helper()
	return pairAt(t, f.listenAddr(), srv, cli, sattr, cattr, prep)
}
