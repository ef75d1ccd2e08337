package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/fdpass"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/rnic"
)

// Limits per session.
const (
	maxObjects  = 1 << 16
	maxEVDDepth = 1 << 16
	maxQueue    = 1 << 14
	maxLMR      = 1 << 40
	maxFDs      = 4
)

// session is one client connection and everything it created.
type session struct {
	srv  *Server
	conn *net.UnixConn
	id   uint32
	cred *unix.Ucred

	mu      sync.Mutex
	objects map[uint32]any
	// eps and evds are the objects the data path visits on every step,
	// rebuilt from objects when one is added or freed (dpStale): a
	// session with thousands of LMRs costs the poller nothing for them.
	eps     []*ep
	evds    []*evd
	dpStale bool
	next    uint32
	// owners maps a QPN to its EP's handle, for completions: read by
	// pollers without s.mu.
	owners  sync.Map
	closing bool

	doorbell *os.File // the client signals it; the poller sleeps on it
	wake     chan struct{}
	done     chan struct{}

	evMu    sync.Mutex
	pending []pendingEvent

	loops sync.WaitGroup
}

func newSession(srv *Server, c *net.UnixConn, id uint32, cred *unix.Ucred) (*session, error) {
	db, err := shm.NewEventfd()
	if err != nil {
		return nil, err
	}
	return &session{srv: srv, conn: c, id: id, cred: cred, objects: map[uint32]any{},
		doorbell: db, wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// epOf is the handle of the EP whose QP has number qpn, 0 if none.
func (s *session) epOf(qpn uint32) uint32 {
	if h, ok := s.owners.Load(qpn); ok {
		return h.(uint32)
	}
	return 0
}

// kick wakes the poller; it never blocks.
func (s *session) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run serves the session until the client goes away, then frees
// everything it owned.
func (s *session) run() {
	log := s.srv.log.With("session", s.id, "pid", s.cred.Pid, "uid", s.cred.Uid)
	log.Info("session opened")
	s.loops.Add(2)
	go s.poll()
	go s.doorbellLoop()
	buf := make([]byte, ctl.MaxMessage)
	oob := make([]byte, fdpass.OOBSpace(maxFDs))
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			break
		}
		fds := fdpass.Parse(oob[:oobn], "passed")
		reply, out, herr := s.dispatch(buf[:n], fds)
		for _, f := range fds {
			f.Close() // handlers dup what they keep
		}
		if reply == nil {
			// Undecodable: the client broke the protocol.
			log.Warn("protocol violation, closing session", "err", herr)
			break
		}
		_, _, werr := s.conn.WriteMsgUnix(reply, fdpass.Rights(out), nil)
		for _, f := range out {
			f.Close()
		}
		if werr != nil {
			break
		}
	}
	s.close()
	log.Info("session closed")
}

// dispatch decodes one request and returns the encoded reply and the files
// to pass with it; a nil reply means the message could not be parsed.
func (s *session) dispatch(msg []byte, fds []*os.File) ([]byte, []*os.File, error) {
	h, body, err := ctl.ParseHeader(msg)
	if err != nil {
		return nil, nil, err
	}
	rh := ctl.Header{Op: h.Op, ID: h.ID}
	res, out, err := s.handle(h.Op, body, fds)
	if err != nil {
		var ce *ctl.Error
		if !errors.As(err, &ce) {
			ce = &ctl.Error{Status: ctl.InternalError, Message: err.Error()}
		}
		if ce.Status == ctl.ProtocolError {
			return nil, nil, err
		}
		rh.Status = ce.Status
		reply, _ := ctl.Marshal(rh, &ctl.ErrorBody{Message: ce.Message})
		for _, f := range out {
			f.Close()
		}
		return reply, nil, nil
	}
	reply, err := ctl.Marshal(rh, res)
	if err != nil {
		rh.Status = ctl.InternalError
		reply, _ = ctl.Marshal(rh, &ctl.ErrorBody{Message: err.Error()})
	}
	return reply, out, nil
}

func fail(st ctl.Status, format string, args ...any) error {
	return &ctl.Error{Status: st, Message: fmt.Sprintf(format, args...)}
}

func (s *session) handle(op ctl.Op, body []byte, fds []*os.File) (any, []*os.File, error) {
	decode := func(v any) error {
		if err := ctl.Unmarshal(body, v); err != nil {
			return &ctl.Error{Status: ctl.ProtocolError, Message: fmt.Sprintf("%v: %v", op, err)}
		}
		return nil
	}
	var handle ctl.Handle
	switch op {
	case ctl.OpHello:
		var req ctl.Hello
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		db, err := dupFile(s.doorbell)
		if err != nil {
			return nil, nil, err
		}
		return &ctl.HelloReply{Session: s.id, IA: s.srv.iaAttr()}, []*os.File{db}, nil
	case ctl.OpQueryIA:
		a := s.srv.iaAttr()
		return &a, nil, decode(&struct{}{})
	case ctl.OpCreatePZ:
		if err := decode(&struct{}{}); err != nil {
			return nil, nil, err
		}
		return s.createPZ()
	case ctl.OpFreePZ, ctl.OpFreeLMR, ctl.OpFreeEVD, ctl.OpFreeEP, ctl.OpFreePSP, ctl.OpResetEP, ctl.OpQueryEP, ctl.OpQueryCR:
		if err := decode(&handle); err != nil {
			return nil, nil, err
		}
		return s.handleOne(op, handle.H)
	case ctl.OpRegisterLMR:
		var req ctl.RegisterLMR
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		if len(fds) != 1 {
			return nil, nil, fail(ctl.InvalidParameter, "RegisterLMR needs one memfd, got %d descriptors", len(fds))
		}
		return s.registerLMR(&req, fds[0])
	case ctl.OpCreateEVD:
		var req ctl.CreateEVD
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return s.createEVD(&req)
	case ctl.OpCreateEP:
		var req ctl.CreateEP
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return s.createEP(&req.Attr, nil)
	case ctl.OpModifyEP:
		var req ctl.ModifyEP
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return s.modifyEP(&req)
	case ctl.OpConnect:
		var req ctl.Connect
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return nil, nil, s.connect(&req)
	case ctl.OpDisconnect:
		var req ctl.Disconnect
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return nil, nil, s.disconnect(&req)
	case ctl.OpCreatePSP:
		var req ctl.CreatePSP
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return s.createPSP(&req)
	case ctl.OpCreateRSP:
		var req ctl.CreateRSP
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return s.createRSP(&req)
	case ctl.OpAcceptCR:
		var req ctl.AcceptCR
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return nil, nil, s.acceptCR(&req)
	case ctl.OpRejectCR:
		var req ctl.RejectCR
		if err := decode(&req); err != nil {
			return nil, nil, err
		}
		return nil, nil, s.rejectCR(&req)
	case ctl.OpStats:
		if err := decode(&struct{}{}); err != nil {
			return nil, nil, err
		}
		c := s.srv.Counts()
		return &ctl.StatsReply{Sessions: uint32(c["sessions"]), PZ: uint32(c["pz"]), LMR: uint32(c["lmr"]),
			EVD: uint32(c["evd"]), EP: uint32(c["ep"]), PSP: uint32(c["psp"]), CR: uint32(c["cr"]), Stalls: s.srv.Stalls()}, nil, nil
	}
	return nil, nil, fail(ctl.NotImplemented, "operation %v", op)
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

func (s *Server) iaAttr() ctl.IAAttr {
	return ctl.IAAttr{Name: s.opts.Iface, Datapath: s.opts.Datapath, Address: s.addr.String(), MaxEP: maxObjects,
		MaxEVD: maxObjects, MaxEVDDepth: maxEVDDepth, MaxLMRSize: maxLMR, MaxPrivate: 256 - 4, MaxSGE: shm.RingSGE,
		MaxIRD: 64, MaxORD: 64, MaxSQ: maxQueue, MaxRQ: maxQueue, DaemonVersion: "softrnicd/0.1"}
}

// add registers an object under a new handle; s.mu held.
func (s *session) add(o any) (uint32, error) {
	if len(s.objects) >= maxObjects {
		return 0, fail(ctl.InsufficientResources, "%d objects in this session", len(s.objects))
	}
	for {
		s.next++
		if s.next != 0 && s.objects[s.next] == nil {
			break
		}
	}
	s.objects[s.next] = o
	s.noteDataPath(o)
	return s.next, nil
}

// forget removes handle h; s.mu held.
func (s *session) forget(h uint32) {
	s.noteDataPath(s.objects[h])
	delete(s.objects, h)
}

func (s *session) noteDataPath(o any) {
	switch o.(type) {
	case *ep, *evd:
		s.dpStale = true
	}
}

// dataPath returns the session's EPs and EVDs; s.mu held.
func (s *session) dataPath() ([]*ep, []*evd) {
	if s.dpStale {
		s.dpStale = false
		s.eps, s.evds = s.eps[:0], s.evds[:0]
		for _, o := range s.objects {
			switch o := o.(type) {
			case *ep:
				s.eps = append(s.eps, o)
			case *evd:
				s.evds = append(s.evds, o)
			}
		}
	}
	return s.eps, s.evds
}

// get finds a handle of type T; s.mu held.
func get[T any](s *session, h uint32, what string) (T, error) {
	o, ok := s.objects[h].(T)
	if !ok {
		return o, fail(ctl.InvalidHandle, "no %s %d in this session", what, h)
	}
	return o, nil
}

type pz struct {
	h    uint32
	pd   *rnic.PD
	refs int
}

type lmr struct {
	h       uint32
	pz      *pz
	mr      *rnic.MR
	mapping []byte
}

func (s *session) createPZ() (any, []*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pd, err := s.srv.dev.AllocPD()
	if err != nil {
		return nil, nil, fail(ctl.InsufficientResources, "%v", err)
	}
	p := &pz{pd: pd}
	h, err := s.add(p)
	if err != nil {
		return nil, nil, err
	}
	p.h = h
	return &ctl.CreatePZReply{PZ: h}, nil, nil
}

// registerLMR maps the client's memfd range and registers it. The memfd
// must be sealed against shrinking, so the mapping can never fault.
func (s *session) registerLMR(req *ctl.RegisterLMR, f *os.File) (any, []*os.File, error) {
	if req.Length == 0 || req.Length > maxLMR || req.Offset%uint64(os.Getpagesize()) != 0 || req.Offset+req.Length < req.Offset {
		return nil, nil, fail(ctl.InvalidParameter, "LMR offset %d length %d", req.Offset, req.Length)
	}
	if req.Access&^0xf != 0 {
		return nil, nil, fail(ctl.InvalidParameter, "access bits %#x", req.Access)
	}
	if err := shm.CheckSealed(f, int64(req.Offset+req.Length)); err != nil {
		return nil, nil, fail(ctl.InvalidParameter, "LMR memory: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := get[*pz](s, req.PZ, "PZ")
	if err != nil {
		return nil, nil, err
	}
	m, err := shm.Map(f, int64(req.Offset), int(req.Length))
	if err != nil {
		return nil, nil, fail(ctl.InsufficientResources, "%v", err)
	}
	mr, err := s.srv.dev.RegisterMR(p.pd, m, req.VA, qp.Access(req.Access))
	if err != nil {
		_ = shm.Unmap(m)
		return nil, nil, fail(ctl.InvalidParameter, "%v", err)
	}
	l := &lmr{pz: p, mr: mr, mapping: m}
	h, err := s.add(l)
	if err != nil {
		_ = mr.Deregister()
		_ = shm.Unmap(m)
		return nil, nil, err
	}
	l.h = h
	p.refs++
	return &ctl.RegisterLMRReply{LMR: h, STag: mr.STag}, nil, nil
}

// evd is an event dispatcher: a ring in shared memory the poller produces
// into, an eventfd to wake the client, and for DTO EVDs the engine's CQ.
type evd struct {
	h      uint32
	flags  uint8
	mem    *shm.Memfd
	ring   *shm.Ring
	notify *os.File
	cq     *completion.CQ
	refs   int
	// ringMu is held by whoever produces into ring, the session or the
	// CQ's poller (evdSource, src: nil where the session alone does),
	// and guards backlog, events that found the ring full.
	ringMu  sync.Mutex
	backlog []shm.EVE
	src     *evdSource
	// produced: the session produced since its last notification
	// check (the poller signals the client itself); s.mu.
	produced bool
	// handOff: the poller left the EVD to the session.
	handOff atomic.Bool
}

// reserve takes a slot in the event ring, asking for room when it is full
// (askRoom); for flushBacklog and emit, whose events are already waiting.
func (e *evd) reserve() ([]byte, error) {
	slot, err := e.ring.Reserve()
	if slot != nil || err != nil {
		return slot, err
	}
	return e.askRoom()
}

// askRoom, for an event ring found full, asks the client to ring the
// doorbell as soon as it takes an event, and then looks once more: either
// that finds room or the client, which takes an event before it checks the
// request, sees it; so a session that then sleeps is woken when there is
// room again. The order matters: set the request, then look.
func (e *evd) askRoom() ([]byte, error) {
	e.ring.WantRoom()
	return e.ring.Reserve()
}

// maxBacklog bounds the events an EVD holds for a client that does not
// read its ring. At the bound the session stops taking the work requests
// whose failures would add more: they wait in the client's rings, whose
// being full is the client's back-pressure, as completions wait in a full
// CQ.
const maxBacklog = 1024

// backlogFull: e can take no more events for now (nil EVDs drop theirs).
func (e *evd) backlogFull() bool { return e != nil && len(e.backlog) >= maxBacklog }

func roundPow2(n uint32) uint32 {
	p := uint32(1)
	for p < n {
		p <<= 1
	}
	return p
}

func (s *session) createEVD(req *ctl.CreateEVD) (any, []*os.File, error) {
	if req.Depth == 0 || req.Depth > maxEVDDepth || req.Flags == 0 || req.Flags&^7 != 0 {
		return nil, nil, fail(ctl.InvalidParameter, "EVD depth %d flags %#x", req.Depth, req.Flags)
	}
	if int(req.Vector) >= s.srv.opts.Pollers {
		return nil, nil, fail(ctl.InvalidParameter, "vector %d of %d", req.Vector, s.srv.opts.Pollers)
	}
	entries := roundPow2(req.Depth)
	mem, err := shm.NewMemfd("softrnic-evd", shm.RingSize(entries, shm.EVESize))
	if err != nil {
		return nil, nil, fail(ctl.InsufficientResources, "%v", err)
	}
	ring, _ := shm.NewRing(mem.Mem, entries, shm.EVESize)
	notify, err := shm.NewEventfd()
	if err != nil {
		mem.Close()
		return nil, nil, fail(ctl.InsufficientResources, "%v", err)
	}
	e := &evd{flags: req.Flags, mem: mem, ring: ring, notify: notify}
	if req.Flags&ctl.EVDDTO != 0 {
		// An armed CQ wakes whoever forwards its completions.
		e.cq, err = completion.New(completion.Options{Depth: int(entries), Vector: int(req.Vector), Handler: func(*completion.CQ) {
			if e.src != nil {
				e.src.pl.Wake()
			} else {
				s.kick()
			}
		}})
		if err != nil {
			mem.Close()
			notify.Close()
			return nil, nil, fail(ctl.InvalidParameter, "%v", err)
		}
		if pl := s.srv.dev.Poller(int(req.Vector)); pl != nil {
			if src := (&evdSource{s: s, e: e, pl: pl}); pl.AddSource(src) == nil {
				e.src = src
			}
		}
	}
	s.mu.Lock()
	h, err := s.add(e)
	s.mu.Unlock()
	if err != nil {
		mem.Close()
		notify.Close()
		return nil, nil, err
	}
	e.h = h
	ringFD, err1 := dupFile(mem.File)
	notifyFD, err2 := dupFile(notify)
	if err := errors.Join(err1, err2); err != nil {
		for _, f := range []*os.File{ringFD, notifyFD} {
			if f != nil {
				f.Close()
			}
		}
		return nil, nil, fail(ctl.InsufficientResources, "%v", err)
	}
	return &ctl.CreateEVDReply{EVD: h, Entries: entries}, []*os.File{ringFD, notifyFD}, nil
}

// handleOne serves the requests that take one handle.
func (s *session) handleOne(op ctl.Op, h uint32) (any, []*os.File, error) {
	switch op {
	case ctl.OpFreePZ:
		s.mu.Lock()
		defer s.mu.Unlock()
		p, err := get[*pz](s, h, "PZ")
		if err != nil {
			return nil, nil, err
		}
		if p.refs > 0 {
			return nil, nil, fail(ctl.InvalidState, "PZ %d in use by %d LMRs or EPs", h, p.refs)
		}
		if err := p.pd.Free(); err != nil {
			return nil, nil, fail(ctl.InvalidState, "%v", err)
		}
		s.forget(h)
		return nil, nil, nil
	case ctl.OpFreeLMR:
		s.mu.Lock()
		defer s.mu.Unlock()
		l, err := get[*lmr](s, h, "LMR")
		if err != nil {
			return nil, nil, err
		}
		if err := l.mr.Deregister(); err != nil {
			return nil, nil, fail(ctl.InvalidState, "%v", err)
		}
		_ = shm.Unmap(l.mapping)
		l.pz.refs--
		s.forget(h)
		return nil, nil, nil
	case ctl.OpFreeEVD:
		s.mu.Lock()
		defer s.mu.Unlock()
		e, err := get[*evd](s, h, "EVD")
		if err != nil {
			return nil, nil, err
		}
		if e.refs > 0 {
			return nil, nil, fail(ctl.InvalidState, "EVD %d in use by %d EPs or PSPs", h, e.refs)
		}
		e.free()
		s.forget(h)
		return nil, nil, nil
	case ctl.OpFreeEP:
		return nil, nil, s.freeEP(h)
	case ctl.OpResetEP:
		return nil, nil, s.resetEP(h)
	case ctl.OpQueryEP:
		return s.queryEP(h)
	case ctl.OpFreePSP:
		return nil, nil, s.freePSP(h)
	case ctl.OpQueryCR:
		s.mu.Lock()
		defer s.mu.Unlock()
		c, err := get[*cr](s, h, "CR")
		if err != nil {
			return nil, nil, err
		}
		info := &ctl.CRInfo{PrivateData: c.req.PrivateData, RemoteAddr: c.req.RemoteAddr.String(), LocalAddr: c.req.LocalAddr.String()}
		if c.ep != nil {
			info.EP = c.ep.h
		}
		return info, nil, nil
	}
	return nil, nil, fail(ctl.NotImplemented, "operation %v", op)
}

func (e *evd) free() {
	if e.src != nil {
		// Synchronous: the poller touches the ring no more. src
		// stays: the CQ's handler may still read it.
		_ = e.src.pl.RemoveSource(e.src)
	}
	e.mem.Close()
	e.notify.Close()
}

// counts of this session's objects.
func (s *session) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, o := range s.objects {
		switch o.(type) {
		case *pz:
			out["pz"]++
		case *lmr:
			out["lmr"]++
		case *evd:
			out["evd"]++
		case *ep:
			out["ep"]++
		case *psp:
			out["psp"]++
		case *cr:
			out["cr"]++
		}
	}
	return out
}

// disconnectAll starts a graceful disconnect of every EP whose QP is
// connected, including one whose Established the poller has not applied
// yet: its peer must see a FIN, not the reset of the session's end.
func (s *session) disconnectAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.objects {
		e, ok := o.(*ep)
		if !ok || e.qp == nil {
			continue
		}
		switch e.state {
		case ctl.EPActivePending, ctl.EPCompletionPending:
			if e.qp.State() != qp.RTS {
				continue
			}
		case ctl.EPConnected:
		default:
			continue
		}
		s.drainRings(e)
		e.state = ctl.EPDisconnectPending
		e.qp.Disconnect(true)
	}
}

// waitDisconnected waits until no QP of the session has a live connection
// or one being set up, or the deadline. A connection that comes up
// meanwhile is disconnected gracefully too.
func (s *session) waitDisconnected(deadline time.Time) {
	for time.Now().Before(deadline) {
		s.disconnectAll()
		live := false
		s.mu.Lock()
		for _, o := range s.objects {
			e, ok := o.(*ep)
			if !ok || e.qp == nil || e.qp.Ended() {
				continue
			}
			switch e.state {
			case ctl.EPDisconnectPending, ctl.EPActivePending, ctl.EPCompletionPending:
				live = true
			}
		}
		s.mu.Unlock()
		if !live {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rejectPending answers the connection requests that reached the
// session but that its poller had not made CRs of when the session ended
// (the poller applies nothing once closing): nobody will, and the peer
// must not wait for its request timeout. Call it once the accept loops
// have ended.
func (s *session) rejectPending() {
	s.evMu.Lock()
	pending := s.pending
	s.pending = nil
	s.evMu.Unlock()
	for _, pe := range pending {
		if pe.req != nil {
			_ = pe.req.Reject(nil)
		}
	}
}

// close frees everything the session owned: connections are aborted (the
// peers see a reset), listeners closed, requests rejected, memory unmapped.
func (s *session) close() {
	s.mu.Lock()
	s.closing = true
	var eps []*ep
	var psps []*psp
	var crs []*cr
	for _, o := range s.objects {
		switch o := o.(type) {
		case *ep:
			if o.cancelConnect != nil {
				o.cancelConnect() // a connect in progress stops at once
			}
			eps = append(eps, o)
		case *psp:
			psps = append(psps, o)
		case *cr:
			crs = append(crs, o)
		}
	}
	s.mu.Unlock()
	for _, p := range psps {
		p.ln.Close()
	}
	for _, c := range crs {
		_ = c.req.Reject(nil)
	}
	for _, e := range eps {
		if e.qp != nil {
			e.qp.Destroy()
		}
	}
	close(s.done)
	s.doorbell.Close()
	s.loops.Wait()
	s.rejectPending()

	s.mu.Lock()
	defer s.mu.Unlock()
	// Dependency order: EPs, then EVDs and LMRs (no QP holds them now),
	// then PZs.
	for _, kind := range []int{0, 1, 2} {
		for h, o := range s.objects {
			switch o := o.(type) {
			case *ep:
				if kind == 0 {
					unpoll(o)
					if o.rings != nil {
						o.rings.Close()
					}
					s.forget(h)
				}
			case *evd:
				if kind == 1 {
					o.free()
					s.forget(h)
				}
			case *lmr:
				if kind == 1 {
					if err := o.mr.Deregister(); err != nil {
						s.srv.log.Error("LMR still held at session end", "stag", o.mr.STag, "err", err)
						continue // leak the mapping rather than unmap memory in use
					}
					_ = shm.Unmap(o.mapping)
					s.forget(h)
				}
			case *pz:
				if kind == 2 {
					_ = o.pd.Free()
					s.forget(h)
				}
			default:
				s.forget(h)
			}
		}
	}
	s.conn.Close()
}
