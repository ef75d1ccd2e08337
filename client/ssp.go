package client

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ctl"
)

// Stream → RDMA on a TCP connection the application made (seed 000's
// iWARP extension to DAT): the passive side makes a Socket Service Point
// of its connection, the active side calls SocketConnect on its own; the
// peer's MPA Request and the Reply then travel on that connection, which
// carries RDMA from there.
//
// The socket is handed to the daemon (over the control socket) and taken
// from the application: CreateSSP and SocketConnect close the
// application's copy once the daemon holds it, so that nothing in this
// process reads the peer's MPA octets or writes into the RDMA stream. A
// socket comes back only from an SSP freed before it made its request
// (SSP.Free). A switch that fails resets the connection: it never goes
// back to streaming (seed 004).

// Socket is what CreateSSP and SocketConnect take: a connected TCP socket,
// as a *net.TCPConn or an *os.File of its descriptor.
type Socket interface {
	SyscallConn() (syscall.RawConn, error)
	Close() error
}

// SSPState is DAT_IW_SSP_STATE.
type SSPState uint8

// SSP states.
const (
	SSPOperational SSPState = iota
	SSPNonOperational
)

func (s SSPState) String() string {
	if s == SSPOperational {
		return "OPERATIONAL"
	}
	return "NON_OPERATIONAL"
}

// SSP is a Socket Service Point.
type SSP struct {
	ia *IA
	h  uint32
}

// Handle is the SSP's handle, as events carry it (Event.SSP).
func (p *SSP) Handle() uint32 { return p.h }

// dupSocket returns a descriptor of sock's socket for the daemon.
func dupSocket(sock Socket) (*os.File, error) {
	if sock == nil {
		return nil, fmt.Errorf("%w: no socket", ErrInvalidParameter)
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidParameter, err)
	}
	var fd int
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidParameter, err)
	}
	if derr != nil {
		return nil, fmt.Errorf("dup the socket: %w", derr)
	}
	return os.NewFile(uintptr(fd), "socket"), nil
}

// MaxFinalMessage is the longest final streaming message CreateSSP sends.
const MaxFinalMessage = ctl.MaxBytes

// CreateSSP makes a Socket Service Point of sock, a connected TCP socket
// whose local address is the IA's: the daemon sends finalMsg on it (the
// last streaming octets, may be nil), then waits for the peer's MPA
// Request, which arrives on evd (a connection request EVD) as a
// ConnectionRequest event whose CR is for ep (reserved meanwhile), or for
// an EP the provider makes when ep is nil. If the socket is not connected,
// or its connection ends before the request, a ConnectionEvent SocketDown
// comes on evd instead, with Event.SSP set. At most one request per SSP.
// On success sock is closed in this process (the daemon holds it).
//
// Errors: ErrInvalidHandle (ep or evd not this IA's), ErrInvalidParameter
// (not a TCP socket, a listening one, evd not a connection request EVD, a
// final message longer than MaxFinalMessage), ErrInvalidState (ep not
// UNCONNECTED, or the socket's local address not the IA's).
func (ia *IA) CreateSSP(sock Socket, ep *EP, evd *EVD, finalMsg []byte) (*SSP, error) {
	if evd == nil || evd.ia != ia {
		return nil, fmt.Errorf("create SSP: %w: no EVD of this IA", ErrInvalidHandle)
	}
	if ep != nil && ep.ia != ia {
		return nil, fmt.Errorf("create SSP: %w: EP of another IA", ErrInvalidHandle)
	}
	if len(finalMsg) > MaxFinalMessage {
		return nil, fmt.Errorf("create SSP: %w: final message of %d octets (at most %d)", ErrInvalidParameter, len(finalMsg), MaxFinalMessage)
	}
	f, err := dupSocket(sock)
	if err != nil {
		return nil, fmt.Errorf("create SSP: %w", err)
	}
	defer f.Close()
	req := &ctl.CreateSSP{EVD: evd.h, FinalMessage: finalMsg}
	if ep != nil {
		req.EP = ep.h
	}
	var r ctl.Handle
	if _, err := ia.call(ctl.OpCreateSSP, req, []*os.File{f}, &r); err != nil {
		return nil, fmt.Errorf("create SSP: %w", err)
	}
	_ = sock.Close()
	return &SSP{ia: ia, h: r.H}, nil
}

// Free frees the SSP. A request it made is not affected. If it made none,
// its socket comes back as it was (nothing of the peer's read from it) and
// Free returns it; otherwise nil.
func (p *SSP) Free() (*net.TCPConn, error) {
	var r ctl.FreeSSPReply
	files, err := p.ia.call(ctl.OpFreeSSP, &ctl.Handle{H: p.h}, nil, &r)
	if err != nil {
		return nil, fmt.Errorf("free SSP: %w", err)
	}
	if !r.Returned || len(files) != 1 {
		closeAll(files)
		return nil, nil
	}
	defer files[0].Close()
	nc, err := net.FileConn(files[0])
	if err != nil {
		return nil, fmt.Errorf("free SSP: the socket came back unusable: %w", err)
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("free SSP: the socket came back as %T", nc)
	}
	return tc, nil
}

// SSPInfo is what SSP.Query returns (DAT_IW_SSP_PARAM).
type SSPInfo struct {
	// EP is the SSP's EP (nil: a provider EP comes with the request).
	EP    *EP
	EVD   uint32
	State SSPState
	// The socket's addresses.
	LocalAddr, RemoteAddr string
}

// Query returns the SSP's parameters.
func (p *SSP) Query() (SSPInfo, error) {
	var r ctl.SSPInfo
	if _, err := p.ia.call(ctl.OpQuerySSP, &ctl.Handle{H: p.h}, nil, &r); err != nil {
		return SSPInfo{}, fmt.Errorf("query SSP: %w", err)
	}
	info := SSPInfo{EVD: r.EVD, State: SSPNonOperational, LocalAddr: r.LocalAddr, RemoteAddr: r.RemoteAddr}
	if r.Operational {
		info.State = SSPOperational
	}
	if r.EP != 0 {
		info.EP = p.ia.epFor(r.EP)
	}
	return info, nil
}

// SocketConnect connects the EP over sock, a connected TCP socket whose
// local address is the IA's and which the application may have used for
// its own stream (seed 000's dat_iw_socket_connect): once the peer has
// acknowledged every octet written on it, the MPA Request with privateData
// goes out on it, and the outcome arrives on the connect EVD as Connect's
// does (ESTABLISHED, PEER_REJECTED, NON_PEER_REJECTED — also for a socket
// that is not connected —, TIMED_OUT). The EP's addresses are the
// socket's. A receive must be posted first (seed 004: the peer's first
// Send must find one). On success sock is closed in this process; a
// failure after it resets the connection.
//
// Errors: ErrInvalidParameter (timeout not positive, private data too
// long, not a TCP socket), ErrInvalidState (EP not UNCONNECTED, no PZ or
// connect EVD, no receive posted, the socket's address not the IA's).
func (e *EP) SocketConnect(sock Socket, timeout time.Duration, privateData []byte) error {
	if timeout <= 0 {
		return fmt.Errorf("socket connect: %w: timeout %v", ErrInvalidParameter, timeout)
	}
	f, err := dupSocket(sock)
	if err != nil {
		return fmt.Errorf("socket connect: %w", err)
	}
	defer f.Close()
	req := &ctl.SocketConnect{EP: e.h, PrivateData: privateData, TimeoutUS: uint64(max(timeout, connectTimeoutFloor) / time.Microsecond)}
	if _, err := e.ia.call(ctl.OpSocketConnect, req, []*os.File{f}, nil); err != nil {
		return fmt.Errorf("socket connect: %w", err)
	}
	_ = sock.Close()
	return nil
}
