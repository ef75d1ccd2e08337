package daemon

// InfiniBand-style connections (ctl.ConnectQP).
//
// A verbs program written for InfiniBand connects its QPs without the
// RDMA-CM: the two sides swap QP numbers and addresses over a TCP socket of
// their own, then each calls ibv_modify_qp to RTR naming the peer's QP
// (dest_qp_num) and address (the GRH's dgid, or a LID), then to RTS.
// perftest without -R and qperf without -cm1 do. On iWARP a QP needs an
// LLP connection, TCP and MPA, which one side must open and the other
// accept; this file makes it from what the two RTRs give:
//
//   - Each side knows (local IPv4, local QPN) and (remote IPv4, remote
//     QPN); the lower pair, by address then QPN, is active, the other
//     passive, so both agree without talking.
//   - Every daemon listens on one IB-connection port (Options.IBConnPort,
//     DefaultIBConnPort), on either datapath. The active side's daemon
//     connects its QP there, with MPA revision 2 and the QP's own MPA
//     choices (peer-to-peer, RTR), and an MPA Request whose private data
//     names both QPs (ibPrivate).
//   - The passive side's RTR registers an expectation: "a connection from
//     (remote IPv4, remote QPN) for my QPN". A request is accepted on the
//     QP it names when the expectation matches its source address (the
//     TCP connection's) and source QPN. A request that comes first is
//     parked for at most IBConnParkTimeout, and then rejected with
//     ibNotYet, which the active side answers by trying again; an
//     expectation that sees no connection within IBConnTimeout fails the
//     QP: the EP goes to DISCONNECTED, the QP to ERR, posts flush. The
//     active side gives up after the same time, the same way.
//   - Anything else on the port is rejected: private data too short, not
//     ours (magic, version), a QPN nobody expects, a QPN whose owner
//     expects another peer. rnic's listener bounds the wait for an MPA
//     Request (a peer that connects and stalls, one that sends garbage).
//
// Trust: the request's source address (the TCP connection's) and source
// QPN (its private data) are the peer's word. InfiniBand stamps the
// source QPN in the HCA; here any process that can connect from the
// peer's address and knows both QPNs can take a waiting QP. QPNs are
// random (rnic's newQPN: 24 bits each, 48 to guess), but the programs
// print them. The README says so; what would close it is a proof
// that the request comes from the peer's daemon (a privileged source port
// on both datapaths, or a key the daemons share).
//
// Goroutines: one accept loop per Server (ibListener.acceptLoop) takes requests
// from the listener and matches or parks them; a matched request is
// accepted by a short-lived goroutine that close waits for (acceptIB), the active
// side's connect runs in one (connectIB), and an expectation's timer fires
// in its own. ib.mu guards expect and parked; it is taken under a
// session's mu (unconfigureEP forgets an EP's expectation) and never the
// other way round: what a match finds is acted on after ib.mu is released.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/rnic"
)

// DefaultIBConnPort is the TCP port on which softrnicd takes the
// connections of QPs connected the InfiniBand way. It keeps clear of the
// ports RDMA programs listen on by default: 7471 (every librdmacm example:
// ucmatose, cmtime, rdma_server, rstream, riostream), 7174 (rping), 18515
// (perftest), 19765 (qperf), 4420 (NVMe-oF), 3260 (iSER), 20049 (NFS over
// RDMA); and below Linux's ephemeral range (32768 on).
const DefaultIBConnPort = 17471

// Defaults of Options.IBConnTimeout and IBConnParkTimeout.
const (
	DefaultIBConnTimeout     = 15 * time.Second
	DefaultIBConnParkTimeout = 4 * time.Second
)

// maxParked bounds the requests parked for an expectation not yet made; a
// request beyond it is rejected at once.
const maxParked = 256

// The private data of IB-connection MPA messages: magic "SRIB", version,
// a reason (rejects), two reserved octets, the sender's QPN and the QPN
// it is meant for, all big-endian. The Reply carries the same with the
// roles swapped, for the active side to check whom it reached.
const (
	ibMagic      = 0x53524942 // "SRIB"
	ibVersion    = 1
	ibPrivateLen = 16
)

// Reasons of a rejection (octet 5 of the private data).
const (
	ibOK        = 0
	ibMalformed = 1 // not an IB-connection request, or not this version
	ibNotYet    = 2 // nobody expects it (yet): the active side tries again
	ibOther     = 3 // the QP expects a connection from another peer
	ibBusy      = 4 // too many requests parked
)

// ibPrivate encodes the private data of an IB-connection message.
func ibPrivate(reason uint8, src, dst uint32) []byte {
	b := make([]byte, ibPrivateLen)
	binary.BigEndian.PutUint32(b[0:], ibMagic)
	b[4] = ibVersion
	b[5] = reason
	binary.BigEndian.PutUint32(b[8:], src)
	binary.BigEndian.PutUint32(b[12:], dst)
	return b
}

// parseIBPrivate decodes it; ok is false for anything else. Octets past
// the 16 are allowed, for a later version that appends.
func parseIBPrivate(b []byte) (reason uint8, src, dst uint32, ok bool) {
	if len(b) < ibPrivateLen || binary.BigEndian.Uint32(b) != ibMagic || b[4] != ibVersion {
		return 0, 0, 0, false
	}
	return b[5], binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:]), true
}

// ibActive reports whether the local side of a pair connects: the lower
// (address, QPN).
func ibActive(local netip.Addr, lqpn uint32, remote netip.Addr, rqpn uint32) bool {
	if c := local.Compare(remote); c != 0 {
		return c < 0
	}
	return lqpn < rqpn
}

// expectation is a passive QP's registration.
type expectation struct {
	sess      *session
	e         *ep
	qpn       uint32
	remote    netip.Addr
	remoteQPN uint32
	timer     *time.Timer
}

// parkedRequest is a request that came before its expectation; its
// timer rejects it with ibNotYet.
type parkedRequest struct {
	req      *rnic.ConnRequest
	src, dst uint32
	from     netip.Addr
	timer    *time.Timer
}

// ibListener is the daemon's IB-connection port.
type ibListener struct {
	srv     *Server
	ln      *rnic.Listener
	port    uint16
	timeout time.Duration // of an expectation, and of an active connect
	park    time.Duration
	loops   sync.WaitGroup

	mu     sync.Mutex
	expect map[uint32]*expectation // by the passive QP's QPN
	parked []*parkedRequest
	closed bool
}

// startIB listens on the IB-connection port; nil when it is off. A port
// that cannot be had is not fatal (another daemon on the address holds
// it): the daemon logs it and refuses ConnectQP.
func (s *Server) startIB() *ibListener {
	port := s.opts.IBConnPort
	if port < 0 {
		return nil
	}
	if port == 0 {
		port = DefaultIBConnPort
	}
	l := &ibListener{srv: s, port: uint16(port), timeout: s.opts.IBConnTimeout, park: s.opts.IBConnParkTimeout,
		expect: map[uint32]*expectation{}}
	if l.timeout <= 0 {
		l.timeout = DefaultIBConnTimeout
	}
	if l.park <= 0 {
		l.park = DefaultIBConnParkTimeout
	}
	// The listener's own bound is the wait for the MPA Request (a peer
	// that connects and stalls). A parked request is rejected by its
	// timer first, with the reason that has the active side try again;
	// one matched is accepted as soon as the EP's session lets its
	// goroutine in, however late in the park time it was matched, so the
	// answer's bound is the park time and a whole connect's more.
	ln, err := s.dev.Listen(net.JoinHostPort(s.addr.String(), strconv.Itoa(port)),
		rnic.ListenOptions{RequestTimeout: l.park + time.Second, AnswerTimeout: l.park + l.timeout})
	if err != nil {
		s.log.Warn("IB-connection port not listening: QPs connected without the RDMA-CM will fail", "port", port, "err", err)
		return nil
	}
	l.ln = ln
	l.loops.Add(1)
	go l.acceptLoop()
	return l
}

// close stops listening; parked requests are rejected, expectations'
// timers stopped (their sessions are ending too).
func (l *ibListener) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	parked := l.parked
	l.parked = nil
	for _, x := range l.expect {
		if x.timer != nil {
			x.timer.Stop()
		}
	}
	clear(l.expect)
	l.mu.Unlock()
	l.ln.Close()
	l.loops.Wait()
	for _, p := range parked {
		p.timer.Stop()
		_ = p.req.Reject(ibPrivate(ibNotYet, p.dst, p.src))
	}
}

func (l *ibListener) acceptLoop() {
	defer l.loops.Done()
	for {
		req, err := l.ln.Accept(context.Background())
		if err != nil {
			return
		}
		l.offer(req)
	}
}

// offer matches a request to an expectation, parks it, or rejects it.
func (l *ibListener) offer(req *rnic.ConnRequest) {
	_, src, dst, ok := parseIBPrivate(req.PrivateData)
	from, _ := netip.AddrFromSlice(req.RemoteAddr.IP)
	from = from.Unmap()
	if !ok {
		l.srv.log.Debug("IB-connection request not ours: rejected", "from", req.RemoteAddr, "private", len(req.PrivateData))
		_ = req.Reject(ibPrivate(ibMalformed, 0, 0))
		return
	}
	l.mu.Lock()
	x := l.expect[dst]
	switch {
	case l.closed:
		l.mu.Unlock()
		_ = req.Reject(ibPrivate(ibNotYet, dst, src))
	case x != nil && (x.remote != from || x.remoteQPN != src):
		l.mu.Unlock()
		l.srv.log.Debug("IB-connection request from a peer the QP does not expect: rejected", "from", req.RemoteAddr, "src_qpn", src, "qpn", dst)
		_ = req.Reject(ibPrivate(ibOther, dst, src))
	case x != nil:
		l.take(x)
		l.spawnAccept(x, req)
		l.mu.Unlock()
	default:
		if len(l.parked) >= maxParked {
			l.mu.Unlock()
			_ = req.Reject(ibPrivate(ibBusy, dst, src))
			return
		}
		p := &parkedRequest{req: req, src: src, dst: dst, from: from}
		l.parked = append(l.parked, p)
		p.timer = time.AfterFunc(l.park, func() { l.unpark(p) })
		l.mu.Unlock()
	}
}

// unpark rejects a parked request nobody came for.
func (l *ibListener) unpark(p *parkedRequest) {
	l.mu.Lock()
	i := slices.Index(l.parked, p)
	if i >= 0 {
		l.parked = slices.Delete(l.parked, i, i+1)
	}
	l.mu.Unlock()
	if i >= 0 {
		_ = p.req.Reject(ibPrivate(ibNotYet, p.dst, p.src))
	}
}

// take removes x from the expectations (ib.mu held).
func (l *ibListener) take(x *expectation) {
	if l.expect[x.qpn] == x {
		delete(l.expect, x.qpn)
	}
	if x.timer != nil {
		x.timer.Stop()
	}
}

// register makes x an expectation, and hands it a request parked for it;
// s.mu of x's session held (ib.mu is taken under it).
func (l *ibListener) register(x *expectation) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fail(ctl.InvalidState, "daemon closing")
	}
	if l.expect[x.qpn] != nil {
		l.mu.Unlock()
		return fail(ctl.InvalidState, "QP %d already waits for a connection", x.qpn)
	}
	var match *rnic.ConnRequest
	var others []*parkedRequest
	l.parked = slices.DeleteFunc(l.parked, func(p *parkedRequest) bool {
		switch {
		case p.dst != x.qpn:
			return false
		case match == nil && p.from == x.remote && p.src == x.remoteQPN:
			match = p.req
		default:
			others = append(others, p)
		}
		p.timer.Stop()
		return true
	})
	if match == nil {
		l.expect[x.qpn] = x
		x.timer = time.AfterFunc(l.timeout, func() { l.expired(x) })
	} else {
		l.spawnAccept(x, match)
	}
	l.mu.Unlock()
	for _, p := range others {
		_ = p.req.Reject(ibPrivate(ibOther, p.dst, p.src))
	}
	return nil
}

// spawnAccept accepts req on x's QP in a goroutine that close waits for,
// as it waits for the accept loop; l.mu held, l not closed (so the count
// never rises once close waits).
func (l *ibListener) spawnAccept(x *expectation, req *rnic.ConnRequest) {
	l.loops.Add(1)
	go func() {
		defer l.loops.Done()
		x.sess.acceptIB(x, req)
	}()
}

// forget removes an EP's expectation when the EP lets go of it (freed,
// flushed, its session ending); s.mu held.
func (l *ibListener) forget(x *expectation) {
	if l == nil || x == nil {
		return
	}
	l.mu.Lock()
	l.take(x)
	l.mu.Unlock()
}

// expired fails an expectation nobody connected to.
func (l *ibListener) expired(x *expectation) {
	l.mu.Lock()
	if l.expect[x.qpn] != x {
		l.mu.Unlock()
		return // matched or forgotten meanwhile
	}
	delete(l.expect, x.qpn)
	l.mu.Unlock()
	err := fmt.Errorf("no connection from %v QP %d in %v: %w", x.remote, x.remoteQPN, l.timeout, rnic.ErrTimedOut)
	l.srv.logIBFailed(x.sess, x.qpn, err)
	x.sess.queue(pendingEvent{ep: x.e, connectErr: err, ib: x})
}

// connectQP: ctl.ConnectQP. s.mu not held.
func (s *session) connectQP(req *ctl.ConnectQP) (any, []*os.File, error) {
	ib := s.srv.ib
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := get[*ep](s, req.EP, "EP")
	if err != nil {
		return nil, nil, err
	}
	switch {
	case ib == nil:
		return nil, nil, fail(ctl.NotImplemented, "this daemon does not listen on an IB-connection port")
	case e.state != ctl.EPUnconnected || e.ib != nil:
		return nil, nil, fail(ctl.InvalidState, "connect an EP in %s", ctl.EPStateName(e.state))
	case e.qp == nil:
		return nil, nil, fail(ctl.InvalidState, "EP %d has no PZ, so no QP", e.h)
	}
	remote, err := s.srv.ibRemote(req)
	if err != nil {
		return nil, nil, err
	}
	local, lqpn := s.srv.addr, e.qp.QPN()
	if remote == local && req.RemoteQPN == lqpn {
		return nil, nil, fail(ctl.InvalidParameter, "QP %d connected to itself", lqpn)
	}
	peer := netip.AddrPortFrom(remote, ib.port).String()
	// A program written for InfiniBand destroys its QP when it is done,
	// and its peer's QP does not hear of it until it sends.
	e.qp.KeepRecvsAtPeerEnd()
	if !ibActive(local, lqpn, remote, req.RemoteQPN) {
		x := &expectation{sess: s, e: e, qpn: lqpn, remote: remote, remoteQPN: req.RemoteQPN}
		// Receives posted before RTR must be in the QP before the
		// peer's first Send: iWARP has no RNR retry.
		s.drainRQ(e)
		if err := ib.register(x); err != nil {
			return nil, nil, err
		}
		e.ib = x
		e.remote = peer
		return &ctl.ConnectQPReply{Peer: peer}, nil, nil
	}
	e.setState(ctl.EPActivePending)
	e.remote = peer
	s.drainRQ(e)
	ctx, cancel := context.WithCancel(context.Background())
	e.cancelConnect = cancel
	go s.connectIB(ctx, cancel, e, e.qp, peer, lqpn, req.RemoteQPN, ib.timeout)
	return &ctl.ConnectQPReply{Active: true, Peer: peer}, nil, nil
}

// ibRemote is the peer's address of a ConnectQP: given, or made of this
// host's with the LID as its low 16 bits.
func (s *Server) ibRemote(req *ctl.ConnectQP) (netip.Addr, error) {
	if req.RemoteAddr != "" {
		a, err := netip.ParseAddr(req.RemoteAddr)
		if err != nil || !a.Unmap().Is4() {
			return netip.Addr{}, fail(ctl.InvalidParameter, "address %q: want IPv4", req.RemoteAddr)
		}
		return a.Unmap(), nil
	}
	if req.RemoteLID == 0 {
		return netip.Addr{}, fail(ctl.InvalidParameter, "neither an address nor a LID")
	}
	b := s.addr.As4()
	binary.BigEndian.PutUint16(b[2:], req.RemoteLID)
	return netip.AddrFrom4(b), nil
}

// connectIB is the active side: it connects q to the peer daemon's
// IB-connection port until the peer accepts, rejects for good, or the
// time is up. A rejection for want of an expectation (the peer's RTR is
// late) and a refusal (its daemon is starting) are tried again.
func (s *session) connectIB(ctx context.Context, cancel context.CancelFunc, e *ep, q *rnic.QP, peer string, lqpn, rqpn uint32, timeout time.Duration) {
	defer cancel()
	begun, backoff := time.Now(), 5*time.Millisecond
	pdata := ibPrivate(ibOK, lqpn, rqpn)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: s.srv.addr.AsSlice()}, Control: noPortAtBind}
	var err error
	for {
		left := timeout - time.Since(begun)
		if left <= 0 {
			err = fmt.Errorf("connect to %s QP %d: %w", peer, rqpn, rnic.ErrTimedOut)
			break
		}
		var reply []byte
		reply, err = q.Connect(ctx, peer, rnic.ConnectOptions{PrivateData: pdata, Timeout: left, Dialer: dialer})
		if err == nil {
			if _, src, dst, ok := parseIBPrivate(reply); !ok || src != rqpn || dst != lqpn {
				// Not the QP we were told of: end it.
				s.srv.log.Warn("IB connection accepted by another QP: closed", "peer", peer, "want_qpn", rqpn, "private", reply)
				q.Disconnect(false)
			}
			return
		}
		var rej *rnic.RejectedError
		again := errors.Is(err, rnic.ErrRefused)
		if errors.As(err, &rej) {
			reason, _, _, ok := parseIBPrivate(rej.PrivateData)
			again = ok && (reason == ibNotYet || reason == ibBusy)
		}
		if !again || time.Since(begun)+backoff >= timeout {
			break
		}
		select {
		case <-ctx.Done():
			return // the EP or session went: nobody to tell
		case <-time.After(backoff):
			backoff = min(2*backoff, 200*time.Millisecond)
		}
	}
	if ctx.Err() == nil {
		s.srv.logIBFailed(s, lqpn, err)
		s.queue(pendingEvent{ep: e, connectErr: err})
	}
}

// logIBFailed tells the operator of an IB-style connection that was not
// made (the program sees its QP in ERR, or ETIMEDOUT from RTS); a few a
// second, as connections that end.
func (s *Server) logIBFailed(sess *session, qpn uint32, err error) {
	if ok, quiet := s.ended.allow(8); ok {
		s.log.Info("IB-style connection not made", "session", sess.id, "qpn", qpn, "err", err, "since_last_logged", quiet)
	}
}

// acceptIB is the passive side: it accepts req on x's QP, as acceptCR
// does a CR.
func (s *session) acceptIB(x *expectation, req *rnic.ConnRequest) {
	e := x.e
	s.mu.Lock()
	if s.closing || s.objects[e.h] != e || e.ib != x || e.qp == nil || e.state != ctl.EPUnconnected {
		s.mu.Unlock()
		_ = req.Reject(ibPrivate(ibNotYet, x.qpn, x.remoteQPN))
		return
	}
	e.ib = nil
	e.setState(ctl.EPCompletionPending)
	e.remote, e.local = req.RemoteAddr.String(), req.LocalAddr.String()
	e.peerPD = bytes.Clone(req.PrivateData)
	q := e.qp
	s.drainRQ(e)
	s.mu.Unlock()
	if err := req.Accept(q, ibPrivate(ibOK, x.qpn, x.remoteQPN)); err != nil {
		s.queue(pendingEvent{ep: e, connectErr: fmt.Errorf("accept IB connection: %w", err)})
	}
}

// forgetIB gives up the EP's wait for an IB connection; s.mu held.
func (s *session) forgetIB(e *ep) {
	if e.ib != nil {
		s.srv.ib.forget(e.ib)
		e.ib = nil
	}
}

// portOrNone is the port listened on, or -1.
func (l *ibListener) portOrNone() int {
	if l == nil {
		return -1
	}
	return int(l.port)
}
