package bpf

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/xsk"
)

// The tests below build two hosts (network namespaces A and B joined by a
// veth pair), attach the program to B's end and drive traffic from A. The
// kernel of B is the only receiver: with no AF_XDP socket in the map every
// steered frame falls back to XDP_PASS, which is what lets kernel TCP show
// that nothing is black-holed while the counters show what was classified.

// attachIn attaches the program to host h's veth end from inside its
// namespace and detaches it when the test ends.
func attachIn(t *testing.T, h topology.Host, m Mode) *Steering {
	t.Helper()
	var s *Steering
	err := h.Do(func() error {
		var err error
		s, err = Attach(Options{Interface: h.Link, Mode: m})
		return err
	})
	if err != nil {
		t.Fatalf("attach %v: %v", m, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// xdpState returns the XDP word `ip link show` prints for the host's link
// ("xdp", "xdpgeneric", …), or "" when no program is attached.
func xdpState(t *testing.T, h topology.Host) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", h.Namespace, "link", "show", "dev", h.Link).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show: %v: %s", err, out)
	}
	for _, w := range strings.Fields(string(out)) {
		if strings.HasPrefix(w, "xdp") {
			return w
		}
	}
	return ""
}

func stats(t *testing.T, s *Steering) Stats {
	t.Helper()
	st, err := s.Stats()
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	return st
}

// sub returns b-a field by field.
func sub(b, a Stats) Stats {
	return Stats{
		SteeredFlow:     b.SteeredFlow - a.SteeredFlow,
		SteeredListen:   b.SteeredListen - a.SteeredListen,
		PassedNotIP:     b.PassedNotIP - a.PassedNotIP,
		PassedNotTCP:    b.PassedNotTCP - a.PassedNotTCP,
		PassedNoMatch:   b.PassedNoMatch - a.PassedNoMatch,
		PassedFragment:  b.PassedFragment - a.PassedFragment,
		PassedMalformed: b.PassedMalformed - a.PassedMalformed,
		RedirectFailed:  b.RedirectFailed - a.RedirectFailed,
	}
}

// listen opens a kernel TCP listener in h on an ephemeral port.
func listen(t *testing.T, h topology.Host) net.Listener {
	t.Helper()
	ln, err := h.ListenTCP(netip.AddrPortFrom(h.Addr.Addr(), 0))
	if err != nil {
		t.Fatalf("listen in %s: %v", h.Namespace, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// accept returns the next connection of ln, or fails the test after 5 s.
func accept(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// transfer writes n random bytes on w and reads them back on r, comparing
// digests; both ends have a deadline.
func transfer(t *testing.T, w, r net.Conn, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	w.SetDeadline(deadline)
	r.SetDeadline(deadline)
	data := make([]byte, n)
	rand.Read(data)
	errc := make(chan error, 1)
	go func() {
		_, err := w.Write(data)
		errc <- err
	}()
	got := sha256.New()
	if _, err := io.CopyN(got, r, int64(n)); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write %d bytes: %v", n, err)
	}
	if want := sha256.Sum256(data); !bytes.Equal(got.Sum(nil), want[:]) {
		t.Fatalf("%d bytes arrived corrupted", n)
	}
}

func addrPort(a net.Addr) netip.AddrPort { return a.(*net.TCPAddr).AddrPort() }

// TestSteering attaches the program in each mode and checks that the host's
// own traffic is untouched and the counters classify what the maps select.
func TestSteering(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireTool(t, "ping")
	for _, m := range []Mode{ModeGeneric, ModeNative} {
		t.Run(m.String(), func(t *testing.T) {
			p := topology.NewTest(t, topology.Options{})
			s := attachIn(t, p.B, m)
			if got := s.Mode(); got != m {
				t.Fatalf("Mode() = %v, want %v", got, m)
			}
			want := map[Mode]string{ModeNative: "xdp", ModeGeneric: "xdpgeneric"}[m]
			if got := xdpState(t, p.B); got != want {
				t.Fatalf("ip link shows %q, want %q", got, want)
			}
			bAddr := p.B.Addr.Addr()

			t.Run("ping", func(t *testing.T) {
				before := stats(t, s)
				out, err := p.A.Command("ping", "-c", "3", "-i", "0.2", "-W", "2", bAddr.String()).CombinedOutput()
				if err != nil {
					t.Fatalf("ping A->B with the program attached: %v\n%s", err, out)
				}
				d := sub(stats(t, s), before)
				if d.PassedNotTCP < 3 {
					t.Errorf("PassedNotTCP grew by %d for 3 echo requests: %+v", d.PassedNotTCP, d)
				}
				if d.SteeredFlow+d.SteeredListen != 0 {
					t.Errorf("ICMP was steered: %+v", d)
				}
			})

			t.Run("kernel-tcp", func(t *testing.T) {
				ln := listen(t, p.B)
				before := stats(t, s)
				c, err := p.A.DialTCP(addrPort(ln.Addr()), 5*time.Second)
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				defer c.Close()
				const n = 1 << 20
				transfer(t, c, accept(t, ln), n)
				d := sub(stats(t, s), before)
				// Offloads are off: at most MSS bytes per segment.
				if min := uint64(n / 1500); d.PassedNoMatch < min {
					t.Errorf("PassedNoMatch grew by %d for %d bytes, want ≥ %d: %+v", d.PassedNoMatch, n, min, d)
				}
				if d.SteeredFlow+d.SteeredListen+d.RedirectFailed+d.PassedMalformed != 0 {
					t.Errorf("unowned TCP was steered or judged malformed: %+v", d)
				}
			})

			t.Run("listen", func(t *testing.T) {
				// A port nobody listens on in B: steered SYNs find no
				// socket, pass, and the kernel answers RST at once.
				const port = 18515
				if err := s.AddListen(port); err != nil {
					t.Fatal(err)
				}
				to := netip.AddrPortFrom(bAddr, port)
				before := stats(t, s)
				const dials = 3
				for i := range dials {
					start := time.Now()
					c, err := p.A.DialTCP(to, 3*time.Second)
					if err == nil {
						c.Close()
						t.Fatalf("dial %d to %v connected; nothing listens there", i, to)
					}
					if !errors.Is(err, syscall.ECONNREFUSED) {
						t.Fatalf("dial %d to %v: %v, want connection refused (RST from B's kernel)", i, to, err)
					}
					if el := time.Since(start); el > time.Second {
						t.Errorf("dial %d refused only after %v: the SYN was not passed at once", i, el)
					}
				}
				d := sub(stats(t, s), before)
				if d.SteeredListen != dials || d.RedirectFailed != dials {
					t.Errorf("after %d SYNs to a listen port with no socket: SteeredListen +%d, RedirectFailed +%d, want +%d each (%+v)",
						dials, d.SteeredListen, d.RedirectFailed, dials, d)
				}

				if err := s.RemoveListen(port); err != nil {
					t.Fatal(err)
				}
				if err := s.RemoveListen(port); !errors.Is(err, ErrNotFound) {
					t.Errorf("second RemoveListen: %v, want ErrNotFound", err)
				}
				before = stats(t, s)
				if c, err := p.A.DialTCP(to, 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
					if c != nil {
						c.Close()
					}
					t.Fatalf("dial after RemoveListen: %v, want connection refused", err)
				}
				if d := sub(stats(t, s), before); d.SteeredListen != 0 || d.PassedNoMatch != 1 {
					t.Errorf("SYN after RemoveListen: %+v, want one PassedNoMatch", d)
				}
			})

			t.Run("flow", func(t *testing.T) {
				ln := listen(t, p.B)
				c, err := p.A.DialTCP(addrPort(ln.Addr()), 5*time.Second)
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				defer c.Close()
				srv := accept(t, ln)
				// Named from B, the receiver: Local is B's end.
				f := Flow{Local: addrPort(srv.LocalAddr()), Remote: addrPort(srv.RemoteAddr())}
				if err := s.AddFlow(f); err != nil {
					t.Fatal(err)
				}

				const n = 64 << 10
				before := stats(t, s)
				transfer(t, c, srv, n)
				d := sub(stats(t, s), before)
				if min := uint64(n / 1500); d.SteeredFlow < min || d.RedirectFailed != d.SteeredFlow {
					t.Errorf("flow %v, %d bytes A->B: SteeredFlow +%d (want ≥ %d), RedirectFailed +%d (want the same): %+v",
						f, n, d.SteeredFlow, min, d.RedirectFailed, d)
				}
				if d.PassedNoMatch != 0 {
					t.Errorf("segments of a flow in the map passed unmatched: %+v", d)
				}

				if err := s.RemoveFlow(f); err != nil {
					t.Fatal(err)
				}
				if err := s.RemoveFlow(f); !errors.Is(err, ErrNotFound) {
					t.Errorf("second RemoveFlow: %v, want ErrNotFound", err)
				}
				before = stats(t, s)
				transfer(t, c, srv, n)
				if d := sub(stats(t, s), before); d.SteeredFlow != 0 || d.PassedNoMatch < n/1500 {
					t.Errorf("after RemoveFlow: %+v, want only PassedNoMatch", d)
				}
			})

			t.Run("socket", func(t *testing.T) {
				testSocket(t, p, s)
			})

			t.Run("close", func(t *testing.T) {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				if got := xdpState(t, p.B); got != "" {
					t.Errorf("after Close ip link still shows %q", got)
				}
				if err := s.AddListen(1); !errors.Is(err, ErrClosed) {
					t.Errorf("AddListen after Close: %v, want ErrClosed", err)
				}
				if _, err := s.Stats(); !errors.Is(err, ErrClosed) {
					t.Errorf("Stats after Close: %v, want ErrClosed", err)
				}
				out, err := p.A.Command("ping", "-c", "1", "-W", "2", bAddr.String()).CombinedOutput()
				if err != nil {
					t.Errorf("ping after Close: %v\n%s", err, out)
				}
			})
		})
	}
}

// newXSKSocket binds an AF_XDP socket to queue of h's link, in copy mode,
// over a UMEM of 16 frames. Nothing is put on its fill ring, so every
// frame redirected to it is dropped and counted in RXDropped: enough to
// tell that the redirect reached the socket.
//
// The UMEM is plain memory until the first socket over it registers it
// with the kernel, so only the lookup of the interface and the socket are
// made inside h's namespace.
func newXSKSocket(h topology.Host, queue int) (*xsk.Socket, error) {
	u, err := xsk.NewUMEM(xsk.UMEMOptions{FrameCount: 16, Name: "bpf-test"})
	if err != nil {
		return nil, err
	}
	var x *xsk.Socket
	err = h.Do(func() error {
		ifi, err := net.InterfaceByName(h.Link)
		if err != nil {
			return err
		}
		x, err = xsk.NewSocket(u, xsk.SocketOptions{Ifindex: ifi.Index, QueueID: uint32(queue), Mode: xsk.ModeCopy})
		return err
	})
	if err != nil {
		u.Close()
		return nil, err
	}
	return x, nil
}

// testSocket puts an AF_XDP socket into the map and checks that a steered
// SYN reaches it instead of the kernel, and goes back to the kernel once the
// socket is cleared.
func testSocket(t *testing.T, p *topology.Pair, s *Steering) {
	const port = 18516
	if err := s.AddListen(port); err != nil {
		t.Fatal(err)
	}
	defer s.RemoveListen(port)
	to := netip.AddrPortFrom(p.B.Addr.Addr(), port)

	// Only an AF_XDP socket goes into the map.
	notXSK, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = s.SetSocket(0, notXSK)
	unix.Close(notXSK)
	if err == nil {
		t.Fatal("SetSocket accepted a UDP socket")
	}
	if err := s.SetSocket(MaxQueues, 0); err == nil {
		t.Errorf("SetSocket accepted queue %d", MaxQueues)
	}

	x, err := newXSKSocket(p.B, 0)
	if err != nil {
		t.Fatalf("AF_XDP socket: %v", err)
	}
	defer closeXSK(x)
	if err := s.SetSocket(0, x.FD()); err != nil {
		t.Fatal(err)
	}
	before, xBefore := stats(t, s), mustXSKStats(t, x)
	// The SYN lands in the socket (and is dropped there for want of fill
	// ring entries): no RST comes back, the dial times out.
	if c, err := p.A.DialTCP(to, 300*time.Millisecond); err == nil || errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial with an AF_XDP socket on the queue: %v, want a timeout (the SYN went to the socket)", err)
	}
	d, xAfter := sub(stats(t, s), before), mustXSKStats(t, x)
	if d.SteeredListen < 1 || d.RedirectFailed != 0 {
		t.Errorf("SYN with a socket on the queue: %+v, want SteeredListen ≥ 1 and no RedirectFailed", d)
	}
	if got := xAfter.RXDropped - xBefore.RXDropped; got < d.SteeredListen {
		t.Errorf("socket rx_dropped +%d for %d steered SYNs: the redirect did not reach the socket", got, d.SteeredListen)
	}

	if err := s.ClearSocket(0); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearSocket(0); err != nil {
		t.Errorf("second ClearSocket: %v", err)
	}
	before = stats(t, s)
	if c, err := p.A.DialTCP(to, 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial after ClearSocket: %v, want connection refused", err)
	}
	if d := sub(stats(t, s), before); d.SteeredListen != 1 || d.RedirectFailed != 1 {
		t.Errorf("SYN after ClearSocket: %+v, want SteeredListen and RedirectFailed +1", d)
	}
}

func mustXSKStats(t *testing.T, x *xsk.Socket) xsk.Statistics {
	t.Helper()
	st, err := x.Statistics()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func closeXSK(x *xsk.Socket) {
	u := x.UMEM()
	x.Close()
	u.Close()
}

// TestAttachModes checks ModeAuto and the error of a mode the interface
// refuses: native XDP on veth needs the MTU ≤ 3506.
func TestAttachModes(t *testing.T) {
	t.Run("auto", func(t *testing.T) {
		p := topology.NewTest(t, topology.Options{})
		if got := attachIn(t, p.B, ModeAuto).Mode(); got != ModeNative {
			t.Errorf("ModeAuto on veth, MTU 1500: attached %v, want native", got)
		}
	})
	t.Run("mtu-too-large", func(t *testing.T) {
		p := topology.NewTest(t, topology.Options{MTU: 9000})
		err := p.B.Do(func() error {
			s, err := Attach(Options{Interface: p.B.Link, Mode: ModeNative})
			if err == nil {
				s.Close()
			}
			return err
		})
		if !errors.Is(err, ErrModeNotSupported) {
			t.Fatalf("native XDP on veth with MTU 9000: %v, want ErrModeNotSupported", err)
		}
		t.Logf("native, MTU 9000: %v", err)
		if got := attachIn(t, p.B, ModeAuto).Mode(); got != ModeGeneric {
			t.Errorf("ModeAuto with MTU 9000: attached %v, want the generic fallback", got)
		}
	})
}

func TestAttachNoInterface(t *testing.T) {
	_, err := Attach(Options{Interface: "srn-no-such0"})
	if !errors.Is(err, ErrNoInterface) {
		t.Errorf("Attach to a missing interface: %v, want ErrNoInterface", err)
	}
	_, err = Attach(Options{})
	if !errors.Is(err, ErrNoInterface) {
		t.Errorf("Attach with no interface: %v, want ErrNoInterface", err)
	}
}

// helperEnv names the interface the child process of TestLinkDiesWithProcess
// attaches to; set, it turns the test binary into that child (see TestMain).
const helperEnv = "SOFTRNIC_BPF_HELPER_LINK"

// unprivilegedEnv names the interface the child process of
// TestAttachNotRoot tries to attach to, without privileges.
const unprivilegedEnv = "SOFTRNIC_BPF_UNPRIVILEGED_LINK"

func TestMain(m *testing.M) {
	if link := os.Getenv(helperEnv); link != "" {
		attachAndWait(link)
	}
	if link := os.Getenv(unprivilegedEnv); link != "" {
		attachUnprivileged(link)
	}
	os.Exit(m.Run())
}

// attachAndWait is the child process of TestLinkDiesWithProcess, run by the
// parent inside a namespace: it attaches, says so on stdout and waits to be
// killed.
func attachAndWait(link string) {
	s, err := Attach(Options{Interface: link, Mode: ModeGeneric})
	if err != nil {
		fmt.Printf("attach failed: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("attached")
	time.Sleep(30 * time.Second) // the parent kills us long before
	s.Close()
	fmt.Println("not killed")
	os.Exit(1)
}

// attachUnprivileged is the child process of TestAttachNotRoot: it prints
// the error of Attach and exits 0 when that error is ErrPermission.
func attachUnprivileged(link string) {
	s, err := Attach(Options{Interface: link, Mode: ModeGeneric})
	if err == nil {
		s.Close()
		fmt.Println("attached without privileges")
		os.Exit(1)
	}
	fmt.Println(err)
	if !errors.Is(err, ErrPermission) {
		os.Exit(1)
	}
	os.Exit(0)
}

// TestAttachNotRoot runs the test binary as nobody inside a test namespace
// (so that a bug could at worst touch the test's own veth) and checks that
// Attach says it needs privileges.
func TestAttachNotRoot(t *testing.T) {
	p := topology.NewTest(t, topology.Options{})
	setpriv := testenv.RequireTool(t, "setpriv")
	// nobody must be able to execute the binary: copy it out of the
	// go build cache's private directory.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bpf.test")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := p.B.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin)
	cmd.Env = append(os.Environ(), unprivilegedEnv+"="+p.B.Link)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("Attach as nobody: %v\n%s(want an error wrapping ErrPermission)", err, out)
	}
	t.Logf("as nobody: %s", strings.TrimSpace(string(out)))
	if got := xdpState(t, p.B); got != "" {
		t.Errorf("ip link shows %q after an unprivileged Attach", got)
	}
}

// TestLinkDiesWithProcess checks the point of attaching with a BPF link: a
// daemon that dies, even by SIGKILL, leaves no program behind.
func TestLinkDiesWithProcess(t *testing.T) {
	p := topology.NewTest(t, topology.Options{})
	cmd := p.B.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+p.B.Link)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	lines, done := make(chan string), make(chan struct{})
	defer close(done)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-done:
				return
			}
		}
	}()
	timeout := time.After(30 * time.Second)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("child exited before attaching")
			}
			if l == "attached" {
				break wait
			}
			if strings.HasPrefix(l, "attach failed") {
				t.Fatalf("child: %s", l)
			}
		case <-timeout:
			t.Fatal("child did not attach within 30 s")
		}
	}
	if got := xdpState(t, p.B); got != "xdpgeneric" {
		t.Fatalf("child attached, but ip link shows %q", got)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = true
	for range lines { // until the pipe closes: the child is gone
	}
	cmd.Wait()

	// The link is released when the dead process's files are; allow the
	// kernel a moment.
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := xdpState(t, p.B)
		if got == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after SIGKILL of the attaching process ip link still shows %q", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
