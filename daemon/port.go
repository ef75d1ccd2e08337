package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ctl"
)

// reservation is a port a session holds (ctl.ReservePort): in the
// daemon's table of reserved ports, and bound on the host by a TCP socket
// of the daemon's, in the daemon's network namespace, so that the host's
// own programs and its port 0 choices keep off it too.
type reservation struct {
	port uint16
	fd   int // the bound socket, or -1 once given up
}

// portTable is the daemon's reserved ports, whichever session holds them.
type portTable struct {
	mu   sync.Mutex
	held map[uint16]*reservation
}

// maxPortTries bounds the draws of port 0 that land on a port another
// reservation holds.
const maxPortTries = 16

// reserve binds the port (0: one the host picks) and enters it in the
// table.
func (t *portTable) reserve(addr netip.Addr, port uint16) (*reservation, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held == nil {
		t.held = map[uint16]*reservation{}
	}
	for range maxPortTries {
		if port != 0 && t.held[port] != nil {
			return nil, fail(ctl.InvalidState, "port %d is reserved already", port)
		}
		fd, got, err := bindTCP(addr, port)
		if err != nil {
			if errors.Is(err, unix.EADDRINUSE) {
				return nil, fail(ctl.InvalidState, "port %d: %v", port, err)
			}
			return nil, fail(ctl.InsufficientResources, "reserve port %d: %v", port, err)
		}
		if t.held[got] != nil { // port 0 drew a reserved one: again
			unix.Close(fd)
			continue
		}
		r := &reservation{port: got, fd: fd}
		t.held[got] = r
		return r, nil
	}
	return nil, fail(ctl.InsufficientResources, "no free port in %d draws", maxPortTries)
}

// release gives r up: its socket closed and its port out of the table.
func (t *portTable) release(r *reservation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
	if t.held[r.port] == r {
		delete(t.held, r.port)
	}
}

// heldByOther says whether a reservation other than mine holds port.
func (t *portTable) heldByOther(port uint16, mine *reservation) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.held[port]
	return r != nil && r != mine
}

// bindTCP binds a TCP socket to addr:port. SO_REUSEADDR lets it share the
// port with connections an earlier listener accepted (they do not hold it
// for the kernel's RDMA-CM either), never with a listener.
func bindTCP(addr netip.Addr, port uint16) (int, uint16, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	sa := &unix.SockaddrInet4{Port: int(port), Addr: addr.As4()}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	name, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, uint16(name.(*unix.SockaddrInet4).Port), nil
}

// mayBind refuses a privileged port (below the network namespace's
// ip_unprivileged_port_start, 1024 unless set) to a client process that
// could not bind it itself, as the kernel's RDMA-CM refuses it: the daemon
// binds and listens as root, for whoever asks.
//
// The kernel checks the capability of the process that calls, when it
// calls; the daemon can only read it off /proc after the request came,
// and by then the process may have exec'd a program that gave it
// privilege (set-user-ID, file capabilities, or such a program that exec'd
// another, leaving no trace in the program /proc shows). What cannot
// change after the fact is the effective user the kernel recorded when
// the process connected (SO_PEERCRED). So:
//   - the session's process must have been root when it connected, in the
//     daemon's user namespace; a non-root process that holds
//     CAP_NET_BIND_SERVICE (by file or ambient capabilities) is refused:
//     run it as root, or use a port of 1024 or above;
//   - the request must come from the session's own process (the kernel's
//     SCM_CREDENTIALS), not a child or any process it passed the socket
//     to;
//   - that process must hold CAP_NET_BIND_SERVICE now (root that dropped
//     it is refused), read between two looks at its program, so that an
//     exec between them is seen, and while it still runs (its pidfd);
//   - the capability counts only in a user namespace that owns the
//     daemon's network namespace or is an ancestor of the one that does,
//     as the kernel checks it (ns_capable on the network namespace's
//     owner): a process in a user namespace of its own has every
//     capability there, over nothing of the host's.
func (s *session) mayBind(port uint16) error {
	if port == 0 || uint32(port) >= unprivilegedPortStart() {
		return nil
	}
	refuse := func(why string) error {
		return fail(ctl.ProtectionViolation, "port %d is privileged, and process %d may not bind it: %s", port, s.cred.Pid, why)
	}
	if s.cred.Uid != 0 {
		return refuse(fmt.Sprintf("it connected as user %d, not root", s.cred.Uid))
	}
	if s.cred.Pid <= 0 || s.sender == nil || s.sender.Pid != s.cred.Pid {
		return refuse("the request was not sent by the process that opened the session")
	}
	proc := fmt.Sprintf("/proc/%d", s.cred.Pid)
	before, err := exeOf(proc)
	if err != nil {
		return refuse(err.Error())
	}
	status, err := os.ReadFile(proc + "/status")
	if err != nil || !hasCapability(string(status), unix.CAP_NET_BIND_SERVICE) {
		return refuse("no CAP_NET_BIND_SERVICE")
	}
	var user unix.Stat_t
	if err := unix.Stat(proc+"/ns/user", &user); err != nil {
		return refuse(err.Error())
	}
	after, err := exeOf(proc)
	if err != nil || after != before {
		return refuse("it ran another program while the daemon looked")
	}
	// The PID was read before the process could exit and its PID go to
	// another: what was read is the session's process's only if it
	// still runs.
	if s.pidfd == nil || exited(s.pidfd) {
		return refuse("the process has exited, or is not known by a pidfd")
	}
	if !ownsNetns(user) {
		return refuse("its capability is in a user namespace that does not own the daemon's network namespace")
	}
	return nil
}

// exe is the program a process runs: its file.
type exe struct{ dev, ino uint64 }

// exeOf is the program of the process whose /proc directory is proc.
func exeOf(proc string) (exe, error) {
	var st unix.Stat_t
	if err := unix.Stat(proc+"/exe", &st); err != nil {
		return exe{}, fmt.Errorf("its program: %w", err)
	}
	return exe{dev: st.Dev, ino: st.Ino}, nil
}

// exited says whether the process of a pidfd has exited (the pidfd reads
// readable then).
func exited(pidfd *os.File) bool {
	p := []unix.PollFd{{Fd: int32(pidfd.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	return err != nil || n > 0
}

// ownsNetns says whether the user namespace user (its /proc/PID/ns/user)
// is the owner of the daemon's network namespace or an ancestor of it.
func ownsNetns(user unix.Stat_t) bool {
	net, err := os.Open("/proc/self/ns/net")
	if err != nil {
		return false
	}
	defer net.Close()
	fd, err := unix.IoctlRetInt(int(net.Fd()), unix.NS_GET_USERNS)
	for err == nil {
		var st unix.Stat_t
		same := unix.Fstat(fd, &st) == nil && st.Dev == user.Dev && st.Ino == user.Ino
		parent, perr := unix.IoctlRetInt(fd, unix.NS_GET_PARENT)
		unix.Close(fd)
		if same {
			if perr == nil {
				unix.Close(parent)
			}
			return true
		}
		fd, err = parent, perr // EPERM past the daemon's own: no further
	}
	return false
}

// unprivilegedPortStart is the daemon's network namespace's
// net.ipv4.ip_unprivileged_port_start.
func unprivilegedPortStart() uint32 {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
	if err != nil {
		return 1024
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 1024
	}
	return uint32(n)
}

// hasCapability says whether the effective set of a /proc/PID/status text
// (its CapEff line, hexadecimal) has capability c.
func hasCapability(status string, c int) bool {
	for line := range strings.Lines(status) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && c < 64 && set&(1<<c) != 0
		}
	}
	return false
}

func (s *session) reservePort(req *ctl.ReservePort) (any, []*os.File, error) {
	if !s.srv.addr.Is4() {
		return nil, nil, fail(ctl.ModelNotSupported, "ports of an IPv6 address")
	}
	if err := s.mayBind(req.Port); err != nil {
		return nil, nil, err
	}
	r, err := s.srv.ports.reserve(s.srv.addr, req.Port)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h, err := s.add(r)
	if err != nil {
		s.srv.ports.release(r)
		return nil, nil, err
	}
	return &ctl.ReservePortReply{Reservation: h, Port: r.port}, nil, nil
}

func (s *session) freePort(h uint32) error {
	s.mu.Lock()
	r, err := get[*reservation](s, h, "reservation")
	if err == nil {
		s.forget(h)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.srv.ports.release(r)
	return nil
}

// reservationOf is the session's reservation of port, or nil; s.mu held.
func (s *session) reservationOf(port uint16) (uint32, *reservation) {
	for h, o := range s.objects {
		if r, ok := o.(*reservation); ok && r.port == port {
			return h, r
		}
	}
	return 0, nil
}

// resolveRoute asks the daemon's routing for a way from its address to
// req.Addr: a UDP socket connected there, which sends nothing.
func (s *session) resolveRoute(req *ctl.ResolveRoute) error {
	dst, err := netip.ParseAddr(req.Addr)
	if err != nil {
		return fail(ctl.InvalidParameter, "address %q: %v", req.Addr, err)
	}
	if dst.Is4() != s.srv.addr.Is4() {
		return fail(ctl.InvalidAddress, "%s is of another family than the daemon's %s", dst, s.srv.addr)
	}
	d := net.Dialer{LocalAddr: &net.UDPAddr{IP: s.srv.addr.AsSlice()}}
	c, err := d.Dial("udp", netip.AddrPortFrom(dst, 9).String())
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return fail(ctl.InvalidAddress, "no route from %s to %s: %v", s.srv.addr, dst, errno)
		}
		return fail(ctl.InvalidAddress, "no route from %s to %s: %v", s.srv.addr, dst, err)
	}
	c.Close()
	return nil
}
