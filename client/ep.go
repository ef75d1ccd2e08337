package client

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/shm"
)

// EPState is the DAT endpoint state.
type EPState uint8

// EP states.
const (
	Unconnected         EPState = EPState(ctl.EPUnconnected)
	Reserved            EPState = EPState(ctl.EPReserved)
	PassivePending      EPState = EPState(ctl.EPPassivePending)
	ActivePending       EPState = EPState(ctl.EPActivePending)
	TentativePending    EPState = EPState(ctl.EPTentativePending)
	CompletionPending   EPState = EPState(ctl.EPCompletionPending)
	Connected           EPState = EPState(ctl.EPConnected)
	DisconnectPending   EPState = EPState(ctl.EPDisconnectPending)
	DisconnectedState   EPState = EPState(ctl.EPDisconnected)
	connectTimeoutFloor         = time.Millisecond
)

func (s EPState) String() string { return ctl.EPStateName(uint8(s)) }

// EPAttr are an endpoint's attributes.
type EPAttr struct {
	// PZ may be nil: the EP then has no QP until Modify sets one.
	PZ                              *PZ
	RecvEVD, RequestEVD, ConnectEVD *EVD
	// Depths of the send and receive queues (rounded up to powers of 2).
	SQDepth, RQDepth int
	// IRD and ORD offered in MPA startup.
	IRD, ORD int
	// NoCRC does not ask for MPA CRC32c; Markers asks for MPA markers;
	// MPARevision 1 speaks plain RFC 5044; PeerToPeer asks for the
	// RFC 6581 peer-to-peer model, in which the initiator sends one RTR
	// message, of a kind in RTR (the initiator offers them, the
	// responder picks one it accepts; zero: a zero-length RDMA Write or
	// Read, which every iWARP implementation takes).
	NoCRC, Markers bool
	MPARevision    int
	PeerToPeer     bool
	RTR            RTR
}

// RTR is a set of peer-to-peer ready-to-receive messages (RFC 6581 §9.2).
type RTR uint8

// The RTR messages.
const (
	RTRSend  RTR = 1 << iota // a zero-length Send
	RTRWrite                 // a zero-length RDMA Write
	RTRRead                  // a zero-length RDMA Read
)

// ParseRTR reads a set of RTR messages as tools name them: "write",
// "read", "send", joined by commas ("write,read").
func ParseRTR(s string) (RTR, error) {
	var r RTR
	for _, name := range strings.Split(s, ",") {
		switch strings.TrimSpace(name) {
		case "send":
			r |= RTRSend
		case "write":
			r |= RTRWrite
		case "read":
			r |= RTRRead
		default:
			return 0, fmt.Errorf("RTR %q: want write, read or send, joined by commas", name)
		}
	}
	return r, nil
}

func (a *EPAttr) wire() ctl.EPAttr {
	w := ctl.EPAttr{SQDepth: uint32(a.SQDepth), RQDepth: uint32(a.RQDepth), IRD: uint16(a.IRD), ORD: uint16(a.ORD),
		NoCRC: a.NoCRC, Markers: a.Markers, MPARev: uint8(a.MPARevision), PeerToPeer: a.PeerToPeer, RTR: uint8(a.RTR)}
	if a.PZ != nil {
		w.PZ = a.PZ.h
	}
	if a.RecvEVD != nil {
		w.RecvEVD = a.RecvEVD.h
	}
	if a.RequestEVD != nil {
		w.RequestEVD = a.RequestEVD.h
	}
	if a.ConnectEVD != nil {
		w.ConnectEVD = a.ConnectEVD.h
	}
	return w
}

// EP is an endpoint.
type EP struct {
	ia *IA
	h  uint32

	mu sync.Mutex // one producer per ring
	sq *shm.Ring
	rq *shm.Ring
	// A post that finds the ring's need-wakeup flag up puts slot on
	// queue, the ready queue of the EP's vector (ready).
	slot  uint32
	queue *readyQueue
	qpn   uint32
}

// readyQueue is the client's end of a ready queue (internal/shm): where
// an EP with new work goes, and the doorbell rung when the daemon's side
// sleeps: the poller of the queue's vector, or a loop of the session.
type readyQueue struct {
	mu       sync.Mutex // the EPs of a vector share the producer side
	ring     *shm.Ring
	off      uint32
	doorbell *os.File
}

// ready tells the daemon that the EP's rings have work: its slot goes on
// the ready queue unless it is there already, and the doorbell rings if
// the queue's owner sleeps. e.mu held, after the entry was committed.
func (e *EP) ready() error {
	if !e.sq.MarkQueued() {
		return nil
	}
	q := e.queue
	q.mu.Lock()
	ok, err := q.ring.Push(e.slot)
	q.mu.Unlock()
	switch {
	case err != nil:
		return fmt.Errorf("post: ready queue: %w", err)
	case !ok:
		// One entry per EP at most: only a daemon that broke the
		// queue fills it.
		return fmt.Errorf("post: the daemon's ready queue is full")
	}
	if q.ring.Flags()&shm.NeedWakeup != 0 {
		return shm.Signal(q.doorbell)
	}
	return nil
}

// epFor returns the EP object for a handle, creating one for an EP the
// provider made (a PSP with the provider flag).
func (ia *IA) epFor(h uint32) *EP {
	ia.objMu.Lock()
	defer ia.objMu.Unlock()
	e := ia.eps[h]
	if e == nil {
		e = &EP{ia: ia, h: h}
		ia.eps[h] = e
	}
	return e
}

// CreateEP creates an endpoint in UNCONNECTED.
func (ia *IA) CreateEP(a EPAttr) (*EP, error) {
	var r ctl.EPReply
	files, err := ia.call(ctl.OpCreateEP, &ctl.CreateEP{Attr: a.wire()}, nil, &r)
	if err != nil {
		return nil, fmt.Errorf("create EP: %w", err)
	}
	e := ia.epFor(r.EP)
	if err := e.attach(&r, files); err != nil {
		return nil, fmt.Errorf("create EP: %w", err)
	}
	return e, nil
}

// dropRings forgets the EP's rings, whose blocks the daemon may give to
// other rings; e.mu held.
func (e *EP) dropRings() { e.sq, e.rq, e.queue, e.qpn = nil, nil, nil, 0 }

// attach finds the rings of an EP reply in the region, and its ready
// queue, whose doorbell comes with the reply.
func (e *EP) attach(r *ctl.EPReply, files []*os.File) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropRings()
	if !r.HasRings || len(files) != 1 {
		closeAll(files)
		if r.HasRings {
			return fmt.Errorf("daemon passed %d descriptors for the ready queue's doorbell", len(files))
		}
		return nil
	}
	ia := e.ia
	sqm, err1 := ia.block(r.SQOffset, shm.RingSize(r.SQEntries, shm.SQESize))
	rqm, err2 := ia.block(r.RQOffset, shm.RingSize(r.RQEntries, shm.RQESize))
	if err := errors.Join(err1, err2); err != nil {
		files[0].Close()
		return err
	}
	sq, err1 := shm.NewRing(sqm, r.SQEntries, shm.SQESize)
	rq, err2 := shm.NewRing(rqm, r.RQEntries, shm.RQESize)
	if err := errors.Join(err1, err2); err != nil {
		files[0].Close()
		return fmt.Errorf("rings: %w", err)
	}
	q, err := ia.readyQueue(r, files[0])
	if err != nil {
		return err
	}
	e.sq, e.rq, e.slot, e.queue, e.qpn = sq, rq, r.Slot, q, r.QPN
	return nil
}

// QPN is the number of the EP's QP, unique in its daemon (0 without a QP):
// what a peer names it by in ConnectQP.
func (e *EP) QPN() uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.qpn
}

// ConnectQP connects the EP's QP to the peer's QP remoteQPN at the IPv4
// address remoteAddr, the way InfiniBand programs do at RTR: the peer's
// owner calls it with this EP's address and QPN, and the daemons decide
// which side connects (ctl.ConnectQP). It returns at once; the EP's state
// becomes CONNECTED, or DISCONNECTED when no connection came in the
// daemon's time (15 s by default), with an event on the connect EVD if
// it has one.
func (e *EP) ConnectQP(remoteAddr string, remoteQPN uint32) error {
	if _, err := e.ia.call(ctl.OpConnectQP, &ctl.ConnectQP{EP: e.h, RemoteAddr: remoteAddr, RemoteQPN: remoteQPN}, nil, &ctl.ConnectQPReply{}); err != nil {
		return fmt.Errorf("connect QP: %w", err)
	}
	return nil
}

// readyQueue returns the ready queue an EP reply names, keeping the
// doorbell passed with it if the queue is new (else closing it).
func (ia *IA) readyQueue(r *ctl.EPReply, db *os.File) (*readyQueue, error) {
	ia.objMu.Lock()
	defer ia.objMu.Unlock()
	if q := ia.queues[r.Queue]; q != nil {
		db.Close()
		if q.off != r.QueueOffset || q.ring.Entries() != r.QueueEntries {
			return nil, fmt.Errorf("daemon moved ready queue %d", r.Queue)
		}
		return q, nil
	}
	m, err := ia.block(r.QueueOffset, shm.RingSize(r.QueueEntries, shm.ReadyEntrySize))
	if err != nil {
		db.Close()
		return nil, err
	}
	ring, err := shm.NewRing(m, r.QueueEntries, shm.ReadyEntrySize)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("ready queue: %w", err)
	}
	q := &readyQueue{ring: ring, off: r.QueueOffset, doorbell: db}
	ia.queues[r.Queue] = q
	return q, nil
}

// Handle is the daemon's handle of the EP.
func (e *EP) Handle() uint32 { return e.h }

// Modify changes attributes (dat_ep_modify); which ones, mask says
// (ctl.ModifyPZ, ModifyEVDs, ModifyDepths, ModifyIRDORD).
func (e *EP) Modify(mask uint32, a EPAttr) error {
	var r ctl.EPReply
	files, err := e.ia.call(ctl.OpModifyEP, &ctl.ModifyEP{EP: e.h, Mask: mask, Attr: a.wire()}, nil, &r)
	if err != nil {
		return fmt.Errorf("modify EP: %w", err)
	}
	return e.attach(&r, files)
}

// EPInfo is what Query returns.
type EPInfo struct {
	State       EPState
	LocalAddr   string
	RemoteAddr  string
	PrivateData []byte
	HasQP       bool
}

// Query returns the EP's state and addresses (dat_ep_query).
func (e *EP) Query() (EPInfo, error) {
	var r ctl.EPInfo
	if _, err := e.ia.call(ctl.OpQueryEP, &ctl.Handle{H: e.h}, nil, &r); err != nil {
		return EPInfo{}, fmt.Errorf("query EP: %w", err)
	}
	return EPInfo{State: EPState(r.State), LocalAddr: r.LocalAddr, RemoteAddr: r.RemoteAddr, PrivateData: r.PrivateData, HasQP: r.HasQP}, nil
}

// PostableState is the EP's state as the daemon last published it in the
// send ring, read without a call (false: the EP has no QP yet). DAT
// refuses a Send, Write or Read posted while an EP is neither CONNECTED
// nor DISCONNECTED with DAT_INVALID_STATE; this lets a provider do so at
// no cost.
func (e *EP) PostableState() (EPState, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sq == nil {
		return 0, false
	}
	return EPState(e.sq.State()), true
}

// State is the EP's state.
func (e *EP) State() (EPState, error) {
	i, err := e.Query()
	return i.State, err
}

// Connect starts connecting to addr (IPv4 host:port) and returns at once;
// the outcome arrives on the connect EVD (ESTABLISHED, PEER_REJECTED,
// NON_PEER_REJECTED, UNREACHABLE or TIMED_OUT).
func (e *EP) Connect(addr string, privateData []byte, timeout time.Duration) error {
	return e.ConnectRetrying(addr, privateData, timeout, 0)
}

// ConnectRetrying is Connect that, for the first retry of the timeout,
// tries again (with backoff) while the peer's host refuses the connection
// because nothing listens on the port yet, instead of failing at once: for
// a peer that listens only after telling the client to connect.
func (e *EP) ConnectRetrying(addr string, privateData []byte, timeout, retry time.Duration) error {
	if timeout <= 0 || retry < 0 {
		return fmt.Errorf("connect: %w: timeout %v, retry %v", ErrInvalidParameter, timeout, retry)
	}
	req := &ctl.Connect{EP: e.h, Addr: addr, PrivateData: privateData, TimeoutUS: uint64(max(timeout, connectTimeoutFloor) / time.Microsecond),
		RetryRefusedUS: uint64(retry / time.Microsecond)}
	if _, err := e.ia.call(ctl.OpConnect, req, nil, nil); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	return nil
}

// Disconnect closes the connection: gracefully (posted requests finish) or
// abruptly (flushed). On an UNCONNECTED EP it flushes the posted receives.
func (e *EP) Disconnect(graceful bool) error {
	if _, err := e.ia.call(ctl.OpDisconnect, &ctl.Disconnect{EP: e.h, Graceful: graceful}, nil, nil); err != nil {
		return fmt.Errorf("disconnect: %w", err)
	}
	return nil
}

// Reset returns a DISCONNECTED EP to UNCONNECTED.
func (e *EP) Reset() error {
	if _, err := e.ia.call(ctl.OpResetEP, &ctl.Handle{H: e.h}, nil, nil); err != nil {
		return fmt.Errorf("reset EP: %w", err)
	}
	return nil
}

// Free frees the EP, aborting its connection.
func (e *EP) Free() error {
	if _, err := e.ia.call(ctl.OpFreeEP, &ctl.Handle{H: e.h}, nil, nil); err != nil {
		return fmt.Errorf("free EP: %w", err)
	}
	e.ia.objMu.Lock()
	delete(e.ia.eps, e.h)
	e.ia.objMu.Unlock()
	e.mu.Lock()
	e.dropRings()
	e.mu.Unlock()
	return nil
}
