package daemon

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/repair"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/xdpnet"
)

// Socket Service Points and SocketConnect (seed 000): a TCP connection
// the client made is passed over the control socket and switched to RDMA
// (rnic/ssp.go).

// ssp is a Socket Service Point.
type ssp struct {
	h   uint32
	evd *evd
	// ep is the EP it reserved; nil: the provider makes one with the
	// request (as a PSP with DAT_PSP_PROVIDER_FLAG).
	ep          *ep
	sp          *rnic.SocketPoint
	operational bool
	local       string
	remote      string
}

// takeSocket checks the one descriptor passed with a request is a TCP
// socket over IPv4 that is not listening, and whose local address, if it
// has one, is this IA's; it returns it as a connection of the daemon's (a
// dup: the passed descriptor is closed after the request).
func (s *session) takeSocket(fds []*os.File) (*net.TCPConn, error) {
	if len(fds) != 1 {
		return nil, fail(ctl.InvalidParameter, "%d descriptors passed, want the socket alone", len(fds))
	}
	f := fds[0]
	fd := int(f.Fd())
	for _, o := range []struct {
		opt  int
		want int
		what string
	}{{unix.SO_DOMAIN, unix.AF_INET, "an IPv4 socket"}, {unix.SO_TYPE, unix.SOCK_STREAM, "a stream socket"},
		{unix.SO_PROTOCOL, unix.IPPROTO_TCP, "a TCP socket"}, {unix.SO_ACCEPTCONN, 0, "a socket that is not listening"}} {
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, o.opt)
		if err != nil || v != o.want {
			return nil, fail(ctl.InvalidParameter, "the descriptor is not %s", o.what)
		}
	}
	if sa, err := unix.Getsockname(fd); err == nil {
		if in, ok := sa.(*unix.SockaddrInet4); ok {
			local := netip.AddrFrom4(in.Addr)
			if _, err := unix.Getpeername(fd); err == nil && local != s.srv.addr {
				// DAT: "socket does not belong to the Interface Adaptor".
				return nil, fail(ctl.InvalidState, "the socket's local address %v is not this IA's (%v)", local, s.srv.addr)
			}
		}
	}
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, resources("socket", err)
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fail(ctl.InvalidParameter, "the descriptor is not a TCP connection")
	}
	return tc, nil
}

// switchableSocket is takeSocket, and on the xdp datapath CheckSocket:
// can the connection be taken over? Called before the session's lock, as
// CheckSocket may wait on the neighbour table. A socket that is not
// connected passes: an SSP of it reports SOCKET_DOWN, a SocketConnect on
// it fails as an event, NON_PEER_REJECTED.
func (s *session) switchableSocket(fds []*os.File) (*net.TCPConn, error) {
	tc, err := s.takeSocket(fds)
	if err != nil {
		return nil, err
	}
	if err := s.srv.dev.CheckSocket(tc); err != nil && !errors.Is(err, repair.ErrNotConnected) {
		tc.Close()
		return nil, socketError(err)
	}
	return tc, nil
}

func (s *session) createSSP(req *ctl.CreateSSP, fds []*os.File) (any, []*os.File, error) {
	tc, err := s.switchableSocket(fds)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	refuse := func(err error) (any, []*os.File, error) {
		tc.Close()
		return nil, nil, err
	}
	if req.EVD == 0 {
		return refuse(fail(ctl.InvalidHandle, "an SSP needs a connection request EVD"))
	}
	e, err := s.evdFor(req.EVD, ctl.EVDCR, "connection request")
	if err != nil {
		return refuse(err)
	}
	p := &ssp{evd: e, operational: true}
	if req.EP != 0 {
		if p.ep, err = get[*ep](s, req.EP, "EP"); err != nil {
			return refuse(err)
		}
		if p.ep.state != ctl.EPUnconnected {
			return refuse(fail(ctl.InvalidState, "SSP on an EP in %s", ctl.EPStateName(p.ep.state)))
		}
	}
	if ra, ok := tc.RemoteAddr().(*net.TCPAddr); ok && ra != nil {
		p.remote = ra.String()
	}
	if la, ok := tc.LocalAddr().(*net.TCPAddr); ok && la != nil {
		p.local = la.String()
	}
	if p.h, err = s.add(p); err != nil {
		return refuse(err)
	}
	msg := append([]byte(nil), req.FinalMessage...)
	if p.sp, err = s.srv.dev.ServeSocket(tc, rnic.SocketPointOptions{FinalMessage: msg, Checked: true}); err != nil {
		s.forget(p.h)
		tc.Close()
		return nil, nil, socketError(err)
	}
	if p.ep != nil {
		p.ep.setState(ctl.EPReserved)
	}
	e.refs++
	s.loops.Add(1)
	go s.awaitSSP(p)
	return &ctl.Handle{H: p.h}, nil, nil
}

// awaitSSP queues the SSP's one request, or the end of its socket, for
// the poll loop.
func (s *session) awaitSSP(p *ssp) {
	defer s.loops.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := p.sp.Request(ctx)
	if ctx.Err() != nil && err != nil {
		return // the session ended: close frees the point
	}
	s.queue(pendingEvent{ssp: p, req: req, sspErr: err})
}

// applySSP turns the SSP's outcome into its event; s.mu held.
func (s *session) applySSP(p *ssp, req *rnic.ConnRequest, err error) {
	if s.objects[p.h] != p {
		if req != nil {
			_ = req.Reject(nil) // freed meanwhile: as if nobody listened
		}
		return
	}
	p.operational = false
	if req == nil {
		if errors.Is(err, rnic.ErrClosed) {
			return
		}
		s.srv.log.Debug("SSP socket down", "session", s.id, "ssp", p.h, "err", err)
		eve := shm.EVE{Kind: shm.EventConnection, Handle: p.h, Event: ctl.EvSocketDown}
		if p.ep != nil && p.ep.state == ctl.EPReserved {
			p.ep.setState(ctl.EPUnconnected)
			eve.EP = p.ep.h
		}
		s.emit(p.evd, eve)
		return
	}
	s.offerRequest(&cr{req: req, ssp: p}, p.evd, p.ep, p.ep == nil)
}

// freeSSP frees the SSP: a request it made stays; while it made none its
// socket comes back with the reply (digest 000: "the socket reverts back
// to its previous owner").
func (s *session) freeSSP(h uint32) (any, []*os.File, error) {
	s.mu.Lock()
	p, err := get[*ssp](s, h, "SSP")
	if err != nil {
		s.mu.Unlock()
		return nil, nil, err
	}
	s.forget(h)
	p.evd.refs--
	if p.ep != nil && p.ep.state == ctl.EPReserved {
		p.ep.setState(ctl.EPUnconnected)
	}
	s.mu.Unlock()
	nc := p.sp.Free()
	if nc == nil {
		return &ctl.FreeSSPReply{}, nil, nil
	}
	defer nc.Close()
	f, err := nc.File()
	if err != nil {
		return nil, nil, resources("give the socket back", err)
	}
	return &ctl.FreeSSPReply{Returned: true}, []*os.File{f}, nil
}

func (s *session) querySSP(h uint32) (any, []*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := get[*ssp](s, h, "SSP")
	if err != nil {
		return nil, nil, err
	}
	info := &ctl.SSPInfo{EVD: p.evd.h, Operational: p.operational, LocalAddr: p.local, RemoteAddr: p.remote}
	if p.ep != nil {
		info.EP = p.ep.h
	}
	return info, nil, nil
}

// socketError is the client's error for a socket the device cannot
// switch: INVALID_STATE when the connection cannot be taken over from the
// kernel (DAT: "socket does not belong to the Interface Adaptor"), or the
// daemon may not (TCP_REPAIR needs CAP_NET_ADMIN); INVALID_PARAMETER
// otherwise.
func socketError(err error) error {
	if errors.Is(err, repair.ErrRefused) || errors.Is(err, repair.ErrPermission) || errors.Is(err, xdpnet.ErrNoNeighbour) {
		return fail(ctl.InvalidState, "%v", err)
	}
	return fail(ctl.InvalidParameter, "%v", err)
}

// socketConnect is Connect over the socket passed with the request.
func (s *session) socketConnect(req *ctl.SocketConnect, fds []*os.File) (any, []*os.File, error) {
	tc, err := s.switchableSocket(fds)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	refuse := func(err error) (any, []*os.File, error) {
		s.mu.Unlock()
		tc.Close()
		return nil, nil, err
	}
	e, err := get[*ep](s, req.EP, "EP")
	if err != nil {
		return refuse(err)
	}
	switch st := e.state; {
	case st != ctl.EPUnconnected:
		return refuse(fail(ctl.InvalidState, "connect an EP in %s", ctl.EPStateName(st)))
	case e.ib != nil:
		return refuse(fail(ctl.InvalidState, "connect EP %d, which waits for an InfiniBand-style connection", e.h))
	case e.qp == nil:
		return refuse(fail(ctl.InvalidState, "EP %d has no PZ, so no QP", e.h))
	case e.conn == nil:
		return refuse(fail(ctl.InvalidState, "EP %d has no connect EVD", e.h))
	case req.TimeoutUS == 0:
		return refuse(fail(ctl.InvalidParameter, "timeout 0"))
	case len(req.PrivateData) > int(s.srv.iaAttr().MaxPrivate):
		return refuse(fail(ctl.InvalidParameter, "%d octets of private data", len(req.PrivateData)))
	}
	// Seed 004: the switch needs a receive posted, or the peer's first
	// Send would find none and end the connection.
	s.drainRQ(e)
	if e.qp.PostedRecvs() == 0 {
		return refuse(fail(ctl.InvalidState, "post a receive before switching the socket to RDMA"))
	}
	e.setState(ctl.EPActivePending)
	if ra, ok := tc.RemoteAddr().(*net.TCPAddr); ok && ra != nil {
		e.remote = ra.String()
	}
	q := e.qp
	ctx, cancel := context.WithCancel(context.Background())
	e.cancelConnect = cancel
	s.mu.Unlock()
	timeout := time.Duration(req.TimeoutUS) * time.Microsecond
	pdata := append([]byte(nil), req.PrivateData...)
	go func() {
		defer cancel()
		if _, err := q.SocketConnect(ctx, tc, rnic.ConnectOptions{PrivateData: pdata, Timeout: timeout}); err != nil {
			s.queue(pendingEvent{ep: e, connectErr: err})
		}
	}()
	return nil, nil, nil
}
