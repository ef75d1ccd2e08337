package daemon

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/rnic"
	"golang.org/x/sys/unix"
)

// ep is a DAT endpoint: its state machine (digest 003 §2), its QP once it
// has a PZ, and the rings the client posts to.
type ep struct {
	h      uint32
	attr   ctl.EPAttr
	state  uint8
	pz     *pz
	recv   *evd
	req    *evd
	conn   *evd
	qp     *rnic.QP
	sq, rq *shm.Ring
	// The rings are blocks of the session's region at sqOff and rqOff;
	// queue, the ready queue of the QP's vector, finds them by slot
	// (ready.go). handOff: the queue's owner handed them to the session.
	sqOff, rqOff uint32
	slot         uint32
	queue        *readyQueue
	handOff      atomic.Bool
	// ringMu is held by whoever consumes sq and rq, the session or the
	// queue's owner, and guards sgl, scratch for one work request's SGL
	// on its way from a ring into the engine, which copies it; queue, sq
	// and rq change under it (and s.mu).
	ringMu sync.Mutex
	sgl    [max(shm.RingSGE, shm.RQSGE)]qp.SGE
	// detached: the rings are being taken from the queue's owner (ringMu).
	detached bool
	// retrying: on its queue's retry list (its owner's); polling: the
	// QP's receive goroutine polls the rings (kernel datapath; that
	// goroutine's).
	retrying, polling bool

	local, remote string
	peerPD        []byte
	// flushing: a disconnect of an UNCONNECTED EP flushes its receives;
	// the engine's terminal event that follows is not a connection's.
	flushing bool
	freeing  bool
	// cancelConnect stops the EP's last connect if it still runs (the
	// session ends, the QP goes); s.mu.
	cancelConnect context.CancelFunc
	// ib is the EP's wait for an InfiniBand-style connection while it
	// is the passive side of one (ibconn.go); s.mu.
	ib *expectation
}

// setState changes the EP's state and publishes it in its send ring's
// header, where the client checks a post's state without asking (s.mu).
func (e *ep) setState(st uint8) {
	e.state = st
	if e.sq != nil {
		e.sq.PublishState(uint32(st))
	}
}

type psp struct {
	h        uint32
	ln       *rnic.Listener
	evd      *evd
	provider bool
	rsp      *ep // an RSP's one EP
}

type cr struct {
	h   uint32
	req *rnic.ConnRequest
	psp *psp
	ssp *ssp // or the SSP that made it
	ep  *ep  // provider-created, or the RSP's or SSP's EP
}

// pendingEvent is something for the poller to apply under s.mu: an
// engine connection event, the end of a connect attempt, or a request that
// arrived at a PSP.
type pendingEvent struct {
	ep         *ep
	ev         *rnic.ConnEvent
	connectErr error
	psp        *psp
	req        *rnic.ConnRequest
	// ssp: the SSP's outcome, req or sspErr.
	ssp    *ssp
	sspErr error
	// ib: with connectErr, the expectation that ran out (ibconn.go);
	// void if the EP no longer holds it.
	ib *expectation
}

func (s *session) queue(pe pendingEvent) {
	s.evMu.Lock()
	s.pending = append(s.pending, pe)
	s.evMu.Unlock()
	s.kick()
}

func (s *session) evdFor(h uint32, flag uint8, what string) (*evd, error) {
	if h == 0 {
		return nil, nil
	}
	e, err := get[*evd](s, h, what+" EVD")
	if err != nil {
		return nil, err
	}
	if e.flags&flag == 0 {
		return nil, fail(ctl.InvalidParameter, "%s EVD %d lacks the flag for it", what, h)
	}
	return e, nil
}

// createEP makes an endpoint; s.mu not held.
func (s *session) createEP(a *ctl.EPAttr, _ any) (any, []*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := &ep{attr: *a, state: ctl.EPUnconnected}
	f, err := s.configureEP(e, a)
	if err != nil {
		return nil, nil, err
	}
	h, err := s.add(e)
	if err != nil {
		s.unconfigureEP(e)
		return nil, nil, err
	}
	e.h = h
	if e.qp != nil {
		s.owners.Store(e.qp.QPN(), h)
	}
	return s.epReply(e), f, nil
}

func (s *session) epReply(e *ep) *ctl.EPReply {
	r := &ctl.EPReply{EP: e.h, HasRings: e.sq != nil}
	if e.qp != nil {
		r.QPN = e.qp.QPN()
	}
	if e.sq != nil {
		r.SQEntries, r.RQEntries = e.sq.Entries(), e.rq.Entries()
		r.SQOffset, r.RQOffset, r.Slot = e.sqOff, e.rqOff, e.slot
		r.Queue, r.QueueOffset, r.QueueEntries = uint32(e.queue.vector), e.queue.off, readyEntries
	}
	return r
}

// resolveEP checks an EP's attributes and finds the objects they name;
// s.mu held. Everything but running out of resources fails here.
func (s *session) resolveEP(a *ctl.EPAttr) (p *pz, recv, req, conn *evd, err error) {
	if a.SQDepth > maxQueue || a.RQDepth > maxQueue || a.IRD > 64 || a.ORD > 64 || a.MPARev > 2 || a.RTR > 7 {
		return nil, nil, nil, nil, fail(ctl.InvalidParameter, "EP depths %d/%d, IRD/ORD %d/%d, MPA revision %d, RTR %#x", a.SQDepth, a.RQDepth, a.IRD, a.ORD, a.MPARev, a.RTR)
	}
	if a.PZ != 0 {
		if p, err = get[*pz](s, a.PZ, "PZ"); err != nil {
			return
		}
	}
	if recv, err = s.evdFor(a.RecvEVD, ctl.EVDDTO, "receive"); err != nil {
		return
	}
	if req, err = s.evdFor(a.RequestEVD, ctl.EVDDTO, "request"); err != nil {
		return
	}
	if conn, err = s.evdFor(a.ConnectEVD, ctl.EVDConnection, "connect"); err != nil {
		return
	}
	// digest 003: a PZ is required for a QP, and a QP needs its CQs.
	if p != nil && (recv == nil || req == nil) {
		err = fail(ctl.InvalidParameter, "an EP with a PZ needs receive and request EVDs")
	}
	return
}

// configureEP takes references on the PZ and EVDs of a and, with a PZ,
// creates the QP and carves its rings from the session's region; it
// returns the doorbell of the EP's ready queue for the client. s.mu held.
func (s *session) configureEP(e *ep, a *ctl.EPAttr) ([]*os.File, error) {
	p, recv, req, conn, err := s.resolveEP(a)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	if p != nil {
		if files, err = s.configureQP(e, a, p, recv, req); err != nil {
			return nil, err
		}
	}
	e.pz, e.recv, e.req, e.conn = p, recv, req, conn
	for _, o := range []*evd{recv, req, conn} {
		if o != nil {
			o.refs++
		}
	}
	if p != nil {
		p.refs++
	}
	e.attr = *a
	return files, nil
}

// configureQP creates e's QP and rings and puts them on the ready queue of
// the QP's vector; s.mu held. On failure e is left without them.
func (s *session) configureQP(e *ep, a *ctl.EPAttr, p *pz, recv, req *evd) (files []*os.File, err error) {
	sqn, rqn := roundPow2(max(a.SQDepth, 1)), roundPow2(max(a.RQDepth, 1))
	// On the xdp datapath BeforeReceive runs on the QP's poller, and
	// the poller forwards completions (evdSource); on the kernel
	// datapath whoever completes does, and the receive goroutine polls
	// the rings while it looks for data (Poll).
	polled := s.srv.dev.Pollers() != nil
	attr := rnic.QPAttr{SQDepth: int(sqn), RQDepth: int(rqn), IRD: int(a.IRD), ORD: int(a.ORD),
		SendCQ: req.cq, RecvCQ: recv.cq, NoCRC: a.NoCRC, Markers: a.Markers, MPARevision: a.MPARev, PeerToPeer: a.PeerToPeer, RTR: mpa.RTR(a.RTR),
		OnEvent:       func(ev rnic.ConnEvent) { s.queue(pendingEvent{ep: e, ev: &ev}) },
		BeforeReceive: func() { s.takeQueuedRecvs(e, polled) }}
	if !polled {
		attr.Completed = func() { s.completed(e, recv, req) }
		attr.Poll = func() bool { return s.pollRings(e) }
		attr.PollDone = func() { s.pollDone(e) }
	}
	q, err := s.srv.dev.CreateQP(p.pd, attr)
	if err != nil {
		return nil, fail(ctl.InvalidParameter, "%v", err)
	}
	// What fails from here is a resource: undo in reverse.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	undo = append(undo, q.Destroy)
	ready, err := s.queueFor(q.Vector())
	if err != nil {
		return nil, err
	}
	sqOff, sq, err := s.allocRing(sqn, shm.SQESize)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { s.freeRing(sqOff, sqn, shm.SQESize) })
	rqOff, rq, err := s.allocRing(rqn, shm.RQESize)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { s.freeRing(rqOff, rqn, shm.RQESize) })
	slot, err := s.newSlot(e)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { s.freeSlot(slot) })
	db, err := ready.doorbell()
	if err != nil {
		return nil, resources("ready queue doorbell", err)
	}
	// Until a receive goroutine polls them, a post to the rings puts
	// the EP on its queue.
	sq.SetFlags(shm.NeedWakeup)
	rq.SetFlags(shm.NeedWakeup)
	sq.PublishState(uint32(e.state))
	e.ringMu.Lock()
	e.qp, e.sq, e.rq, e.sqOff, e.rqOff, e.slot, e.queue = q, sq, rq, sqOff, rqOff, slot, ready
	e.ringMu.Unlock()
	s.owners.Store(q.QPN(), e.h) // 0 until createEP has the handle; unconfigureEP removes it
	s.srv.trim.note()
	return []*os.File{db}, nil
}

// unconfigureEP drops the QP, rings and references; s.mu held.
func (s *session) unconfigureEP(e *ep) {
	if e.cancelConnect != nil {
		e.cancelConnect()
		e.cancelConnect = nil
	}
	s.forgetIB(e)
	if e.sq != nil {
		// The queue's owner finds the slot empty, and e detached if it
		// had it already: it takes nothing more from the rings.
		s.freeSlot(e.slot)
		e.ringMu.Lock()
		e.detached = true
		e.ringMu.Unlock()
	}
	if e.qp != nil {
		s.owners.Delete(e.qp.QPN())
		e.qp.Destroy()
		e.qp = nil
		s.srv.trim.note()
	}
	if e.sq != nil {
		// Destroy ended the QP's hooks, the last readers without the
		// ring lock; the blocks may now carry another EP's rings.
		e.ringMu.Lock()
		s.freeRing(e.sqOff, e.sq.Entries(), shm.SQESize)
		s.freeRing(e.rqOff, e.rq.Entries(), shm.RQESize)
		e.sq, e.rq, e.queue, e.detached = nil, nil, nil, false
		e.ringMu.Unlock()
	}
	for _, o := range []*evd{e.recv, e.req, e.conn} {
		if o != nil {
			o.refs--
		}
	}
	if e.pz != nil {
		e.pz.refs--
	}
	e.pz, e.recv, e.req, e.conn = nil, nil, nil, nil
}

// modifyEP: digest 003 §3. Immutable fields never change; the PZ only in
// UNCONNECTED or TENTATIVE_CONNECTION_PENDING; EVDs and depths also in
// RESERVED. A change rebuilds the QP, and the new rings go to the client.
func (s *session) modifyEP(req *ctl.ModifyEP) (any, []*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := get[*ep](s, req.EP, "EP")
	if err != nil {
		return nil, nil, err
	}
	if req.Mask&ctl.ModifyImmutable != 0 || req.Mask&^(ctl.ModifyImmutable<<1-1) != 0 {
		return nil, nil, fail(ctl.InvalidParameter, "mask %#x names a field that cannot change", req.Mask)
	}
	switch {
	case req.Mask&ctl.ModifyPZ != 0 && e.state != ctl.EPUnconnected && e.state != ctl.EPTentativePending:
		return nil, nil, fail(ctl.InvalidState, "PZ of an EP in %s", ctl.EPStateName(e.state))
	case e.state != ctl.EPUnconnected && e.state != ctl.EPTentativePending && e.state != ctl.EPReserved:
		return nil, nil, fail(ctl.InvalidState, "attributes of an EP in %s", ctl.EPStateName(e.state))
	}
	a := e.attr
	if req.Mask&ctl.ModifyPZ != 0 {
		a.PZ = req.Attr.PZ
	}
	if req.Mask&ctl.ModifyEVDs != 0 {
		a.RecvEVD, a.RequestEVD, a.ConnectEVD = req.Attr.RecvEVD, req.Attr.RequestEVD, req.Attr.ConnectEVD
	}
	if req.Mask&ctl.ModifyDepths != 0 {
		a.SQDepth, a.RQDepth = req.Attr.SQDepth, req.Attr.RQDepth
	}
	if req.Mask&ctl.ModifyIRDORD != 0 {
		a.IRD, a.ORD = req.Attr.IRD, req.Attr.ORD
	}
	// Check first, so that a refused change leaves the EP and the
	// client's rings as they were. Past this point only resources can
	// run out; the EP is then left without a QP, like one made without a
	// PZ, and connecting it is refused until a modify succeeds.
	if _, _, _, _, err := s.resolveEP(&a); err != nil {
		return nil, nil, err
	}
	s.unconfigureEP(e)
	files, err := s.configureEP(e, &a)
	if err != nil {
		s.srv.log.Warn("EP left without queues: modify ran out of resources", "ep", e.h, "err", err)
		return nil, nil, err
	}
	return s.epReply(e), files, nil
}

func (s *session) connect(req *ctl.Connect) error {
	s.mu.Lock()
	e, err := get[*ep](s, req.EP, "EP")
	if err != nil {
		s.mu.Unlock()
		return err
	}
	switch st := e.state; {
	case st != ctl.EPUnconnected:
		s.mu.Unlock()
		return fail(ctl.InvalidState, "connect an EP in %s", ctl.EPStateName(st))
	case e.ib != nil:
		s.mu.Unlock()
		return fail(ctl.InvalidState, "connect EP %d, which waits for an InfiniBand-style connection", e.h)
	case e.qp == nil:
		s.mu.Unlock()
		return fail(ctl.InvalidState, "EP %d has no PZ, so no QP", e.h)
	case e.conn == nil:
		s.mu.Unlock()
		return fail(ctl.InvalidState, "EP %d has no connect EVD", e.h)
	case req.TimeoutUS == 0:
		s.mu.Unlock()
		return fail(ctl.InvalidParameter, "timeout 0")
	case len(req.PrivateData) > int(s.srv.iaAttr().MaxPrivate):
		s.mu.Unlock()
		return fail(ctl.InvalidParameter, "%d octets of private data", len(req.PrivateData))
	}
	ap, err := netip.ParseAddrPort(req.Addr)
	if err != nil || !ap.Addr().Is4() {
		s.mu.Unlock()
		return fail(ctl.InvalidParameter, "address %q: want IPv4 host:port", req.Addr)
	}
	e.setState(ctl.EPActivePending)
	e.remote = ap.String()
	q := e.qp
	s.drainRQ(e) // receives posted before connecting, as at accept
	ctx, cancel := context.WithCancel(context.Background())
	e.cancelConnect = cancel
	s.mu.Unlock()
	timeout := time.Duration(req.TimeoutUS) * time.Microsecond
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: s.srv.addr.AsSlice()}, Control: noPortAtBind}
	pdata := append([]byte(nil), req.PrivateData...)
	// The reply waits until the connection holds what it needs of this
	// host (its socket, or on the xdp datapath its port): at a limit
	// the consumer hears it here, as INSUFFICIENT_RESOURCES (DAT's
	// answer when the provider runs short), not later as an event that
	// would blame the network or the peer. That costs no wait on the
	// network.
	started := make(chan error, 1)
	var startErr error // the Started call happens before Connect returns
	onStart := func(err error) {
		startErr = err
		started <- err
	}
	retry := time.Duration(req.RetryRefusedUS) * time.Microsecond
	go func() {
		defer cancel()
		opts := rnic.ConnectOptions{PrivateData: pdata, Timeout: timeout, Dialer: dialer, Started: onStart}
		begun, backoff := time.Now(), 5*time.Millisecond
		for {
			_, err := q.Connect(ctx, ap.String(), opts)
			if err != nil && errors.Is(err, rnic.ErrRefused) && time.Since(begun)+backoff < min(retry, timeout) {
				// Nobody listens yet: the peer may be about to.
				select {
				case <-ctx.Done():
				case <-time.After(backoff):
					backoff = min(2*backoff, 100*time.Millisecond)
					opts.Started = nil // answered by the first attempt
					opts.Timeout = timeout - time.Since(begun)
					continue
				}
			}
			if err != nil && !errors.Is(startErr, rnic.ErrResources) {
				s.queue(pendingEvent{ep: e, connectErr: err})
			}
			return
		}
	}()
	select {
	case err = <-started:
	case <-time.After(timeout):
		// Never seen; the outcome comes as an event all the same.
	}
	if !errors.Is(err, rnic.ErrResources) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objects[e.h] == e && e.state == ctl.EPActivePending {
		e.setState(ctl.EPUnconnected)
		e.remote = ""
	}
	return resources("connect", err)
}

// noPortAtBind has the kernel choose a kernel datapath connection's local
// port at connect, not when the dialer binds its address: bind must find
// a port no other socket holds, where connect needs only a 4-tuple nobody
// uses, so that connections to different peers share local ports, as on
// the xdp datapath.
func noPortAtBind(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); err != nil {
		return err
	}
	return serr
}

func (s *session) disconnect(req *ctl.Disconnect) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := get[*ep](s, req.EP, "EP")
	if err != nil {
		return err
	}
	// Requests the client put in the rings before asking to disconnect
	// come first: a graceful disconnect lets them finish, an UNCONNECTED
	// one flushes them.
	s.drainRings(e)
	switch e.state {
	case ctl.EPConnected:
		e.setState(ctl.EPDisconnectPending)
		e.qp.Disconnect(req.Graceful)
	case ctl.EPDisconnectPending:
		if req.Graceful {
			return fail(ctl.InvalidParameter, "graceful disconnect of an EP already disconnecting")
		}
		e.qp.Disconnect(false)
	case ctl.EPDisconnected:
		// digest 003: a no-op, for the connection; but receives a QP
		// connected the InfiniBand way kept at its peer's end are
		// flushed, as a QP moved to error flushes what is posted
		// (ibv_modify_qp to ERR after the peer's QP went).
		if e.qp != nil {
			e.qp.FlushKeptRecvs()
		}
	case ctl.EPUnconnected:
		// digest 003 §2: the way to flush pre-posted receives; an
		// InfiniBand-style connection waited for is given up.
		s.forgetIB(e)
		if e.qp != nil {
			e.flushing = true
			e.qp.Disconnect(false)
			if err := e.qp.Reset(); err != nil {
				return fail(ctl.InternalError, "%v", err)
			}
		}
	default:
		// digest 003, "Notes on Disconnecting": a connection in progress
		// cannot be disconnected.
		return fail(ctl.InvalidState, "disconnect an EP in %s", ctl.EPStateName(e.state))
	}
	return nil
}

func (s *session) resetEP(h uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := get[*ep](s, h, "EP")
	if err != nil {
		return err
	}
	switch e.state {
	case ctl.EPUnconnected:
		s.forgetIB(e) // an InfiniBand-style connection waited for is given up
		return nil
	case ctl.EPDisconnected:
		if e.qp != nil {
			if err := e.qp.Reset(); err != nil {
				return fail(ctl.InternalError, "%v", err)
			}
		}
		e.setState(ctl.EPUnconnected)
		e.remote, e.peerPD = "", nil
		return nil
	}
	return fail(ctl.InvalidState, "reset an EP in %s", ctl.EPStateName(e.state))
}

func (s *session) freeEP(h uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := get[*ep](s, h, "EP")
	if err != nil {
		return err
	}
	switch e.state {
	case ctl.EPReserved, ctl.EPPassivePending, ctl.EPTentativePending:
		return fail(ctl.InvalidState, "free an EP in %s", ctl.EPStateName(e.state))
	case ctl.EPUnconnected, ctl.EPDisconnected:
		s.dropEP(e)
	case ctl.EPDisconnectPending:
		// Freed during its disconnect (rdma_disconnect then
		// rdma_destroy_qp, as perftest and rping do): Destroy lets a
		// graceful close with only its FIN left finish in order and
		// resets any other (an abrupt disconnect's already is); no
		// event of it is wanted any more.
		s.dropEP(e)
	default:
		// Abort; the terminal event finishes the free.
		e.freeing = true
		if e.qp != nil {
			e.qp.Disconnect(false)
		}
	}
	return nil
}

// dropEP removes an EP; s.mu held.
func (s *session) dropEP(e *ep) {
	s.unconfigureEP(e)
	s.forget(e.h)
}

func (s *session) queryEP(h uint32) (any, []*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := get[*ep](s, h, "EP")
	if err != nil {
		return nil, nil, err
	}
	info := &ctl.EPInfo{State: e.state, Attr: e.attr, LocalAddr: e.local, RemoteAddr: e.remote, PrivateData: e.peerPD, HasQP: e.qp != nil}
	return info, nil, nil
}

func (s *session) listen(port uint16) (*rnic.Listener, error) {
	if port == 0 {
		return nil, fail(ctl.InvalidParameter, "port 0")
	}
	ln, err := s.srv.dev.Listen(net.JoinHostPort(s.srv.addr.String(), strconv.Itoa(int(port))), rnic.ListenOptions{})
	if err != nil {
		return nil, fail(ctl.InvalidState, "listen on port %d: %v", port, err)
	}
	return ln, nil
}

// acceptLoop queues the requests a PSP receives for the poller.
func (s *session) acceptLoop(p *psp) {
	defer s.loops.Done()
	for {
		req, err := p.ln.Accept(context.Background())
		if err != nil {
			return
		}
		s.queue(pendingEvent{psp: p, req: req})
		if p.rsp != nil {
			p.ln.Close() // an RSP takes one request
			return
		}
	}
}

func (s *session) createPSP(req *ctl.CreatePSP) (any, []*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startPSP(&psp{provider: req.ProviderEP}, req.EVD, req.Port, "a PSP")
}

func (s *session) createRSP(req *ctl.CreateRSP) (any, []*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	target, err := get[*ep](s, req.EP, "EP")
	if err != nil {
		return nil, nil, err
	}
	if target.state != ctl.EPUnconnected {
		return nil, nil, fail(ctl.InvalidState, "RSP on an EP in %s", ctl.EPStateName(target.state))
	}
	// Reserved before the accept loop starts, back if it does not.
	target.setState(ctl.EPReserved)
	reply, files, err := s.startPSP(&psp{rsp: target}, req.EVD, req.Port, "an RSP")
	if err != nil {
		target.setState(ctl.EPUnconnected)
	}
	return reply, files, err
}

// startPSP is what PSPs and RSPs share: a connection request EVD, a
// listener on the port, a handle, and the accept loop; s.mu is held.
func (s *session) startPSP(p *psp, evd uint32, port uint16, what string) (any, []*os.File, error) {
	e, err := s.evdFor(evd, ctl.EVDCR, "connection request")
	if err != nil {
		return nil, nil, err
	}
	if e == nil {
		return nil, nil, fail(ctl.InvalidParameter, "%s needs a connection request EVD", what)
	}
	if err := s.mayBind(port); err != nil {
		return nil, nil, err
	}
	// A port this session reserved is the listener's now; one another
	// holds is not to be had.
	rh, r := s.reservationOf(port)
	if port != 0 && s.srv.ports.heldByOther(port, r) {
		return nil, nil, fail(ctl.InvalidState, "port %d is reserved", port)
	}
	if r != nil {
		unix.Close(r.fd)
		r.fd = -1
	}
	if p.ln, err = s.listen(port); err != nil {
		if r != nil {
			if fd, _, berr := bindTCP(s.srv.addr, port); berr == nil {
				r.fd = fd // held again
			}
		}
		return nil, nil, err
	}
	if r != nil {
		s.forget(rh)
		s.srv.ports.release(r)
	}
	p.evd = e
	if p.h, err = s.add(p); err != nil {
		p.ln.Close()
		return nil, nil, err
	}
	e.refs++
	// Listening is the last step: requests may arrive at once.
	s.loops.Add(1)
	go s.acceptLoop(p)
	return &ctl.Handle{H: p.h}, nil, nil
}

// freePSP stops listening: later requests find nobody (digest 003 §1);
// requests already received are unaffected.
func (s *session) freePSP(h uint32) error {
	s.mu.Lock()
	p, err := get[*psp](s, h, "PSP")
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.forget(h)
	p.evd.refs--
	if p.rsp != nil && p.rsp.state == ctl.EPReserved {
		p.rsp.setState(ctl.EPUnconnected)
	}
	s.mu.Unlock()
	return p.ln.Close()
}

func (s *session) acceptCR(req *ctl.AcceptCR) error {
	s.mu.Lock()
	c, err := get[*cr](s, req.CR, "CR")
	if err != nil {
		s.mu.Unlock()
		return err
	}
	target := c.ep
	if req.EP != 0 {
		if target, err = get[*ep](s, req.EP, "EP"); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	switch {
	case target == nil:
		s.mu.Unlock()
		return fail(ctl.InvalidParameter, "accept needs an EP")
	case target != c.ep && target.state != ctl.EPUnconnected,
		target == c.ep && target.state != ctl.EPTentativePending && target.state != ctl.EPPassivePending:
		st := target.state
		s.mu.Unlock()
		return fail(ctl.InvalidState, "accept on an EP in %s", ctl.EPStateName(st))
	case target.ib != nil:
		s.mu.Unlock()
		return fail(ctl.InvalidState, "accept on EP %d, which waits for an InfiniBand-style connection", target.h)
	case target.qp == nil:
		s.mu.Unlock()
		return fail(ctl.InvalidState, "EP %d has no PZ, so no QP: set one with ModifyEP", target.h)
	case target.conn == nil:
		s.mu.Unlock()
		return fail(ctl.InvalidState, "EP %d has no connect EVD", target.h)
	case len(req.PrivateData) > int(s.srv.iaAttr().MaxPrivate):
		s.mu.Unlock()
		return fail(ctl.InvalidParameter, "%d octets of private data", len(req.PrivateData))
	}
	if c.ssp != nil {
		// Seed 004: the switch of a live connection needs a posted
		// receive. Refused before anything changes: the CR stays,
		// for an Accept once one is posted, or a Reject.
		s.drainRQ(target)
		if target.qp.PostedRecvs() == 0 {
			s.mu.Unlock()
			return fail(ctl.InvalidState, "post a receive before switching the socket to RDMA")
		}
	}
	entry := target.state
	target.setState(ctl.EPCompletionPending)
	target.remote = c.req.RemoteAddr.String()
	target.local = c.req.LocalAddr.String()
	target.peerPD = c.req.PrivateData
	s.forget(c.h)
	q := target.qp
	// Receives the client posted before accepting must be in the QP
	// before the peer's first Send can arrive: iWARP has no RNR retry.
	s.drainRQ(target)
	s.mu.Unlock()
	if err := c.req.Accept(q, req.PrivateData); err != nil {
		s.mu.Lock()
		target.setState(entry) // roll back to the entry state
		s.mu.Unlock()
		if errors.Is(err, rnic.ErrAnswered) {
			return fail(ctl.InvalidState, "the connection request timed out or was answered")
		}
		return fail(ctl.InvalidState, "accept: %v", err)
	}
	return nil
}

func (s *session) rejectCR(req *ctl.RejectCR) error {
	s.mu.Lock()
	c, err := get[*cr](s, req.CR, "CR")
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.forget(c.h)
	if c.ep != nil {
		if (c.psp != nil && c.psp.rsp != nil) || (c.ssp != nil && c.ssp.ep != nil) {
			c.ep.setState(ctl.EPUnconnected)
		} else {
			s.dropEP(c.ep) // the provider's EP goes with its request
		}
	}
	s.mu.Unlock()
	if err := c.req.Reject(req.PrivateData); err != nil && !errors.Is(err, rnic.ErrAnswered) {
		return fail(ctl.InternalError, "reject: %v", err)
	}
	return nil
}

// connectEvent maps a failed connect to its DAT event. A refused one
// (nothing listens on the port) is NON_PEER_REJECTED: the peer's host was
// reached and answered, and DAT keeps UNREACHABLE for a host that cannot
// be reached or does not answer (seed 000, dat_ep_connect).
func connectEvent(err error) uint32 {
	var rej *rnic.RejectedError
	switch {
	case errors.As(err, &rej):
		return ctl.EvPeerRejected
	case errors.Is(err, rnic.ErrRefused):
		return ctl.EvNonPeerRejected
	case errors.Is(err, rnic.ErrUnreachable):
		return ctl.EvUnreachable
	case errors.Is(err, rnic.ErrTimedOut):
		return ctl.EvTimedOut
	}
	return ctl.EvNonPeerRejected
}
