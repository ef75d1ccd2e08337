package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/shm"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// EVDKind says what an EVD receives; combine with |.
type EVDKind uint8

// Kinds.
const (
	DTOEvents        EVDKind = ctl.EVDDTO
	ConnectionEvents EVDKind = ctl.EVDConnection
	CREvents         EVDKind = ctl.EVDCR
)

// EVDOptions configure an EVD.
type EVDOptions struct {
	Depth int
	Kind  EVDKind
	// Vector is the completion vector (the daemon's poller) of a DTO EVD.
	Vector int
}

// EVD is an event dispatcher: a ring the daemon fills.
type EVD struct {
	ia     *IA
	h      uint32
	ring   *shm.Ring
	notify *os.File
	// mu: one consumer of the ring at a time; a waiter holds it only
	// while it looks, not while it sleeps.
	mu sync.Mutex
	// interrupt: Interrupt was called; the next WaitTimeout to wake
	// returns ErrInterrupted.
	interrupt atomic.Bool
}

// CreateEVD creates an event dispatcher.
func (ia *IA) CreateEVD(o EVDOptions) (*EVD, error) {
	if o.Depth <= 0 || o.Kind == 0 {
		return nil, fmt.Errorf("create EVD: %w: depth %d kind %d", ErrInvalidParameter, o.Depth, o.Kind)
	}
	var r ctl.CreateEVDReply
	files, err := ia.call(ctl.OpCreateEVD, &ctl.CreateEVD{Depth: uint32(o.Depth), Flags: uint8(o.Kind), Vector: uint32(o.Vector)}, nil, &r)
	if err != nil {
		return nil, fmt.Errorf("create EVD: %w", err)
	}
	if len(files) != 1 {
		closeAll(files)
		return nil, fmt.Errorf("create EVD: daemon passed %d descriptors", len(files))
	}
	mem, err := ia.block(r.Offset, shm.RingSize(r.Entries, shm.EVESize))
	if err != nil {
		files[0].Close()
		return nil, fmt.Errorf("create EVD: %w", err)
	}
	ring, err := shm.NewRing(mem, r.Entries, shm.EVESize)
	if err != nil {
		files[0].Close()
		return nil, fmt.Errorf("create EVD: %w", err)
	}
	e := &EVD{ia: ia, h: r.EVD, ring: ring, notify: files[0]}
	ia.objMu.Lock()
	ia.evds[e] = struct{}{}
	ia.objMu.Unlock()
	if ia.gone.Load() {
		e.wake()
	}
	return e, nil
}

// Free frees the EVD; it fails while EPs or PSPs use it.
func (e *EVD) Free() error {
	if _, err := e.ia.call(ctl.OpFreeEVD, &ctl.Handle{H: e.h}, nil, nil); err != nil {
		return fmt.Errorf("free EVD: %w", err)
	}
	e.ia.objMu.Lock()
	delete(e.ia.evds, e)
	e.ia.objMu.Unlock()
	return e.notify.Close()
}

// wake signals the EVD's eventfd ourselves, so that a Wait sleeping on it
// looks again (and finds the daemon gone).
func (e *EVD) wake() { _ = shm.Signal(e.notify) }

// errGone is the error of an EVD whose daemon has gone.
func (e *EVD) errGone() error { return fmt.Errorf("EVD %d: %w", e.h, ErrDaemonGone) }

// EventType classifies events.
type EventType uint8

// Event types.
const (
	DTOCompletion     EventType = shm.EventDTO
	ConnectionEvent   EventType = shm.EventConnection
	ConnectionRequest EventType = shm.EventCR
	Overflow          EventType = shm.EventOverflow
)

// ConnEvent is the DAT connection event number.
type ConnEvent uint32

// Connection events.
const (
	Established           ConnEvent = ConnEvent(ctl.EvEstablished)
	PeerRejected          ConnEvent = ConnEvent(ctl.EvPeerRejected)
	NonPeerRejected       ConnEvent = ConnEvent(ctl.EvNonPeerRejected)
	Unreachable           ConnEvent = ConnEvent(ctl.EvUnreachable)
	TimedOut              ConnEvent = ConnEvent(ctl.EvTimedOut)
	Disconnected          ConnEvent = ConnEvent(ctl.EvDisconnected)
	Broken                ConnEvent = ConnEvent(ctl.EvBroken)
	AcceptCompletionError ConnEvent = ConnEvent(ctl.EvAcceptCompletionError)
	// SocketDown: a Socket Service Point's socket was not connected or
	// its connection ended before the peer's request (Event.SSP says
	// which; DAT_IW's DAT_CONNECTION_EVENT_SOCKET_DOWN).
	SocketDown ConnEvent = ConnEvent(ctl.EvSocketDown)
)

func (c ConnEvent) String() string {
	names := [...]string{"", "ESTABLISHED", "PEER_REJECTED", "NON_PEER_REJECTED", "UNREACHABLE", "TIMED_OUT",
		"DISCONNECTED", "BROKEN", "ACCEPT_COMPLETION_ERROR", "SOCKET_DOWN"}
	if int(c) < len(names) && c > 0 {
		return names[c]
	}
	return fmt.Sprintf("event(%d)", uint32(c))
}

// Event is one event from an EVD.
type Event struct {
	Type EventType
	// EP the event is about (DTO and connection events; for a CR, the
	// provider-created or reserved EP, if any).
	EP *EP
	// DTO completions.
	Cookie      uint64
	Status      completion.Status
	Opcode      completion.Opcode
	Length      uint32
	Solicited   bool
	Invalidated uint32 // with HasInvalidated
	HasInvalid  bool
	Immediate   [8]byte
	// Cause is the Terminate cause of a failed completion, or of a
	// connection event whose connection ended with a Terminate, sent
	// or received (a connect refused for an MPA negotiation the peer
	// could not meet: no RTR in common, too few Read credits), if known.
	Cause *ddp.TerminateError
	// Connection events.
	Conn ConnEvent
	// Connection requests.
	CR *CR
	// SSP is the handle of the Socket Service Point of a SocketDown
	// event (SSP.Handle).
	SSP uint32
}

// Dequeue returns the next event, or false when none is waiting.
func (e *EVD) Dequeue() (Event, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev, ok, err := e.dequeue()
	if !ok && err == nil && e.ia.gone.Load() {
		err = e.errGone()
	}
	return ev, ok, err
}

func (e *EVD) dequeue() (Event, bool, error) {
	slot, err := e.ring.Peek()
	if err != nil {
		return Event{}, false, fmt.Errorf("EVD %d: %w", e.h, err)
	}
	if slot == nil {
		return Event{}, false, nil
	}
	v := shm.DecodeEVE(slot)
	e.ring.Release()
	if e.ring.RoomWanted() {
		// The daemon holds events for lack of room and sleeps.
		if err := shm.Signal(e.ia.doorbell); err != nil {
			return Event{}, false, fmt.Errorf("EVD %d: wake the daemon: %w", e.h, err)
		}
	}
	ev := Event{Type: EventType(v.Kind), Cookie: v.ID, Status: completion.Status(v.Status), Opcode: toOpcode(v.Opcode),
		Length: v.ByteLen, Solicited: v.Flags&shm.EVESolicited != 0, Invalidated: v.Invalidated,
		HasInvalid: v.Flags&shm.EVEInvalidated != 0, Immediate: v.Immediate, Conn: ConnEvent(v.Event)}
	if te, ok := shm.UnpackCause(v.Cause); ok {
		ev.Cause = &te
	}
	if v.EP != 0 {
		ev.EP = e.ia.epFor(v.EP)
	}
	if ev.Type == ConnectionRequest {
		ev.CR = &CR{ia: e.ia, h: v.Handle, EP: ev.EP}
	}
	if ev.Type == ConnectionEvent && ev.Conn == SocketDown {
		ev.SSP = v.Handle
	}
	return ev, true, nil
}

// opcodes maps the event ring's DTO opcodes to the completion opcodes an
// Event carries.
var opcodes = [shm.NumDTOOpcodes]completion.Opcode{
	shm.DTOSend:            completion.OpSend,
	shm.DTOWrite:           completion.OpWrite,
	shm.DTORead:            completion.OpRead,
	shm.DTOFetchAdd:        completion.OpFetchAdd,
	shm.DTOCmpSwap:         completion.OpCmpSwap,
	shm.DTOLocalInvalidate: completion.OpLocalInvalidate,
	shm.DTOImmediate:       completion.OpImmediate,
	shm.DTORecv:            completion.OpRecv,
	shm.DTORecvImmediate:   completion.OpRecvImmediate,
}

// toOpcode converts a DTO event's opcode; one the table does not know (a
// newer daemon's) goes through as its number.
func toOpcode(o shm.DTOOpcode) completion.Opcode {
	if o < shm.NumDTOOpcodes {
		return opcodes[o]
	}
	return completion.Opcode(o)
}

// Wait returns the next event, sleeping until one arrives or ctx ends;
// it returns ErrClosed once the IA is closed and ErrDaemonGone once the
// daemon has gone.
func (e *EVD) Wait(ctx context.Context) (Event, error) {
	for {
		e.mu.Lock()
		if ev, ok, err := e.dequeue(); ok || err != nil {
			e.mu.Unlock()
			return ev, err
		}
		// Arm, then look again: an event that raced in is not missed.
		e.ring.SetFlags(shm.Armed)
		ev, ok, err := e.dequeue()
		e.mu.Unlock()
		if ok || err != nil {
			return ev, err
		}
		if e.ia.gone.Load() {
			return Event{}, e.errGone()
		}
		if e.ia.ended.Load() {
			return Event{}, fmt.Errorf("EVD %d: %w", e.h, ErrClosed)
		}
		// Asleep without mu: a Dequeue meanwhile does not wait for us.
		if err := waitFile(ctx, e.notify); err != nil {
			return Event{}, err
		}
	}
}

// WaitTimeout is Wait with a timeout instead of a context (d < 0: none),
// for callers that wait once per operation: it allocates nothing. It
// returns when at least threshold events are waiting (threshold < 1 counts
// as 1), with the first of them and how many more there are.
func (e *EVD) WaitTimeout(d time.Duration, threshold int) (ev Event, more int, err error) {
	var deadline time.Time
	if d >= 0 {
		deadline = time.Now().Add(d)
	}
	threshold = max(threshold, 1)
	for {
		e.mu.Lock()
		if n := e.pending(); n >= threshold {
			ev, ok, err := e.dequeue()
			if ok || err != nil {
				e.mu.Unlock()
				return ev, n - 1, err
			}
		}
		e.ring.SetFlags(shm.Armed)
		n := e.pending()
		e.mu.Unlock()
		if n >= threshold {
			continue
		}
		if e.ia.gone.Load() {
			return Event{}, 0, e.errGone()
		}
		if e.ia.ended.Load() {
			return Event{}, 0, fmt.Errorf("EVD %d: %w", e.h, ErrClosed)
		}
		if e.interrupt.Swap(false) {
			return Event{}, 0, ErrInterrupted
		}
		// Asleep without mu: a Dequeue meanwhile does not wait for us.
		if err := waitDeadline(e.notify, deadline); err != nil {
			return Event{}, 0, err
		}
	}
}

// ErrInterrupted: Interrupt woke a WaitTimeout.
var ErrInterrupted = errors.New("client: wait interrupted")

// Interrupt makes a WaitTimeout sleeping now (or the next one that would
// sleep) return ErrInterrupted.
func (e *EVD) Interrupt() {
	e.interrupt.Store(true)
	e.wake()
}

// Pending is the number of events waiting.
func (e *EVD) Pending() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pending()
}

func (e *EVD) pending() int {
	n := e.ring.Produced() - e.ring.Consumed()
	return int(min(n, e.ring.Entries()))
}

// waitDeadline blocks until the eventfd is signalled or the deadline (zero:
// none) passes.
func waitDeadline(f *os.File, deadline time.Time) error {
	_ = f.SetReadDeadline(deadline)
	err := shm.Wait(f)
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return fmt.Errorf("wait: %w", ErrTimeout)
		}
		return nil // a stale deadline from an earlier wait
	}
	return fmt.Errorf("wait: %w", err)
}

// waitFile blocks until the eventfd is signalled or ctx ends.
func waitFile(ctx context.Context, f *os.File) error {
	if d, ok := ctx.Deadline(); ok {
		_ = f.SetReadDeadline(d)
	} else {
		_ = f.SetReadDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	err := shm.Wait(f)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("wait: %w: %w", ErrTimeout, ctx.Err())
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil // a stale deadline from an earlier wait
		}
		return fmt.Errorf("wait: %w", err)
	}
	return nil
}
