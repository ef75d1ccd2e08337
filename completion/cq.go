// Package completion holds completion queues: bounded rings of work
// completions with one-shot arming and notification.
//
// A CQ is bound at creation to a completion vector (the comp_vector of
// verbs): the poller that owns the CQ, its QPs and their completions (seed
// 004, per-processor completion processing). The engine pushes completions
// from its owner; applications poll from anywhere.
package completion

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Status of a completion, in the spirit of ibv_wc_status.
type Status uint8

// Statuses.
const (
	Success Status = iota
	// LocalLengthError: a received message did not fit the posted buffer.
	LocalLengthError
	// LocalProtectionError: a local SGE failed its STag, PD, rights or
	// bounds check.
	LocalProtectionError
	// LocalQPOperationError: the QP could not carry out the request.
	LocalQPOperationError
	// FlushError: the request was outstanding when the QP left RTS.
	FlushError
	// RemoteAccessError: the peer reported a protection error.
	RemoteAccessError
	// RemoteOperationError: the peer reported an operation error.
	RemoteOperationError
	// RemoteInvalidRequest: the peer found the request malformed.
	RemoteInvalidRequest
	// BadResponse: the peer's response broke the protocol.
	BadResponse
	// GeneralError: anything else, such as a lost connection.
	GeneralError
)

var statusNames = [...]string{
	Success:               "success",
	LocalLengthError:      "local length error",
	LocalProtectionError:  "local protection error",
	LocalQPOperationError: "local QP operation error",
	FlushError:            "flushed",
	RemoteAccessError:     "remote access error",
	RemoteOperationError:  "remote operation error",
	RemoteInvalidRequest:  "remote invalid request",
	BadResponse:           "bad response",
	GeneralError:          "general error",
}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Opcode says what completed.
type Opcode uint8

// Completion opcodes.
const (
	OpSend Opcode = iota
	OpWrite
	OpRead
	OpFetchAdd
	OpCmpSwap
	OpLocalInvalidate
	OpImmediate // an Immediate Data message sent
	OpRecv
	OpRecvImmediate // an Immediate Data message received
)

var opNames = [...]string{"send", "write", "read", "fetch-add", "cmp-swap", "local-invalidate", "immediate", "recv", "recv-immediate"}

func (o Opcode) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("opcode(%d)", uint8(o))
}

// Completion is one work completion.
type Completion struct {
	// ID is the work request's identifier (the DAT cookie).
	ID      uint64
	QPN     uint32
	Opcode  Opcode
	Status  Status
	ByteLen uint32
	// Solicited: a received message asked for a solicited event.
	Solicited bool
	// Invalidated is the STag a Send with Invalidate invalidated, when
	// HasInvalidated is set.
	Invalidated    uint32
	HasInvalidated bool
	// Immediate data of a received Immediate Data message.
	Immediate [8]byte
	// Err says more about a failed completion: a ddp.TerminateError the
	// peer sent or we sent, or a local error.
	Err error
}

// ErrOverrun: the CQ was full when a completion arrived. The completion is
// lost, and the QPs that feed the CQ must go to Error (RFC 5040 §8.3 leaves
// overrun catastrophic).
var ErrOverrun = errors.New("completion: CQ overrun")

// CQ is a completion queue.
type CQ struct {
	depth  int
	vector int

	mu   sync.Mutex
	ring []Completion
	head int // next to poll
	n    int
	// waiting mirrors n for Len, which pollers ask on every turn
	// without taking mu.
	waiting atomic.Int32
	armed   bool
	solOnly bool
	overrun bool
	notify  chan struct{}
	handler func(*CQ)
}

// Options configure a CQ.
type Options struct {
	// Depth is the number of completions the CQ holds (1 to 65536).
	Depth int
	// Vector is the completion vector: the poller that owns the CQ.
	Vector int
	// Handler, if set, is called when an armed CQ gets a completion,
	// without the CQ's lock but on the goroutine that completed, which
	// may hold the lock of the QP that completed (rnic.QP's): it must
	// not block and must not call into a QP or post work; it wakes
	// whoever polls the CQ (a poller, a session, a channel), nothing more.
	Handler func(*CQ)
}

// MaxDepth bounds a CQ.
const MaxDepth = 1 << 16

// New returns an empty, unarmed CQ.
func New(opts Options) (*CQ, error) {
	if opts.Depth < 1 || opts.Depth > MaxDepth {
		return nil, fmt.Errorf("completion: depth %d out of range 1..%d", opts.Depth, MaxDepth)
	}
	if opts.Vector < 0 {
		return nil, fmt.Errorf("completion: negative vector %d", opts.Vector)
	}
	return &CQ{
		depth:   opts.Depth,
		vector:  opts.Vector,
		ring:    make([]Completion, opts.Depth),
		notify:  make(chan struct{}, 1),
		handler: opts.Handler,
	}, nil
}

// Depth is the capacity.
func (cq *CQ) Depth() int { return cq.depth }

// Vector is the completion vector the CQ is bound to.
func (cq *CQ) Vector() int { return cq.vector }

// Push adds a completion. It returns ErrOverrun when the CQ is full; the CQ
// then stays in overrun (Overrun reports it).
func (cq *CQ) Push(c Completion) error {
	cq.mu.Lock()
	if cq.n == cq.depth {
		cq.overrun = true
		cq.mu.Unlock()
		return ErrOverrun
	}
	cq.ring[(cq.head+cq.n)%cq.depth] = c
	cq.n++
	cq.waiting.Store(int32(cq.n))
	fire := cq.armed && (!cq.solOnly || c.Solicited || c.Status != Success)
	if fire {
		cq.armed = false
	}
	cq.mu.Unlock()
	if fire {
		cq.signal()
	}
	return nil
}

func (cq *CQ) signal() {
	select {
	case cq.notify <- struct{}{}:
	default:
	}
	if cq.handler != nil {
		cq.handler(cq)
	}
}

// Poll moves up to len(out) completions into out and returns how many.
func (cq *CQ) Poll(out []Completion) int {
	cq.mu.Lock()
	k := min(len(out), cq.n)
	for i := 0; i < k; i++ {
		out[i] = cq.ring[cq.head]
		cq.ring[cq.head] = Completion{}
		cq.head = (cq.head + 1) % cq.depth
	}
	cq.n -= k
	cq.waiting.Store(int32(cq.n))
	cq.mu.Unlock()
	return k
}

// Len is the number of completions waiting.
func (cq *CQ) Len() int { return int(cq.waiting.Load()) }

// Overrun reports whether a completion was ever lost to a full CQ.
func (cq *CQ) Overrun() bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.overrun
}

// Arm requests one notification for the next completion (solicitedOnly: the
// next solicited or failed one). Arming is one-shot. If completions are
// already waiting that would have fired, it notifies at once, so that none
// is lost between a poll that found the CQ empty and the arm.
func (cq *CQ) Arm(solicitedOnly bool) {
	cq.mu.Lock()
	fire := false
	if cq.n > 0 {
		for i := 0; i < cq.n && !fire; i++ {
			c := &cq.ring[(cq.head+i)%cq.depth]
			fire = !solicitedOnly || c.Solicited || c.Status != Success
		}
	}
	cq.armed = !fire
	cq.solOnly = solicitedOnly
	cq.mu.Unlock()
	if fire {
		cq.signal()
	}
}

// Notify returns the channel that receives a value for each notification.
func (cq *CQ) Notify() <-chan struct{} { return cq.notify }
