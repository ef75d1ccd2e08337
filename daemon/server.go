// Package daemon is softrnicd: it owns the RNIC device of one interface
// and serves DAT-style verbs to applications over a Unix SOCK_SEQPACKET
// socket (package ctl), with work requests and events in shared-memory
// rings (package internal/shm).
//
// Goroutines: the Server's accept loop; the accept loop of its
// IB-connection port, which matches the connections of QPs connected the
// InfiniBand way to the QPs waiting for them (ibconn.go, which has its
// goroutines and lock); per session, a control loop that
// reads requests and answers them in order, an event loop (events.go) that
// applies connection events and sees to what the data path hands it, and a
// doorbell reader for the client's "room in an event ring" wake-ups. The
// data path does not pass through the session (sources.go): on the xdp
// datapath an EP's rings and a DTO EVD are sources of their QP's pinned
// poller (ringSource, evdSource; the client's doorbell for the rings is
// the poller's); on the kernel datapath an EP's rings have a goroutine of
// their own asleep on the EP's doorbell (ringLoop), posts are sent from
// there by the QP's connection, and completions are forwarded to the event
// rings by whichever goroutine made them (the QP's Completed hook: its
// receive goroutine, the ring loop), while the receive goroutine polls the
// send ring for a moment after delivering (the QP's Poll hook). See rnic's
// package comment for the life of a Write on each. Connection setup runs
// in short-lived goroutines whose results, like the engine's connection
// events, are queued for the session's event loop (a connect still running
// when the session ends is cancelled). The QP's receive goroutine (or its
// poller) also takes the client's queued receives before the engine reads
// what arrived (takeQueuedRecvs). An EP's ringMu makes its rings'
// consumers one at a time, an EVD's its ring's producers. Lock order:
// session.mu, then an EP's ringMu, then an EVD's ringMu or any QP's. One
// watchdog goroutine per Server looks at the xdp pollers and the sessions'
// event loops once a second and logs the stacks of all goroutines when one
// has had work without progress for 5 s (stall.go). A session that
// registered process memory (RegisterProcessMemory) has one more, which
// waits on the runtime's poller for its process's pidfd and marks the
// memory dead when the process exits (internal/procmem); the session's end
// stops it.
package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/xdpnet"
)

// Options configure a daemon.
type Options struct {
	// Iface is the network interface the RNIC serves.
	Iface string
	// Datapath: "kernel" (MPA over kernel TCP) or "xdp".
	Datapath string
	// Socket is the control socket's path; default /run/softrnic/IFACE.sock.
	Socket string
	// Pollers is the number of completion vectors offered; on the xdp
	// datapath, the number of pollers (0: one per receive queue, at
	// most one per CPU), each pinned to its CPU.
	Pollers int
	// XDPMode is the XDP attach mode on the xdp datapath: "auto" (the
	// default: native where the driver has it), "native" or "generic".
	XDPMode string
	// CPUs the xdp pollers are pinned to, in turn (default: poller i on
	// CPU i).
	CPUs []int
	// NAPI is where the kernel runs the interface's receive work on the
	// xdp datapath: "auto" (the default), "adaptive", "threaded",
	// "softirq" or "keep" (xdpnet.NAPIMode).
	NAPI string
	// Impair degrades the xdp datapath's link in both directions, in
	// process (impair.Parse's syntax): for tests on kernels without
	// sch_netem.
	Impair string
	Logger *slog.Logger
	// IBConnPort is the TCP port on which the daemon takes the
	// connections of QPs connected the InfiniBand way (ctl.ConnectQP,
	// ibconn.go), and to which it connects them on the peer's host: one
	// port for all the daemons of a network. 0: DefaultIBConnPort; -1:
	// none (ConnectQP is refused).
	IBConnPort int
	// IBConnTimeout bounds an InfiniBand-style connection's setup from
	// its RTR: the passive side's wait for the peer's connection, the
	// active side's tries (default DefaultIBConnTimeout).
	IBConnTimeout time.Duration
	// IBConnParkTimeout bounds how long a connection request waits for
	// the RTR of the QP it names (default DefaultIBConnParkTimeout).
	IBConnParkTimeout time.Duration
	// StallAfter is how long a loop (an xdp poller, a session's poll
	// loop) may have work without making progress before the watchdog
	// logs it as stalled and counts it (default 5 s).
	StallAfter time.Duration
}

// shutdownGrace bounds the graceful close of connections at Close: a
// peer that does not answer our FIN within it is reset, so that SIGTERM
// ends the daemon within 2 s whatever its peers do.
const shutdownGrace = time.Second

// Errors at start.
var (
	ErrNoInterface = errors.New("daemon: no such interface")
	ErrNoAddress   = errors.New("daemon: interface has no usable IPv4 address")
	ErrSocketInUse = errors.New("daemon: control socket in use by a live daemon")
	ErrDatapath    = errors.New("daemon: datapath not available")
)

// Server is a running daemon.
type Server struct {
	opts Options
	log  *slog.Logger
	addr netip.Addr
	dev  *rnic.Device
	ln   *net.UnixListener
	// cpus is IAAttr.DatapathCPUs.
	cpus []byte
	// ports are the ports sessions reserved (port.go).
	ports portTable
	// ib takes InfiniBand-style connections (ibconn.go); nil when off.
	ib *ibListener
	// watch finds stalled loops, trim gives memory back after a wave of
	// connections (trim.go); they run from New to Close.
	watch *watchdog
	trim  *trimmer

	mu       sync.Mutex
	sessions map[*session]struct{}
	nextSess uint32
	closed   bool
	loops    sync.WaitGroup
	// stopped is closed when Close has finished, for Serve to return
	// only then: a daemon whose main returns with Serve must not exit
	// before its connections are closed and its device released.
	stopped chan struct{}

	// short limits the log of requests that ran out of resources, ended
	// the log of connections that ended on their own.
	short, ended logLimit
}

// logLimit lets a log line through at most burst times a second and
// counts the ones it held back, for the next line to say.
type logLimit struct {
	mu     sync.Mutex
	window time.Time
	n      int
	quiet  int64
}

// allow reports whether a line may be logged now, and how many were held
// back since the last one was.
func (l *logLimit) allow(burst int) (bool, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Sub(l.window) >= time.Second {
		l.window, l.n = now, 0
	}
	if l.n >= burst {
		l.quiet++
		return false, 0
	}
	l.n++
	q := l.quiet
	l.quiet = 0
	return true, q
}

// logResources logs a request that ran out of resources (a descriptor
// limit, a full region): the operator must hear of it, the client has its
// INSUFFICIENT_RESOURCES. A client retrying at the limit logs once a
// second, with the count of those not logged.
func (s *Server) logResources(sess *session, op ctl.Op, msg string) {
	if ok, quiet := s.short.allow(1); ok {
		s.log.Warn("out of resources", "session", sess.id, "pid", sess.cred.Pid, "op", op.String(), "err", msg, "since_last_logged", quiet)
	}
}

// New checks the options, opens the device and listens on the control
// socket (mode 0660; a stale socket file is replaced).
func New(opts Options) (*Server, error) {
	if opts.Datapath == "" {
		opts.Datapath = "kernel"
	}
	var mode bpf.Mode
	switch opts.XDPMode {
	case "", "auto":
	case "native":
		mode = bpf.ModeNative
	case "generic":
		mode = bpf.ModeGeneric
	default:
		return nil, fmt.Errorf("%w: unknown XDP mode %q (auto, native or generic)", ErrDatapath, opts.XDPMode)
	}
	napi := xdpnet.NAPIAuto
	if opts.NAPI != "" {
		m, err := xdpnet.ParseNAPIMode(opts.NAPI)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrDatapath, err)
		}
		napi = m
	}
	switch opts.Datapath {
	case "kernel", "xdp":
	default:
		return nil, fmt.Errorf("%w: unknown datapath %q (kernel or xdp)", ErrDatapath, opts.Datapath)
	}
	if opts.Socket == "" {
		opts.Socket = ctl.DefaultSocket(opts.Iface)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	addr, err := interfaceAddr(opts.Iface)
	if err != nil {
		return nil, err
	}
	imp, err := impair.Parse(opts.Impair)
	if err != nil {
		return nil, err
	}
	if !imp.IsZero() && opts.Datapath != "xdp" {
		return nil, fmt.Errorf("%w: impairments need the xdp datapath", ErrDatapath)
	}
	var dev *rnic.Device
	if opts.Datapath == "xdp" {
		itx := imp
		itx.Seed += 1 << 32
		dev, err = rnic.OpenXDP(rnic.XDPOptions{Interface: opts.Iface, Addr: addr, Mode: mode, Pollers: opts.Pollers, Pin: true, CPUs: opts.CPUs,
			NAPI: napi, ImpairRX: imp, ImpairTX: itx, Warn: func(msg string) { opts.Logger.Warn(msg) }})
		if err != nil {
			return nil, fmt.Errorf("%w: xdp: %v", ErrDatapath, err)
		}
		opts.Pollers = len(dev.Pollers())
	} else {
		dev = rnic.Open()
		dev.SetWarn(func(msg string) { opts.Logger.Warn(msg) })
		if opts.Pollers <= 0 {
			opts.Pollers = runtime.NumCPU()
		}
	}
	ln, err := listenControl(opts.Socket)
	if err != nil {
		dev.Close()
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, addr: addr, dev: dev, ln: ln, sessions: map[*session]struct{}{}, stopped: make(chan struct{}),
		cpus: datapathCPUs(dev.Pollers())}
	s.watch = startWatchdog(s.log, opts.StallAfter, dev.Pollers())
	s.trim = startTrimmer(s.log)
	s.ib = s.startIB()
	s.log.Info("softrnicd ready", "iface", opts.Iface, "addr", addr, "datapath", opts.Datapath, "pollers", opts.Pollers, "socket", opts.Socket, "ib_port", s.ib.portOrNone())
	return s, nil
}

// Addr is the IP address the RNIC uses.
func (s *Server) Addr() netip.Addr { return s.addr }

func interfaceAddr(name string) (netip.Addr, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: %q: %v", ErrNoInterface, name, err)
	}
	if ifi.Flags&net.FlagUp == 0 {
		return netip.Addr{}, fmt.Errorf("%w: %q is down", ErrNoAddress, name)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: %q: %v", ErrNoAddress, name, err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: %q", ErrNoAddress, name)
}

// listenControl creates the control socket. A socket file nobody answers on
// is stale and replaced; one a daemon answers on is refused. The socket is
// made under a temporary name and renamed into place once it listens with
// its final mode: a client that waits for the file to appear (scripts,
// tests) finds it answering, never refusing the connection in the moment
// between bind and listen.
func listenControl(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("daemon: socket directory: %w", err)
	}
	if _, err := os.Stat(path); err == nil {
		c, err := net.DialTimeout("unixpacket", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s", ErrSocketInUse, path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("daemon: remove stale socket %s: %w", path, err)
		}
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	_ = os.Remove(tmp)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	if err != nil {
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
			return nil, fmt.Errorf("daemon: insufficient privileges for %s: %w", path, err)
		}
		return nil, fmt.Errorf("daemon: listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false) // its name is path's now: Server.Close removes that
	if err := os.Chmod(tmp, 0o660); err != nil {
		ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("daemon: chmod %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("daemon: listen on %s: %w", path, err)
	}
	return ln, nil
}

// Serve accepts sessions until Close, and returns once Close has finished.
func (s *Server) Serve() error {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				<-s.stopped
				return nil
			}
			s.log.Warn("accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		cred, err := peerCred(c)
		if err != nil {
			s.log.Warn("session without credentials", "err", err)
			c.Close()
			continue
		}
		pidfd := peerPidfd(c, cred)
		// Each request then says which process sent it (mayBind).
		if err := passCred(c); err != nil {
			s.log.Warn("session without SO_PASSCRED: privileged ports refused", "pid", cred.Pid, "err", err)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			closePidfd(pidfd)
			<-s.stopped
			return nil
		}
		s.nextSess++
		sess, err := newSession(s, c, s.nextSess, cred, pidfd)
		if err != nil {
			s.mu.Unlock()
			s.log.Warn("session", "err", err)
			c.Close()
			closePidfd(pidfd)
			continue
		}
		s.sessions[sess] = struct{}{}
		s.loops.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.loops.Done()
			sess.run()
			s.mu.Lock()
			delete(s.sessions, sess)
			s.mu.Unlock()
		}()
	}
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, cerr
}

// passCred sets SO_PASSCRED on c: the kernel attaches the sender's
// credentials to every message received after.
func passCred(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }); err != nil {
		return err
	}
	return serr
}

// peerPidfd is a pidfd of the process that connected c, as cred names it,
// nil if there is none (it is in another PID namespace, or gone): what the
// session's process memory is opened by (session.process), so that it is
// never the memory of a process that was given the PID after the client's
// exited (a fork child may hold the socket on). SO_PEERPIDFD (Linux 6.5)
// names the process that connected; before it, pidfd_open of cred's PID at
// accept leaves a window as short as the accept's wait: a process that
// exits before the daemon accepts its connection, and whose PID is given
// to another process of its user meanwhile.
func peerPidfd(c *net.UnixConn, cred *unix.Ucred) *os.File {
	if cred.Pid <= 0 {
		return nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	fd, gerr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, gerr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD) }); err != nil {
		return nil
	}
	if errors.Is(gerr, unix.ENOPROTOOPT) {
		fd, gerr = unix.PidfdOpen(int(cred.Pid), 0)
	}
	if gerr != nil || fd < 0 {
		return nil
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", cred.Pid))
}

func closePidfd(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}

// Close stops accepting, ends every session (their connections are closed,
// their objects freed) and removes the socket.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sessions := make([]*session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	_ = os.Remove(s.opts.Socket) // before Serve can return
	err := s.ln.Close()
	s.ib.close()
	// Connections end gracefully (FIN, not RST) when they can, within a
	// bound; then the sessions end and free everything.
	deadline := time.Now().Add(shutdownGrace)
	for _, sess := range sessions {
		sess.disconnectAll()
	}
	for _, sess := range sessions {
		sess.waitDisconnected(deadline)
		sess.conn.Close()
	}
	s.loops.Wait()
	// The watchdog runs until the loops have ended: a shutdown that
	// hangs on one is logged too.
	s.watch.stop()
	s.trim.stop()
	s.dev.Close()
	s.log.Info("softrnicd stopped")
	close(s.stopped)
	return err
}

// Counts are the live objects over all sessions, for tests and operators.
func (s *Server) Counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{"sessions": len(s.sessions)}
	for sess := range s.sessions {
		for k, v := range sess.counts() {
			out[k] += v
		}
	}
	return out
}
