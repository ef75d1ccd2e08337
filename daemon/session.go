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
	"github.com/softrnic/softrnic/internal/procmem"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/internal/shrink"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/xdpnet"
)

// Limits per session.
const (
	maxObjects  = 1 << 16
	maxEVDDepth = 1 << 16
	maxQueue    = 1 << 14
	maxLMR      = 1 << 40
	maxFDs      = 4
)

// maxMapped bounds the LMR memory a session has the daemon map (the
// daemon's address space is shared by every session); a variable for tests.
var maxMapped uint64 = 1 << 41

// session is one client connection and everything it created.
type session struct {
	srv  *Server
	conn *net.UnixConn
	id   uint32
	cred *unix.Ucred
	// pidfd names the process that connected (peerPidfd), nil if none;
	// the session's until its end.
	pidfd *os.File
	// sender is the process that sent the request being served, as the
	// kernel says it (SCM_CREDENTIALS: the socket has SO_PASSCRED), nil
	// if the message came without (sent before the option was set). Set
	// by run before each dispatch; only the handlers read it.
	sender *unix.Ucred
	// client is what the Hello said the client is (its first 64
	// octets), for the log; run's goroutine only.
	client string

	mu      sync.Mutex
	objects map[uint32]any
	// objectsMost is objects' high-water mark (shrink).
	objectsMost int
	next        uint32
	// mapped is the LMR memory the daemon maps for the session (s.mu):
	// memfd ranges, and the shadows of process memory.
	mapped uint64
	// proc is the memory of the session's process, which its
	// RegisterProcessMemory regions are, opened at the first (s.mu);
	// closed once they are freed at the session's end.
	proc *procmem.Process
	// held are the EPs and EVDs handed to the session that it still
	// holds, produced the EVDs it produced into this step; loop-owned.
	held     []any
	produced []*evd
	// owners maps a QPN to its EP's handle, for completions: read by
	// pollers without s.mu.
	owners  sync.Map
	closing bool

	doorbell *os.File // the client signals it; the poller sleeps on it
	wake     chan struct{}
	done     chan struct{}

	// region is the memory shared with the client, heap carves it into
	// rings; slots finds an EP by the slot the client queues, queues are
	// the ready queues by vector (ready.go). s.mu, but for slots' reads.
	region    *shm.Memfd
	heap      *shm.Heap
	slots     slotTable
	freeSlots []uint32
	nslots    uint32
	queues    []*readyQueue

	// evMu guards what the loop is given: connection events, and the
	// EPs and EVDs their owners hand over (handOff).
	evMu    sync.Mutex
	pending []pendingEvent
	handed  []any

	loops sync.WaitGroup
}

func newSession(srv *Server, c *net.UnixConn, id uint32, cred *unix.Ucred, pidfd *os.File) (*session, error) {
	db, err := shm.NewEventfd()
	if err != nil {
		return nil, err
	}
	region, err := shm.NewMemfd("softrnic-session", regionSize)
	if err != nil {
		db.Close()
		return nil, err
	}
	heap, err := shm.NewHeap(region.Mem, minBlock)
	if err != nil {
		db.Close()
		region.Close()
		return nil, err
	}
	return &session{srv: srv, conn: c, id: id, cred: cred, pidfd: pidfd, objects: map[uint32]any{},
		doorbell: db, wake: make(chan struct{}, 1), done: make(chan struct{}), region: region, heap: heap}, nil
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

// lookWindow is how long a session may stay open without a request beyond
// Hello before it is logged as opened (see run).
const lookWindow = 2 * time.Second

// run serves the session until the client goes away, then frees
// everything it owned.
func (s *session) run() {
	log := s.srv.log.With("session", s.id, "pid", s.cred.Pid, "uid", s.cred.Uid)
	// A session is logged as opened at its first request beyond Hello. One
	// that goes with no more is a look, not a client: a device list, a
	// search for the daemon's socket, made at every program's start, and
	// logged at Debug only. A look takes milliseconds: a session held
	// open for lookWindow without a request beyond Hello is logged too,
	// as idle, so that whoever holds sessions (and their descriptors and
	// mappings) is named at Info.
	var mu sync.Mutex // opened, client: the loop's and the timer's
	opened, client := false, ""
	logOpened := func(idle bool) {
		mu.Lock()
		defer mu.Unlock()
		if opened {
			return
		}
		opened = true
		if idle {
			log.Info("session opened", "client", client, "idle", lookWindow.String())
		} else {
			log.Info("session opened", "client", client)
		}
	}
	open := func(msg []byte) {
		if h, _, err := ctl.ParseHeader(msg); err == nil && h.Op != ctl.OpHello {
			logOpened(false)
		}
	}
	idle := time.AfterFunc(lookWindow, func() { logOpened(true) })
	defer idle.Stop()
	s.loops.Add(2)
	go s.poll()
	go s.doorbellLoop()
	buf := make([]byte, ctl.MaxMessage)
	oob := make([]byte, fdpass.OOBSpace(maxFDs)+unix.CmsgSpace(unix.SizeofUcred))
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			break
		}
		fds := fdpass.Parse(oob[:oobn], "passed")
		s.sender = fdpass.Sender(oob[:oobn])
		mu.Lock()
		looking := !opened
		mu.Unlock()
		if looking {
			open(buf[:n])
		}
		reply, out, herr := s.dispatch(buf[:n], fds)
		if looking {
			mu.Lock()
			client = s.client // the Hello's, for the idle timer
			mu.Unlock()
		}
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
	idle.Stop()
	s.close()
	mu.Lock()
	defer mu.Unlock()
	if opened {
		log.Info("session closed")
	} else {
		opened = true // the idle timer, if it fires now, logs nothing
		log.Debug("session closed after its Hello, if any", "client", s.client)
	}
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
		if ce.Status == ctl.InsufficientResources {
			s.srv.logResources(s, h.Op, ce.Message)
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

// resources is the error of a request that ran out of something: the
// client gets INSUFFICIENT_RESOURCES saying what, and the limit that was
// reached is named (xdpnet.ResourceError), since raising it is the
// operator's remedy.
func resources(what string, err error) error {
	return fail(ctl.InsufficientResources, "%s: %v", what, xdpnet.ResourceError(err))
}

// handler serves one kind of request: it decodes body, the request, and
// calls the session's method with it and fds, the descriptors passed with
// it (closed after; a method dups what it keeps). The files it returns go
// with the reply. A body that does not decode is a ctl.ProtocolError: the
// client broke the protocol, and the session ends.
type handler func(s *session, op ctl.Op, body []byte, fds []*os.File) (any, []*os.File, error)

// handlers is indexed by ctl.Op; an op past its end or without an entry
// is answered NotImplemented.
var handlers = [...]handler{
	ctl.OpHello:         reply((*session).hello),
	ctl.OpQueryIA:       noBody((*session).queryIA),
	ctl.OpCreatePZ:      noBody((*session).createPZ),
	ctl.OpFreePZ:        onHandle((*session).freePZ),
	ctl.OpRegisterLMR:   decoded((*session).registerLMR),
	ctl.OpFreeLMR:       onHandle((*session).freeLMR),
	ctl.OpCreateEVD:     reply((*session).createEVD),
	ctl.OpFreeEVD:       onHandle((*session).freeEVD),
	ctl.OpCreateEP:      reply(func(s *session, req *ctl.CreateEP) (any, []*os.File, error) { return s.createEP(&req.Attr, nil) }),
	ctl.OpModifyEP:      reply((*session).modifyEP),
	ctl.OpQueryEP:       queryHandle((*session).queryEP),
	ctl.OpFreeEP:        onHandle((*session).freeEP),
	ctl.OpConnect:       act((*session).connect),
	ctl.OpDisconnect:    act((*session).disconnect),
	ctl.OpResetEP:       onHandle((*session).resetEP),
	ctl.OpCreatePSP:     reply((*session).createPSP),
	ctl.OpFreePSP:       onHandle((*session).freePSP),
	ctl.OpCreateRSP:     reply((*session).createRSP),
	ctl.OpQueryCR:       queryHandle((*session).queryCR),
	ctl.OpAcceptCR:      act((*session).acceptCR),
	ctl.OpRejectCR:      act((*session).rejectCR),
	ctl.OpStats:         noBody((*session).stats),
	ctl.OpCreateSSP:     decoded((*session).createSSP),
	ctl.OpFreeSSP:       queryHandle((*session).freeSSP),
	ctl.OpQuerySSP:      queryHandle((*session).querySSP),
	ctl.OpSocketConnect: decoded((*session).socketConnect),

	ctl.OpRegisterProcessMemory: reply((*session).registerProcessMemory),
	ctl.OpConnectQP:             reply((*session).connectQP),
	ctl.OpReservePort:           reply((*session).reservePort),
	ctl.OpFreePort:              onHandle((*session).freePort),
	ctl.OpResolveRoute:          act((*session).resolveRoute),
}

// handle serves one request by its op's handler.
func (s *session) handle(op ctl.Op, body []byte, fds []*os.File) (any, []*os.File, error) {
	if int(op) >= len(handlers) || handlers[op] == nil {
		return nil, nil, fail(ctl.NotImplemented, "operation %v", op)
	}
	return handlers[op](s, op, body, fds)
}

// decoded is the handler of requests of type Req: it decodes the body into
// one and calls f. The adapters below fit it to the methods' shapes.
func decoded[Req any](f func(s *session, req *Req, fds []*os.File) (any, []*os.File, error)) handler {
	return func(s *session, op ctl.Op, body []byte, fds []*os.File) (any, []*os.File, error) {
		var req Req
		if err := ctl.Unmarshal(body, &req); err != nil {
			return nil, nil, &ctl.Error{Status: ctl.ProtocolError, Message: fmt.Sprintf("%v: %v", op, err)}
		}
		return f(s, &req, fds)
	}
}

// reply: a method that takes no descriptors and answers.
func reply[Req any](f func(*session, *Req) (any, []*os.File, error)) handler {
	return decoded(func(s *session, req *Req, _ []*os.File) (any, []*os.File, error) { return f(s, req) })
}

// act: a method that only succeeds or fails.
func act[Req any](f func(*session, *Req) error) handler {
	return decoded(func(s *session, req *Req, _ []*os.File) (any, []*os.File, error) { return nil, nil, f(s, req) })
}

// noBody: a request with an empty body.
func noBody(f func(*session) (any, []*os.File, error)) handler {
	return reply(func(s *session, _ *struct{}) (any, []*os.File, error) { return f(s) })
}

// onHandle: a request of one handle (ctl.Handle) that only succeeds or
// fails.
func onHandle(f func(*session, uint32) error) handler {
	return act(func(s *session, req *ctl.Handle) error { return f(s, req.H) })
}

// queryHandle: a request of one handle that answers.
func queryHandle(f func(*session, uint32) (any, []*os.File, error)) handler {
	return reply(func(s *session, req *ctl.Handle) (any, []*os.File, error) { return f(s, req.H) })
}

// hello answers the client's first request with the session and the IA,
// and passes the doorbell and the shared region.
func (s *session) hello(h *ctl.Hello) (any, []*os.File, error) {
	s.client = h.Client
	if len(s.client) > 64 {
		s.client = s.client[:64]
	}
	db, err := dupFile(s.doorbell)
	if err != nil {
		return nil, nil, resources("session doorbell", err)
	}
	region, err := dupFile(s.region.File)
	if err != nil {
		db.Close()
		return nil, nil, resources("session region", err)
	}
	return &ctl.HelloReply{Session: s.id, IA: s.srv.iaAttr(), Region: regionSize}, []*os.File{db, region}, nil
}

func (s *session) queryIA() (any, []*os.File, error) {
	a := s.srv.iaAttr()
	return &a, nil, nil
}

// stats are the daemon's object counts, all sessions.
func (s *session) stats() (any, []*os.File, error) {
	c := s.srv.Counts()
	return &ctl.StatsReply{Sessions: uint32(c["sessions"]), PZ: uint32(c["pz"]), LMR: uint32(c["lmr"]),
		EVD: uint32(c["evd"]), EP: uint32(c["ep"]), PSP: uint32(c["psp"]), CR: uint32(c["cr"]), Stalls: s.srv.Stalls()}, nil, nil
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
		MaxIRD: 64, MaxORD: 64, MaxSQ: maxQueue, MaxRQ: maxQueue, DaemonVersion: "softrnicd/0.1", DatapathCPUs: s.cpus}
}

// datapathCPUs is IAAttr.DatapathCPUs of a datapath with these pollers:
// the CPUs they are pinned to, or every CPU the daemon may run on when
// they are not pinned or there are none (the kernel datapath).
func datapathCPUs(pollers []*xdpnet.Poller) []byte {
	var cpus []int
	for _, p := range pollers {
		if c := p.CPU(); c >= 0 {
			cpus = append(cpus, c)
		} else {
			cpus = nil
			break
		}
	}
	if cpus == nil {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err == nil {
			for c := range 1024 {
				if set.IsSet(c) {
					cpus = append(cpus, c)
				}
			}
		}
	}
	var mask []byte
	for _, c := range cpus {
		for len(mask) <= c/8 {
			mask = append(mask, 0)
		}
		mask[c/8] |= 1 << (c % 8)
	}
	return mask
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
	return s.next, nil
}

// forget removes handle h; s.mu held.
func (s *session) forget(h uint32) {
	delete(s.objects, h)
	s.objects = shrink.Map(s.objects, &s.objectsMost)
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

// lmr is a registered region: a range of a memfd the client passed, which
// mapping maps, or a range of the client's process memory, which mapping
// shadows (registerProcessMemory).
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
		return nil, nil, resources("PZ", err)
	}
	p := &pz{pd: pd}
	h, err := s.add(p)
	if err != nil {
		return nil, nil, err
	}
	p.h = h
	return &ctl.CreatePZReply{PZ: h}, nil, nil
}

// registerLMR maps the client's memfd range, the one descriptor passed,
// and registers it. The memfd must be sealed against shrinking, so the
// mapping can never fault.
func (s *session) registerLMR(req *ctl.RegisterLMR, fds []*os.File) (any, []*os.File, error) {
	if len(fds) != 1 {
		return nil, nil, fail(ctl.InvalidParameter, "RegisterLMR needs one memfd, got %d descriptors", len(fds))
	}
	f := fds[0]
	if req.Length == 0 || req.Length > maxLMR || req.Offset+req.Length < req.Offset {
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
	if s.mapped+req.Length > maxMapped {
		return nil, nil, fail(ctl.InsufficientResources, "LMRs of %d octets mapped for the session, %d more asked, at most %d",
			s.mapped, req.Length, maxMapped)
	}
	// The region may start and end inside a page (ordinary memory a
	// consumer registered, internal/memreg): map whole pages, register
	// exactly the region.
	skip := req.Offset % uint64(os.Getpagesize())
	m, err := shm.Map(f, int64(req.Offset-skip), int(skip+req.Length))
	if err != nil {
		return nil, nil, resources("mapping the LMR", err)
	}
	mr, err := s.srv.dev.RegisterMR(p.pd, m[skip:], req.VA, qp.Access(req.Access))
	if err != nil {
		_ = shm.Unmap(m)
		return nil, nil, fail(ctl.InvalidParameter, "%v", err)
	}
	return s.addLMR(p, mr, m)
}

// addLMR makes a registered region with its mapping (the memfd's pages, or
// a process-backed region's shadow) an LMR of the session; s.mu held. On
// failure the region is deregistered and the mapping unmapped.
func (s *session) addLMR(p *pz, mr *rnic.MR, m []byte) (any, []*os.File, error) {
	l := &lmr{pz: p, mr: mr, mapping: m}
	h, err := s.add(l)
	if err != nil {
		_ = mr.Deregister()
		_ = shm.Unmap(m)
		return nil, nil, err
	}
	l.h = h
	p.refs++
	s.mapped += uint64(len(m))
	return &ctl.RegisterLMRReply{LMR: h, STag: mr.STag}, nil, nil
}

// registerProcessMemory registers [VA, VA+Length) of the session's own
// process (the one that connected, by the pidfd taken then), which
// the engine reaches through its /proc/PID/mem (internal/procmem):
// nothing is shared or pinned, so the range may be any octets the process
// has, and its pages stay its own across fork. The engine works on a shadow
// of the range, anonymous memory that costs only where data passes through
// it (qp.MR.Proc), mapped and counted as an LMR's mapping is and unmapped
// with it. The first and the last octet must be readable now; every access
// is checked again, and once the process has exited (the session's socket
// may outlive it in a fork child) the memory is dead: nothing is ever read
// or written under a PID the kernel may have given to another process.
func (s *session) registerProcessMemory(req *ctl.RegisterProcessMemory) (any, []*os.File, error) {
	if req.Length == 0 || req.Length > maxLMR || req.VA+req.Length < req.VA {
		return nil, nil, fail(ctl.InvalidParameter, "process memory at %#x, length %d", req.VA, req.Length)
	}
	if req.Access&^0xf != 0 {
		return nil, nil, fail(ctl.InvalidParameter, "access bits %#x", req.Access)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := get[*pz](s, req.PZ, "PZ")
	if err != nil {
		return nil, nil, err
	}
	page := uint64(os.Getpagesize())
	skip := req.VA % page
	size := (skip + req.Length + page - 1) / page * page
	if s.mapped+size > maxMapped {
		return nil, nil, fail(ctl.InsufficientResources, "LMRs of %d octets mapped for the session, %d more asked, at most %d",
			s.mapped, size, maxMapped)
	}
	proc, err := s.process()
	if err != nil {
		return nil, nil, err
	}
	if err := proc.Probe(req.VA, req.Length); err != nil {
		return nil, nil, processMemoryError(proc.Pid(), req.VA, req.Length, err)
	}
	// Memory the process may not write (read-only, a program's text)
	// is not registered for writing, locally or by the peer.
	write := qp.Access(req.Access)&(qp.LocalWrite|qp.RemoteWrite|qp.RemoteAtomic) != 0
	if err := proc.Protected(req.VA, req.Length, write); err != nil {
		return nil, nil, processMemoryError(proc.Pid(), req.VA, req.Length, err)
	}
	// The shadow has the pages' offsets of the range, as an LMR's
	// mapping has (registerLMR).
	m, err := shm.MapAnon(int(size))
	if err != nil {
		return nil, nil, resources("mapping the shadow of process memory", err)
	}
	mr, err := s.srv.dev.RegisterProcessMR(p.pd, m[skip:skip+req.Length], proc, req.VA, qp.Access(req.Access))
	if err != nil {
		_ = shm.Unmap(m)
		return nil, nil, fail(ctl.InvalidParameter, "%v", err)
	}
	return s.addLMR(p, mr, m)
}

// process is the memory of the session's process, opened (a pidfd, and
// a goroutine that waits on it) at the first registration; s.mu held.
func (s *session) process() (*procmem.Process, error) {
	if s.proc != nil {
		return s.proc, nil
	}
	p, err := procmem.OpenPidfd(s.pidfd, int(s.cred.Pid), &procmem.Owner{UID: s.cred.Uid, GID: s.cred.Gid})
	switch {
	case errors.Is(err, unix.ESRCH), errors.Is(err, unix.EINVAL):
		// Gone, or not in the daemon's PID namespace (SO_PEERCRED
		// gives 0 then): the session's process memory is dead.
		return nil, fail(ctl.InvalidAddress, "process %d of the session cannot be reached: %v", s.cred.Pid, err)
	case errors.Is(err, procmem.ErrNotOwner):
		return nil, fail(ctl.ProtectionViolation, "process %d is not the plain process of user %d the session connected as: %v", s.cred.Pid, s.cred.Uid, err)
	case err != nil:
		return nil, resources("opening the session's process", err)
	}
	s.proc = p
	return p, nil
}

// processMemoryError is the reply to a registration whose range the
// daemon cannot read in the process now: an address the process does not
// have (or a process that is gone, whose memory is no address at all) is
// INVALID_ADDRESS, naming it; a process the daemon may not access at all
// is a PROTECTION_VIOLATION, naming the remedy.
func processMemoryError(pid int, va, length uint64, err error) error {
	at, cause := va, err
	var ae *procmem.AccessError
	if errors.As(err, &ae) {
		at, cause = ae.Addr, ae.Err
	}
	if errors.Is(err, unix.EPERM) {
		return fail(ctl.ProtectionViolation, "softrnicd may not access the memory of process %d (it needs ptrace access: "+
			"the same uid and prctl(PR_SET_PTRACER) under Yama, or CAP_SYS_PTRACE): %v", pid, cause)
	}
	return fail(ctl.InvalidAddress, "the octet at %#x of process %d is not readable (or, for an LMR that may be written, not writable) (registering %d octets at %#x): %v",
		at, pid, length, va, cause)
}

// evd is an event dispatcher: a ring in shared memory the poller produces
// into, an eventfd to wake the client, and for DTO EVDs the engine's CQ.
type evd struct {
	h      uint32
	flags  uint8
	off    uint32 // of the ring in the session's region
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
	// handOff: the owner left the EVD to the session.
	handOff atomic.Bool
	// again: a pump found the ring lock taken and left its completions
	// to the holder (pump). freed: the ring is unmapped; ringMu.
	again atomic.Bool
	freed bool
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
	notify, err := shm.NewEventfd()
	if err != nil {
		return nil, nil, resources("EVD eventfd", err)
	}
	notifyFD, err := dupFile(notify)
	if err != nil {
		notify.Close()
		return nil, nil, resources("EVD eventfd", err)
	}
	e := &evd{flags: req.Flags, notify: notify}
	if req.Flags&ctl.EVDDTO != 0 {
		// The poller arms its CQ before it sleeps; on the kernel
		// datapath the CQ is never armed, its completions pumped by
		// the goroutines that make them (sources.go).
		e.cq, err = completion.New(completion.Options{Depth: int(entries), Vector: int(req.Vector), Handler: func(*completion.CQ) {
			if e.src != nil {
				e.src.pl.Wake()
			}
		}})
		if err != nil {
			notify.Close()
			notifyFD.Close()
			return nil, nil, fail(ctl.InvalidParameter, "%v", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.off, e.ring, err = s.allocRing(entries, shm.EVESize); err != nil {
		notify.Close()
		notifyFD.Close()
		return nil, nil, err
	}
	if pl := s.srv.dev.Poller(int(req.Vector)); pl != nil && e.cq != nil {
		src := &evdSource{s: s, e: e, pl: pl}
		if err := pl.AddSource(src); err != nil {
			s.freeRing(e.off, entries, shm.EVESize)
			notify.Close()
			notifyFD.Close()
			return nil, nil, resources("EVD source", err)
		}
		e.src = src
	}
	h, err := s.add(e)
	if err != nil {
		e.free(s)
		notifyFD.Close()
		return nil, nil, err
	}
	e.h = h
	return &ctl.CreateEVDReply{EVD: h, Entries: entries, Offset: e.off}, []*os.File{notifyFD}, nil
}

func (s *session) freePZ(h uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := get[*pz](s, h, "PZ")
	if err != nil {
		return err
	}
	if p.refs > 0 {
		return fail(ctl.InvalidState, "PZ %d in use by %d LMRs or EPs", h, p.refs)
	}
	if err := p.pd.Free(); err != nil {
		return fail(ctl.InvalidState, "%v", err)
	}
	s.forget(h)
	return nil
}

func (s *session) freeLMR(h uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := get[*lmr](s, h, "LMR")
	if err != nil {
		return err
	}
	if err := l.mr.Deregister(); err != nil {
		return fail(ctl.InvalidState, "%v", err)
	}
	_ = shm.Unmap(l.mapping)
	s.mapped -= uint64(len(l.mapping))
	l.pz.refs--
	s.forget(h)
	return nil
}

func (s *session) freeEVD(h uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := get[*evd](s, h, "EVD")
	if err != nil {
		return err
	}
	if e.refs > 0 {
		return fail(ctl.InvalidState, "EVD %d in use by %d EPs or PSPs", h, e.refs)
	}
	e.free(s)
	s.forget(h)
	return nil
}

func (s *session) queryCR(h uint32) (any, []*os.File, error) {
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

// free lets go of the EVD's ring and eventfd; s.mu held.
func (e *evd) free(s *session) {
	if e.src != nil {
		// Synchronous: the poller touches the ring no more. src
		// stays: the CQ's handler may still read it.
		_ = e.src.pl.RemoveSource(e.src)
	}
	e.ringMu.Lock()
	e.freed = true // a pump touches the ring no more
	s.freeRing(e.off, e.ring.Entries(), shm.EVESize)
	e.ringMu.Unlock()
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
		case *reservation:
			out["port"]++
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
		e.setState(ctl.EPDisconnectPending)
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
	var ssps []*ssp
	var crs []*cr
	for h, o := range s.objects {
		switch o := o.(type) {
		case *reservation:
			s.forget(h)
			s.srv.ports.release(o)
		case *ssp:
			ssps = append(ssps, o)
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
	for _, p := range ssps {
		if nc := p.sp.Free(); nc != nil {
			nc.Close() // the client's own copy is its business
		}
	}
	for _, c := range crs {
		_ = c.req.Reject(nil)
	}
	// In parallel: each waits for its connection to let go, and ten
	// thousand one after the other would hold SIGTERM for seconds.
	qps := make([]*rnic.QP, 0, len(eps))
	for _, e := range eps {
		if e.qp != nil {
			qps = append(qps, e.qp)
		}
	}
	rnic.DestroyQPs(qps)
	close(s.done)
	s.doorbell.Close()
	s.loops.Wait()
	s.rejectPending()
	// The queues' owners touch the rings no more once stopped.
	s.mu.Lock()
	queues := s.queues
	s.mu.Unlock()
	for _, q := range queues {
		if q != nil {
			q.stop()
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	// Dependency order: EPs, then EVDs and LMRs (no QP holds them now),
	// then PZs.
	for _, kind := range []int{0, 1, 2} {
		for h, o := range s.objects {
			switch o := o.(type) {
			case *ep:
				if kind == 0 {
					s.unconfigureEP(o)
					s.forget(h)
				}
			case *evd:
				if kind == 1 {
					o.free(s)
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
	if s.proc != nil {
		// After the LMRs: one still held (logged above) finds the
		// memory dead rather than touching it.
		_ = s.proc.Close()
	}
	closePidfd(s.pidfd)
	s.conn.Close()
	if err := s.region.Close(); err != nil {
		s.srv.log.Error("unmapping a session's region", "session", s.id, "err", err)
	}
}
