package main

/*
#include "srn.h"
*/
import "C"

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// evdObj is an event dispatcher. A DTO, connection or CR EVD is the
// daemon's (evd); an async or software-only EVD has no daemon half (evd
// nil): nothing produces into it, and a wait on it sleeps out its timeout.
type evdObj struct {
	handle
	evd   *client.EVD
	flags C.DAT_EVD_FLAGS
	qlen  int
	// waiter: a thread waits (DAT allows one); unwaitable: set by
	// dat_evd_set_unwaitable, wakes the waiter with DAT_INVALID_STATE.
	waiter     atomic.Bool
	unwaitable atomic.Bool
	// done is closed when the EVD or its IA is freed, and kick signalled
	// when it is made unwaitable: either wakes a local wait.
	done     chan struct{}
	doneOnce sync.Once
	kick     chan struct{}
}

func (e *evdObj) close() { e.doneOnce.Do(func() { close(e.done) }) }

//export srnEVDCreate
func srnEVDCreate(iah C.DAT_IA_HANDLE, qlen C.DAT_COUNT, cno C.DAT_CNO_HANDLE, flags C.DAT_EVD_FLAGS, out *C.DAT_EVD_HANDLE) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](iah, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	if qlen <= 0 {
		return arg(2)
	}
	if cno != nil {
		return datNotImplemented // no CNOs
	}
	if out == nil {
		return arg(5)
	}
	e, rc := ia.newEVD(int(qlen), flags)
	if rc != datSuccess {
		return rc
	}
	*out = C.DAT_EVD_HANDLE(e.dat())
	return datSuccess
}

func (ia *iaObj) newEVD(qlen int, flags C.DAT_EVD_FLAGS) (*evdObj, C.DAT_RETURN) {
	known := C.DAT_EVD_FLAGS(C.DAT_EVD_SOFTWARE_FLAG | C.DAT_EVD_CR_FLAG | C.DAT_EVD_DTO_FLAG | C.DAT_EVD_CONNECTION_FLAG |
		C.DAT_EVD_RMR_BIND_FLAG | C.DAT_EVD_ASYNC_FLAG)
	if flags&^known != 0 || flags == 0 {
		return nil, arg(4)
	}
	var kind client.EVDKind
	if flags&C.DAT_EVD_DTO_FLAG != 0 {
		kind |= client.DTOEvents
	}
	if flags&C.DAT_EVD_CONNECTION_FLAG != 0 {
		kind |= client.ConnectionEvents
	}
	if flags&C.DAT_EVD_CR_FLAG != 0 {
		kind |= client.CREvents
	}
	e := &evdObj{flags: flags, qlen: qlen, done: make(chan struct{}), kick: make(chan struct{}, 1)}
	if kind != 0 {
		if max := int(ia.attr.MaxEVDDepth); max > 0 && qlen > max {
			return nil, arg(2)
		}
		var err error
		if e.evd, err = ia.cl.CreateEVD(client.EVDOptions{Depth: qlen, Kind: kind}); err != nil {
			return nil, status(err)
		}
	}
	newHandle(e, C.SRN_EVD, ia, ia.prov.table)
	ia.track(e)
	return e, datSuccess
}

//export srnEVDQuery
func srnEVDQuery(h C.DAT_EVD_HANDLE, mask C.DAT_EVD_PARAM_MASK, p *C.DAT_EVD_PARAM) C.DAT_RETURN {
	e, ok := lookup[*evdObj](h, C.SRN_EVD)
	if !ok {
		return invalid(C.SRN_EVD)
	}
	if p == nil {
		return arg(3)
	}
	p.ia_handle = e.ia.consumerHandle()
	p.evd_qlen = C.DAT_COUNT(e.qlen)
	p.evd_state = C.DAT_EVD_STATE_ENABLED | C.DAT_EVD_STATE_CONFIG_THRESHOLD
	if e.unwaitable.Load() {
		p.evd_state |= C.DAT_EVD_STATE_UNWAITABLE
	} else {
		p.evd_state |= C.DAT_EVD_STATE_WAITABLE
	}
	p.cno_handle = nil
	p.evd_flags = e.flags
	return datSuccess
}

//export srnEVDModifyCNO
func srnEVDModifyCNO(h C.DAT_EVD_HANDLE, cno C.DAT_CNO_HANDLE) C.DAT_RETURN {
	if _, ok := lookup[*evdObj](h, C.SRN_EVD); !ok {
		return invalid(C.SRN_EVD)
	}
	if cno != nil {
		return datNotImplemented
	}
	return datSuccess
}

// An EVD is always enabled: events are queued whether or not anyone waits.

//export srnEVDEnable
func srnEVDEnable(h C.DAT_EVD_HANDLE) C.DAT_RETURN {
	if _, ok := lookup[*evdObj](h, C.SRN_EVD); !ok {
		return invalid(C.SRN_EVD)
	}
	return datSuccess
}

//export srnEVDDisable
func srnEVDDisable(h C.DAT_EVD_HANDLE) C.DAT_RETURN {
	if _, ok := lookup[*evdObj](h, C.SRN_EVD); !ok {
		return invalid(C.SRN_EVD)
	}
	return datNotImplemented
}

//export srnEVDSetUnwaitable
func srnEVDSetUnwaitable(h C.DAT_EVD_HANDLE) C.DAT_RETURN {
	e, ok := lookup[*evdObj](h, C.SRN_EVD)
	if !ok {
		return invalid(C.SRN_EVD)
	}
	e.unwaitable.Store(true)
	if e.evd != nil {
		e.evd.Interrupt()
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
	return datSuccess
}

//export srnEVDClearUnwaitable
func srnEVDClearUnwaitable(h C.DAT_EVD_HANDLE) C.DAT_RETURN {
	e, ok := lookup[*evdObj](h, C.SRN_EVD)
	if !ok {
		return invalid(C.SRN_EVD)
	}
	e.unwaitable.Store(false)
	return datSuccess
}

//export srnEVDWait
func srnEVDWait(h C.DAT_EVD_HANDLE, timeout C.DAT_TIMEOUT, threshold C.DAT_COUNT, ev *C.DAT_EVENT, nmore *C.DAT_COUNT) C.DAT_RETURN {
	e, ok := lookup[*evdObj](h, C.SRN_EVD)
	if !ok {
		return invalid(C.SRN_EVD)
	}
	if threshold <= 0 || int(threshold) > e.qlen {
		return arg(3)
	}
	if ev == nil {
		return arg(4)
	}
	if e.unwaitable.Load() {
		return datInvalidState | C.DAT_INVALID_STATE_EVD_UNWAITABLE
	}
	if !e.waiter.CompareAndSwap(false, true) {
		return datInvalidStateWaiter
	}
	defer e.waiter.Store(false)
	var deadline time.Time
	if timeout != C.DAT_TIMEOUT_INFINITE {
		deadline = time.Now().Add(time.Duration(timeout) * time.Microsecond)
	}
	if e.evd == nil {
		return e.waitLocal(deadline, nmore)
	}
	for {
		d := time.Duration(-1)
		if !deadline.IsZero() {
			d = max(time.Until(deadline), 0)
		}
		got, more, err := e.evd.WaitTimeout(d, int(threshold))
		if err == nil {
			if nmore != nil {
				*nmore = C.DAT_COUNT(more)
			}
			return e.ia.event(e, &got, ev)
		}
		if !errors.Is(err, client.ErrTimeout) && !errors.Is(err, client.ErrInterrupted) {
			return status(err)
		}
		if e.unwaitable.Load() {
			return datInvalidState | C.DAT_INVALID_STATE_EVD_UNWAITABLE
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			if nmore != nil {
				*nmore = C.DAT_COUNT(e.evd.Pending())
			}
			return datTimeoutExpired
		}
	}
}

// waitLocal waits on an EVD nothing produces into: until the deadline,
// until the EVD is freed, or until it is made unwaitable.
func (e *evdObj) waitLocal(deadline time.Time, nmore *C.DAT_COUNT) C.DAT_RETURN {
	if nmore != nil {
		*nmore = 0
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(max(time.Until(deadline), 0))
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case <-e.done:
			return datAbort
		case <-timeout:
			return datTimeoutExpired
		case <-e.kick:
			if e.unwaitable.Load() {
				return datInvalidState | C.DAT_INVALID_STATE_EVD_UNWAITABLE
			}
		}
	}
}

//export srnEVDDequeue
func srnEVDDequeue(h C.DAT_EVD_HANDLE, ev *C.DAT_EVENT) C.DAT_RETURN {
	e, ok := lookup[*evdObj](h, C.SRN_EVD)
	if !ok {
		return invalid(C.SRN_EVD)
	}
	if ev == nil {
		return arg(2)
	}
	if e.waiter.Load() {
		return datInvalidState // DAT: not while a thread waits on it (libdapl too)
	}
	if e.evd == nil {
		return datQueueEmpty
	}
	got, ok, err := e.evd.Dequeue()
	if err != nil {
		return status(err)
	}
	if !ok {
		return datQueueEmpty
	}
	return e.ia.event(e, &got, ev)
}

//export srnEVDFree
func srnEVDFree(h C.DAT_EVD_HANDLE) C.DAT_RETURN {
	e, ok := lookup[*evdObj](h, C.SRN_EVD)
	if !ok {
		return invalid(C.SRN_EVD)
	}
	if e.evd != nil {
		if err := e.evd.Free(); err != nil {
			// In use by an EP or a PSP (DAT_INVALID_STATE), or the
			// daemon is gone: the handle stays.
			if !errors.Is(err, client.ErrClosed) {
				return status(err) | C.DAT_INVALID_STATE_EVD_IN_USE
			}
		}
	}
	e.close()
	e.ia.untrack(e)
	e.ia.mu.Lock()
	if e.ia.async == e {
		e.ia.async = nil
	}
	e.ia.mu.Unlock()
	dropHandle(e)
	return datSuccess
}

// dtoStatus maps completion statuses to DAT's.
var dtoStatus = [...]C.DAT_DTO_COMPLETION_STATUS{
	completion.Success:               C.DAT_DTO_SUCCESS,
	completion.LocalLengthError:      C.DAT_DTO_ERR_LOCAL_LENGTH,
	completion.LocalProtectionError:  C.DAT_DTO_ERR_LOCAL_PROTECTION,
	completion.LocalQPOperationError: C.DAT_DTO_ERR_LOCAL_EP,
	completion.FlushError:            C.DAT_DTO_ERR_FLUSHED,
	completion.RemoteAccessError:     C.DAT_DTO_ERR_REMOTE_ACCESS,
	completion.RemoteOperationError:  C.DAT_DTO_ERR_REMOTE_RESPONDER,
	completion.RemoteInvalidRequest:  C.DAT_DTO_ERR_REMOTE_RESPONDER,
	completion.BadResponse:           C.DAT_DTO_ERR_BAD_RESPONSE,
	completion.GeneralError:          C.DAT_DTO_ERR_TRANSPORT,
}

// dtoOp maps completion opcodes to DAT's.
func dtoOp(o completion.Opcode) C.DAT_DTOS {
	switch o {
	case completion.OpSend, completion.OpImmediate:
		return C.DAT_DTO_SEND
	case completion.OpWrite:
		return C.DAT_DTO_RDMA_WRITE
	case completion.OpRead:
		return C.DAT_DTO_RDMA_READ
	case completion.OpRecv, completion.OpRecvImmediate:
		return C.DAT_DTO_RECEIVE
	}
	return C.DAT_DTO_SEND
}

// connEvent maps connection events to DAT's.
var connEvent = map[client.ConnEvent]C.DAT_EVENT_NUMBER{
	client.Established:           C.DAT_CONNECTION_EVENT_ESTABLISHED,
	client.PeerRejected:          C.DAT_CONNECTION_EVENT_PEER_REJECTED,
	client.NonPeerRejected:       C.DAT_CONNECTION_EVENT_NON_PEER_REJECTED,
	client.Unreachable:           C.DAT_CONNECTION_EVENT_UNREACHABLE,
	client.TimedOut:              C.DAT_CONNECTION_EVENT_TIMED_OUT,
	client.Disconnected:          C.DAT_CONNECTION_EVENT_DISCONNECTED,
	client.Broken:                C.DAT_CONNECTION_EVENT_BROKEN,
	client.AcceptCompletionError: C.DAT_CONNECTION_EVENT_ACCEPT_COMPLETION_ERROR,
}

// event writes ev as the DAT event out.
func (ia *iaObj) event(e *evdObj, ev *client.Event, out *C.DAT_EVENT) C.DAT_RETURN {
	evd := C.DAT_EVD_HANDLE(e.dat())
	switch ev.Type {
	case client.DTOCompletion:
		ep := ia.epOf(ev.EP)
		var eph C.DAT_EP_HANDLE
		length := ev.Length
		if ep != nil {
			eph = C.DAT_EP_HANDLE(ep.dat())
			if ev.Opcode == completion.OpRead {
				length = ep.readDone(ev.Status == completion.Success, length)
			}
		}
		if debug && ev.Status != completion.Success {
			logf("EP %p: %v %v completed %v (cookie %#x, %d octets), cause %v", ep.handleOrNil(), ev.Opcode, ev.Status, ev.Status,
				ev.Cookie, ev.Length, ev.Cause)
		}
		st := C.DAT_DTO_COMPLETION_STATUS(C.DAT_DTO_ERR_TRANSPORT)
		if int(ev.Status) < len(dtoStatus) {
			st = dtoStatus[ev.Status]
		}
		C.srn_dto_event(out, evd, eph, C.uint64_t(ev.Cookie), st, C.DAT_SEG_LENGTH(length), dtoOp(ev.Opcode),
			C.DAT_RMR_CONTEXT(ev.Invalidated))
	case client.ConnectionEvent:
		ep := ia.epOf(ev.EP)
		if debug {
			logf("EP %p: %v", ep.handleOrNil(), ev.Conn)
		}
		n, ok := connEvent[ev.Conn]
		if !ok {
			n = C.DAT_CONNECTION_EVENT_BROKEN
		}
		if ep == nil {
			C.srn_conn_event(out, evd, n, nil, 0, nil)
			return datSuccess
		}
		pdLen := 0
		if ev.Conn == client.Established || ev.Conn == client.PeerRejected {
			pdLen = ep.peerPrivateData()
		}
		var pd C.DAT_PVOID
		if pdLen > 0 {
			pd = C.DAT_PVOID(unsafe.Pointer(&ep.c.pdata[0]))
		}
		C.srn_conn_event(out, evd, n, C.DAT_EP_HANDLE(ep.dat()), C.DAT_COUNT(pdLen), pd)
	case client.ConnectionRequest:
		cr, sp, qual, rc := ia.newCR(ev)
		if rc != datSuccess {
			return rc
		}
		C.srn_cr_event(out, evd, sp, C.DAT_IA_ADDRESS_PTR(unsafe.Pointer(&ia.h().c.local)), C.DAT_CONN_QUAL(qual),
			C.DAT_CR_HANDLE(cr.dat()))
	case client.Overflow:
		C.srn_async_event(out, evd, C.DAT_ASYNC_ERROR_EVD_OVERFLOW, C.DAT_HANDLE(e.dat()), C.DAT_EVD_OVERFLOW_ERROR)
	default:
		C.srn_async_event(out, evd, C.DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR, C.DAT_HANDLE(ia.h().dat()), 0)
	}
	return datSuccess
}
