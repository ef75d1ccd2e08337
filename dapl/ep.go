package main

/*
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include "srn.h"
*/
import "C"

import (
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/shm"
)

// Limits the provider reports and enforces.
const (
	// maxMessage: a Send, Write or Read of up to 2^31 octets.
	maxMessage = 1 << 31
	// maxReadIOV: an RDMA Read scatters into up to four local segments;
	// iWARP's Read Request names one sink, so the provider posts one Read
	// per segment, each reading the next part of the remote buffer.
	maxReadIOV = 4
	// Defaults of dat_ep_create with no attributes.
	defaultDepth   = 64
	defaultReadsIn = 8
)

// epObj is an endpoint.
type epObj struct {
	handle
	ep              *client.EP
	pz              *pzObj
	recv, req, conn *evdObj
	attr            epAttr

	// mu guards pz, recv, req, conn, attr (ep_modify changes them),
	// active, reads and the C half's addresses and private data.
	mu sync.Mutex
	// modifyMu serializes ep_modify (held across the daemon's call).
	modifyMu sync.Mutex
	// active: the EP connects (ep_connect), so its ESTABLISHED carries
	// the accepting peer's private data; a passive EP's carries none.
	active bool
	// reads are the lengths of the signaled RDMA Reads in flight, in
	// posting order (Reads complete in order): a Read split into several
	// reports the whole length at its one completion.
	reads []uint32
}

// snapshot is the EP's changeable fields, read under mu.
func (ep *epObj) snapshot() (pz *pzObj, recv, req, conn *evdObj, a epAttr) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.pz, ep.recv, ep.req, ep.conn, ep.attr
}

// epAttr are the DAT attributes an EP was given (or defaulted to).
type epAttr struct {
	maxMessage, maxRDMA           uint32
	recvFlags, reqFlags           C.DAT_COMPLETION_FLAGS
	recvDTOs, reqDTOs             int
	recvIOV, reqIOV               int
	readIn, readOut               int
	readIOV, writeIOV             int
	transportSpecific, vendorSpec int
}

func defaultEPAttr() epAttr {
	return epAttr{maxMessage: maxMessage, maxRDMA: maxMessage, recvFlags: C.DAT_COMPLETION_DEFAULT_FLAG,
		reqFlags: C.DAT_COMPLETION_DEFAULT_FLAG, recvDTOs: defaultDepth, reqDTOs: defaultDepth,
		recvIOV: shm.RQSGE, reqIOV: shm.RingSGE, readIn: defaultReadsIn, readOut: defaultReadsIn,
		readIOV: maxReadIOV, writeIOV: shm.RingSGE}
}

// fromDAT reads and checks the consumer's attributes.
func (a *epAttr) fromDAT(d *C.DAT_EP_ATTR, at ctl.IAAttr) bool {
	if d.service_type != C.DAT_SERVICE_TYPE_RC {
		return false
	}
	*a = epAttr{maxMessage: uint32(d.max_message_size), maxRDMA: uint32(d.max_rdma_size),
		recvFlags: d.recv_completion_flags, reqFlags: d.request_completion_flags,
		recvDTOs: int(d.max_recv_dtos), reqDTOs: int(d.max_request_dtos),
		recvIOV: int(d.max_recv_iov), reqIOV: int(d.max_request_iov),
		readIn: int(d.max_rdma_read_in), readOut: int(d.max_rdma_read_out),
		readIOV: int(d.max_rdma_read_iov), writeIOV: int(d.max_rdma_write_iov)}
	if a.maxMessage == 0 {
		a.maxMessage = maxMessage
	}
	if a.maxRDMA == 0 {
		a.maxRDMA = maxMessage
	}
	if a.readIOV == 0 {
		a.readIOV = 1
	}
	if a.writeIOV == 0 {
		a.writeIOV = a.reqIOV
	}
	return a.recvDTOs >= 0 && a.reqDTOs >= 0 && a.recvDTOs <= int(at.MaxRQ) && a.reqDTOs <= int(at.MaxSQ) &&
		a.recvIOV >= 0 && a.recvIOV <= shm.RQSGE && a.reqIOV >= 0 && a.reqIOV <= shm.RingSGE &&
		a.readIn >= 0 && a.readIn <= int(at.MaxIRD) && a.readOut >= 0 && a.readOut <= int(at.MaxORD) &&
		a.readIOV <= maxReadIOV && a.writeIOV >= 0 && a.writeIOV <= shm.RingSGE
}

func (a *epAttr) toDAT(d *C.DAT_EP_ATTR) {
	C.memset(unsafe.Pointer(d), 0, C.sizeof_DAT_EP_ATTR)
	d.service_type = C.DAT_SERVICE_TYPE_RC
	d.max_message_size = C.DAT_SEG_LENGTH(a.maxMessage)
	d.max_rdma_size = C.DAT_SEG_LENGTH(a.maxRDMA)
	d.qos = C.DAT_QOS_BEST_EFFORT
	d.recv_completion_flags = a.recvFlags
	d.request_completion_flags = a.reqFlags
	d.max_recv_dtos = C.DAT_COUNT(a.recvDTOs)
	d.max_request_dtos = C.DAT_COUNT(a.reqDTOs)
	d.max_recv_iov = C.DAT_COUNT(a.recvIOV)
	d.max_request_iov = C.DAT_COUNT(a.reqIOV)
	d.max_rdma_read_in = C.DAT_COUNT(a.readIn)
	d.max_rdma_read_out = C.DAT_COUNT(a.readOut)
	d.max_rdma_read_iov = C.DAT_COUNT(a.readIOV)
	d.max_rdma_write_iov = C.DAT_COUNT(a.writeIOV)
}

// client is the EP's attributes for the daemon. Every EP asks for MPA's
// peer-to-peer mode (RFC 6581): in plain MPA the responder may not send
// until the initiator has (RFC 5044 §7.1.2), and DAT consumers let either
// side speak first (dapltest's performance server sends before its client
// does); in peer-to-peer mode the initiator's RTR, sent at once, lets the
// responder go.
func (a *epAttr) client(pz *pzObj, recv, req, conn *evdObj) client.EPAttr {
	return client.EPAttr{PZ: pz.client(), RecvEVD: recv.client(), RequestEVD: req.client(), ConnectEVD: conn.client(),
		SQDepth: max(a.reqDTOs, 1), RQDepth: max(a.recvDTOs, 1), IRD: a.readIn, ORD: a.readOut, PeerToPeer: true}
}

// evdArg looks up an optional EVD of the IA; false if h is not one.
func (ia *iaObj) evdArg(h C.DAT_EVD_HANDLE) (*evdObj, bool) {
	if h == nil {
		return nil, true
	}
	e, ok := lookup[*evdObj](h, C.SRN_EVD)
	return e, ok && e.ia == ia
}

func (e *evdObj) client() *client.EVD {
	if e == nil {
		return nil
	}
	return e.evd
}

func (p *pzObj) client() *client.PZ {
	if p == nil {
		return nil
	}
	return p.pz
}

//export srnEPCreate
func srnEPCreate(h C.DAT_IA_HANDLE, pzh C.DAT_PZ_HANDLE, recvh, reqh, connh C.DAT_EVD_HANDLE, attr *C.DAT_EP_ATTR,
	out *C.DAT_EP_HANDLE) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](h, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	var pz *pzObj
	if pzh != nil {
		if pz, ok = lookup[*pzObj](pzh, C.SRN_PZ); !ok || pz.ia != ia {
			return invalid(C.SRN_PZ)
		}
	}
	recv, ok1 := ia.evdArg(recvh)
	req, ok2 := ia.evdArg(reqh)
	conn, ok3 := ia.evdArg(connh)
	switch {
	case !ok1:
		return datInvalidHandle | C.DAT_INVALID_HANDLE_EVD_RECV
	case !ok2:
		return datInvalidHandle | C.DAT_INVALID_HANDLE_EVD_REQUEST
	case !ok3:
		return datInvalidHandle | C.DAT_INVALID_HANDLE_EVD_CONN
	}
	if out == nil {
		return arg(7)
	}
	a := defaultEPAttr()
	if attr != nil && !a.fromDAT(attr, ia.cl.Attr()) {
		return arg(6)
	}
	ep, err := ia.cl.CreateEP(a.client(pz, recv, req, conn))
	if err != nil {
		return status(err)
	}
	o := &epObj{ep: ep, pz: pz, recv: recv, req: req, conn: conn, attr: a}
	ia.addEP(o)
	*out = C.DAT_EP_HANDLE(o.dat())
	return datSuccess
}

// addEP gives an EP its handle and enters it in the IA's lists.
func (ia *iaObj) addEP(o *epObj) {
	newHandle(o, C.SRN_EP, ia, ia.prov.table)
	ia.mu.Lock()
	ia.objs[o] = struct{}{}
	ia.eps[o.ep] = o
	ia.mu.Unlock()
}

// epState maps the daemon's EP states to DAT's.
var epState = [...]C.DAT_EP_STATE{
	ctl.EPUnconnected:       C.DAT_EP_STATE_UNCONNECTED,
	ctl.EPReserved:          C.DAT_EP_STATE_RESERVED,
	ctl.EPPassivePending:    C.DAT_EP_STATE_PASSIVE_CONNECTION_PENDING,
	ctl.EPActivePending:     C.DAT_EP_STATE_ACTIVE_CONNECTION_PENDING,
	ctl.EPTentativePending:  C.DAT_EP_STATE_TENTATIVE_CONNECTION_PENDING,
	ctl.EPCompletionPending: C.DAT_EP_STATE_COMPLETION_PENDING,
	ctl.EPConnected:         C.DAT_EP_STATE_CONNECTED,
	ctl.EPDisconnectPending: C.DAT_EP_STATE_DISCONNECT_PENDING,
	ctl.EPDisconnected:      C.DAT_EP_STATE_DISCONNECTED,
}

func datState(s client.EPState) C.DAT_EP_STATE {
	if int(s) < len(epState) {
		return epState[s]
	}
	return C.DAT_EP_STATE_DISCONNECTED
}

func (e *evdObj) datHandle() C.DAT_EVD_HANDLE {
	if e == nil {
		return nil
	}
	return C.DAT_EVD_HANDLE(e.dat())
}

//export srnEPQuery
func srnEPQuery(h C.DAT_EP_HANDLE, mask C.DAT_EP_PARAM_MASK, p *C.DAT_EP_PARAM) C.DAT_RETURN {
	ep, ok := lookup[*epObj](h, C.SRN_EP)
	if !ok {
		return invalid(C.SRN_EP)
	}
	if p == nil {
		return arg(3)
	}
	info, err := ep.ep.Query()
	if err != nil {
		return status(err)
	}
	C.memset(unsafe.Pointer(p), 0, C.sizeof_DAT_EP_PARAM)
	p.ia_handle = ep.ia.consumerHandle()
	p.ep_state = datState(info.State)
	pz, recv, req, conn, attr := ep.snapshot()
	ep.mu.Lock()
	lport := addrPort(&ep.c.local, info.LocalAddr)
	rport := addrPort(&ep.c.remote, info.RemoteAddr)
	ep.mu.Unlock()
	p.local_ia_address_ptr = C.DAT_IA_ADDRESS_PTR(unsafe.Pointer(&ep.ia.c2().local))
	if lport != 0 {
		p.local_ia_address_ptr = C.DAT_IA_ADDRESS_PTR(unsafe.Pointer(&ep.c.local))
	}
	p.local_port_qual = C.DAT_PORT_QUAL(lport)
	if rport != 0 {
		p.remote_ia_address_ptr = C.DAT_IA_ADDRESS_PTR(unsafe.Pointer(&ep.c.remote))
	}
	p.remote_port_qual = C.DAT_PORT_QUAL(rport)
	if pz != nil {
		p.pz_handle = C.DAT_PZ_HANDLE(pz.dat())
	}
	p.recv_evd_handle = recv.datHandle()
	p.request_evd_handle = req.datHandle()
	p.connect_evd_handle = conn.datHandle()
	attr.toDAT(&p.ep_attr)
	return datSuccess
}

// Attributes dat_ep_modify can change.
const (
	modPZ     = C.DAT_EP_FIELD_PZ_HANDLE
	modEVDs   = C.DAT_EP_FIELD_RECV_EVD_HANDLE | C.DAT_EP_FIELD_REQUEST_EVD_HANDLE | C.DAT_EP_FIELD_CONNECT_EVD_HANDLE
	modDepths = C.DAT_EP_FIELD_EP_ATTR_MAX_RECV_DTOS | C.DAT_EP_FIELD_EP_ATTR_MAX_REQUEST_DTOS
	modReads  = C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_IN | C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_OUT
	// Attributes that change nothing in the daemon: the provider keeps
	// them and checks them at post.
	modLocal = C.DAT_EP_FIELD_EP_ATTR_MAX_MESSAGE_SIZE | C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_SIZE |
		C.DAT_EP_FIELD_EP_ATTR_RECV_COMPLETION_FLAGS | C.DAT_EP_FIELD_EP_ATTR_REQUEST_COMPLETION_FLAGS |
		C.DAT_EP_FIELD_EP_ATTR_MAX_RECV_IOV | C.DAT_EP_FIELD_EP_ATTR_MAX_REQUEST_IOV |
		C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_IOV | C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_WRITE_IOV
)

//export srnEPModify
func srnEPModify(h C.DAT_EP_HANDLE, mask C.DAT_EP_PARAM_MASK, p *C.DAT_EP_PARAM) C.DAT_RETURN {
	ep, ok := lookup[*epObj](h, C.SRN_EP)
	if !ok {
		return invalid(C.SRN_EP)
	}
	if p == nil {
		return arg(3)
	}
	if mask&^(modPZ|modEVDs|modDepths|modReads|modLocal) != 0 {
		return arg(2)
	}
	ia := ep.ia
	ep.modifyMu.Lock()
	defer ep.modifyMu.Unlock()
	pz, recv, req, conn, a := ep.snapshot()
	if mask&modPZ != 0 {
		pz = nil
		if p.pz_handle != nil {
			if pz, ok = lookup[*pzObj](p.pz_handle, C.SRN_PZ); !ok || pz.ia != ia {
				return invalid(C.SRN_PZ)
			}
		}
	}
	var ok1, ok2, ok3 = true, true, true
	if mask&C.DAT_EP_FIELD_RECV_EVD_HANDLE != 0 {
		recv, ok1 = ia.evdArg(p.recv_evd_handle)
	}
	if mask&C.DAT_EP_FIELD_REQUEST_EVD_HANDLE != 0 {
		req, ok2 = ia.evdArg(p.request_evd_handle)
	}
	if mask&C.DAT_EP_FIELD_CONNECT_EVD_HANDLE != 0 {
		conn, ok3 = ia.evdArg(p.connect_evd_handle)
	}
	if !ok1 || !ok2 || !ok3 {
		return datInvalidHandle
	}
	var d epAttr
	if !d.fromDAT(&p.ep_attr, ia.cl.Attr()) && mask&(modDepths|modReads|modLocal) != 0 {
		return arg(3)
	}
	set := func(bit C.DAT_EP_PARAM_MASK, dst *int, v int) {
		if mask&bit != 0 {
			*dst = v
		}
	}
	set(C.DAT_EP_FIELD_EP_ATTR_MAX_RECV_DTOS, &a.recvDTOs, d.recvDTOs)
	set(C.DAT_EP_FIELD_EP_ATTR_MAX_REQUEST_DTOS, &a.reqDTOs, d.reqDTOs)
	set(C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_IN, &a.readIn, d.readIn)
	set(C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_OUT, &a.readOut, d.readOut)
	set(C.DAT_EP_FIELD_EP_ATTR_MAX_RECV_IOV, &a.recvIOV, d.recvIOV)
	set(C.DAT_EP_FIELD_EP_ATTR_MAX_REQUEST_IOV, &a.reqIOV, d.reqIOV)
	set(C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_IOV, &a.readIOV, d.readIOV)
	set(C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_WRITE_IOV, &a.writeIOV, d.writeIOV)
	if mask&C.DAT_EP_FIELD_EP_ATTR_MAX_MESSAGE_SIZE != 0 {
		a.maxMessage = d.maxMessage
	}
	if mask&C.DAT_EP_FIELD_EP_ATTR_MAX_RDMA_SIZE != 0 {
		a.maxRDMA = d.maxRDMA
	}
	if mask&C.DAT_EP_FIELD_EP_ATTR_RECV_COMPLETION_FLAGS != 0 {
		a.recvFlags = d.recvFlags
	}
	if mask&C.DAT_EP_FIELD_EP_ATTR_REQUEST_COMPLETION_FLAGS != 0 {
		a.reqFlags = d.reqFlags
	}
	var cmask uint32
	if mask&modPZ != 0 {
		cmask |= ctl.ModifyPZ
	}
	if mask&modEVDs != 0 {
		cmask |= ctl.ModifyEVDs
	}
	if mask&modDepths != 0 {
		cmask |= ctl.ModifyDepths
	}
	if mask&modReads != 0 {
		cmask |= ctl.ModifyIRDORD
	}
	if cmask != 0 {
		err := ep.ep.Modify(cmask, a.client(pz, recv, req, conn))
		if err != nil {
			return status(err)
		}
	}
	ep.mu.Lock()
	ep.pz, ep.recv, ep.req, ep.conn, ep.attr = pz, recv, req, conn, a
	ep.mu.Unlock()
	return datSuccess
}

// qualPort maps a connection qualifier to the TCP port, as libdaplofa
// (openib_cma) does, so that a softrnic consumer and a libdaplofa one on
// another RNIC meet: a 16-bit qualifier is the port itself, a larger one
// folds into 33534..65534.
func qualPort(q C.DAT_CONN_QUAL) uint16 {
	if q <= 0xffff {
		return uint16(q)
	}
	return uint16(q%32001) + 33534
}

// infiniteConnect stands for DAT_TIMEOUT_INFINITE in a connect.
const infiniteConnect = 24 * time.Hour

//export srnEPConnect
func srnEPConnect(h C.DAT_EP_HANDLE, addr C.DAT_IA_ADDRESS_PTR, qual C.DAT_CONN_QUAL, timeout C.DAT_TIMEOUT,
	pdLen C.DAT_COUNT, pd C.DAT_PVOID, qos C.DAT_QOS, flags C.DAT_CONNECT_FLAGS) C.DAT_RETURN {
	ep, ok := lookup[*epObj](h, C.SRN_EP)
	if !ok {
		return invalid(C.SRN_EP)
	}
	if addr == nil {
		return arg(2)
	}
	sa := (*C.struct_sockaddr)(unsafe.Pointer(addr))
	if sa.sa_family != C.AF_INET {
		return datInvalidAddress // softrnicd speaks IPv4
	}
	sin := (*C.struct_sockaddr_in)(unsafe.Pointer(addr))
	ip := netip.AddrFrom4(*(*[4]byte)(unsafe.Pointer(&sin.sin_addr)))
	if pdLen < 0 || int(pdLen) > int(ep.ia.cl.Attr().MaxPrivate) || (pdLen > 0 && pd == nil) {
		return arg(5)
	}
	d := infiniteConnect
	if timeout != C.DAT_TIMEOUT_INFINITE {
		d = max(time.Duration(timeout)*time.Microsecond, time.Millisecond)
	}
	var data []byte
	if pdLen > 0 {
		data = C.GoBytes(unsafe.Pointer(pd), C.int(pdLen))
	}
	port := qualPort(qual)
	if port == 0 {
		return arg(3)
	}
	if err := ep.ep.Connect(netip.AddrPortFrom(ip, port).String(), data, d); err != nil {
		return status(err)
	}
	ep.mu.Lock()
	ep.active = true
	ep.mu.Unlock()
	return datSuccess
}

//export srnEPDisconnect
func srnEPDisconnect(h C.DAT_EP_HANDLE, flags C.DAT_CLOSE_FLAGS) C.DAT_RETURN {
	ep, ok := lookup[*epObj](h, C.SRN_EP)
	if !ok {
		return invalid(C.SRN_EP)
	}
	if flags != C.DAT_CLOSE_ABRUPT_FLAG && flags != C.DAT_CLOSE_GRACEFUL_FLAG {
		return arg(2)
	}
	if flags == C.DAT_CLOSE_GRACEFUL_FLAG {
		return status(ep.ep.Disconnect(true))
	}
	// DAT_CLOSE_ABRUPT_FLAG closes as libdaplofa closes on iWARP (both
	// flags are rdma_disconnect there): an orderly close, so that what
	// the consumer already saw complete reaches the peer (a reset would
	// throw away octets still in the LLP's send buffer: dapltest's last
	// message, posted and completed just before its abrupt disconnect).
	// A connection that has not closed within abruptGrace is reset.
	st, _ := ep.ep.PostableState()
	if uint8(st) != ctl.EPConnected {
		return status(ep.ep.Disconnect(false))
	}
	if err := ep.ep.Disconnect(true); err != nil {
		return status(ep.ep.Disconnect(false))
	}
	c := ep.ep
	time.AfterFunc(abruptGrace, func() {
		if st, err := c.State(); err == nil && uint8(st) == ctl.EPDisconnectPending {
			_ = c.Disconnect(false)
		}
	})
	return datSuccess
}

// abruptGrace bounds an abrupt disconnect's orderly close.
const abruptGrace = 2 * time.Second

//export srnEPGetStatus
func srnEPGetStatus(h C.DAT_EP_HANDLE, state *C.DAT_EP_STATE, recvIdle, reqIdle *C.DAT_BOOLEAN) C.DAT_RETURN {
	ep, ok := lookup[*epObj](h, C.SRN_EP)
	if !ok {
		return invalid(C.SRN_EP)
	}
	if state != nil {
		s, err := ep.ep.State()
		if err != nil {
			return status(err)
		}
		*state = datState(s)
	}
	// Whether requests are outstanding is the daemon's to know, and it
	// does not say: report not idle, which DAT allows callers to poll.
	if recvIdle != nil {
		*recvIdle = C.DAT_FALSE
	}
	if reqIdle != nil {
		*reqIdle = C.DAT_FALSE
	}
	return datSuccess
}

func datBool(b bool) C.DAT_BOOLEAN {
	if b {
		return C.DAT_TRUE
	}
	return C.DAT_FALSE
}

//export srnEPFree
func srnEPFree(h C.DAT_EP_HANDLE) C.DAT_RETURN {
	ep, ok := lookup[*epObj](h, C.SRN_EP)
	if !ok {
		return invalid(C.SRN_EP)
	}
	if err := ep.ep.Free(); err != nil {
		return status(err)
	}
	ep.ia.untrack(ep)
	dropHandle(ep)
	return datSuccess
}

//export srnEPReset
func srnEPReset(h C.DAT_EP_HANDLE) C.DAT_RETURN {
	ep, ok := lookup[*epObj](h, C.SRN_EP)
	if !ok {
		return invalid(C.SRN_EP)
	}
	if err := ep.ep.Reset(); err != nil {
		return status(err)
	}
	ep.mu.Lock()
	ep.reads = ep.reads[:0]
	ep.mu.Unlock()
	return datSuccess
}

func (ep *epObj) handleOrNil() unsafe.Pointer {
	if ep == nil {
		return nil
	}
	return unsafe.Pointer(ep.c)
}

// peerPrivateData copies the private data the peer sent with its MPA
// Reply into an active EP's C half; returns its length (0 for a passive
// EP: DAT gives the accepting side's ESTABLISHED none, as libdapl does).
func (ep *epObj) peerPrivateData() int {
	ep.mu.Lock()
	active := ep.active
	ep.mu.Unlock()
	if !active {
		return 0
	}
	info, err := ep.ep.Query()
	if err != nil {
		return 0
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	n := min(len(info.PrivateData), C.SRN_MAX_PDATA)
	if n > 0 {
		C.memcpy(unsafe.Pointer(&ep.c.pdata[0]), unsafe.Pointer(&info.PrivateData[0]), C.size_t(n))
	}
	ep.c.pdata_len = C.DAT_COUNT(n)
	return n
}

// readDone is the length to report for a completed Read: the whole of a
// split Read.
func (ep *epObj) readDone(ok bool, n uint32) uint32 {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if !ok {
		ep.reads = ep.reads[:0] // the EP is broken: the rest flush
		return n
	}
	if len(ep.reads) == 0 {
		return n
	}
	n = ep.reads[0]
	ep.reads = append(ep.reads[:0], ep.reads[1:]...)
	return n
}

//export srnPost
func srnPost(h C.DAT_EP_HANDLE, what C.int, n C.DAT_COUNT, iov *C.DAT_LMR_TRIPLET, cookie C.uint64_t,
	remote *C.DAT_RMR_TRIPLET, flags C.DAT_COMPLETION_FLAGS) C.DAT_RETURN {
	ep, ok := lookup[*epObj](h, C.SRN_EP)
	if !ok {
		return invalid(C.SRN_EP)
	}
	if n < 0 || (n > 0 && iov == nil) {
		return arg(2)
	}
	limit := shm.RingSGE
	switch what {
	case C.SRN_POST_RECV:
		limit = shm.RQSGE
	case C.SRN_POST_READ:
		limit = maxReadIOV
	}
	if int(n) > limit {
		return arg(2)
	}
	var segs [shm.RingSGE]client.Segment
	var total uint64
	k := 0
	if n > 0 {
		for _, t := range unsafe.Slice(iov, int(n)) {
			if t.segment_length == 0 {
				continue // DAT: the other fields of an empty triplet mean nothing
			}
			segs[k] = client.Segment{Context: uint32(t.lmr_context), Offset: uint64(t.virtual_address), Length: uint32(t.segment_length)}
			if segs[k].Context == 0 {
				return datProtection
			}
			total += uint64(t.segment_length)
			k++
		}
	}
	if total > maxMessage {
		return datLengthError
	}
	var f client.Flags
	if flags&C.DAT_COMPLETION_SUPPRESS_FLAG == 0 {
		f |= client.Signaled
	}
	if flags&C.DAT_COMPLETION_SOLICITED_WAIT_FLAG != 0 {
		f |= client.Solicited
	}
	if flags&C.DAT_COMPLETION_BARRIER_FENCE_FLAG != 0 {
		f |= client.Fence
	}
	if what != C.SRN_POST_RECV {
		if rc := ep.postable(); rc != datSuccess {
			return rc
		}
	}
	id := uint64(cookie)
	var err error
	switch what {
	case C.SRN_POST_SEND:
		err = ep.ep.PostSend(id, segs[:k], f)
	case C.SRN_POST_RECV:
		err = ep.ep.PostRecv(id, segs[:k])
	case C.SRN_POST_WRITE, C.SRN_POST_READ:
		if remote == nil {
			return arg(5)
		}
		to := client.RemoteBuffer{Context: uint32(remote.rmr_context), Address: uint64(remote.virtual_address)}
		if what == C.SRN_POST_WRITE {
			err = ep.ep.PostWrite(id, segs[:k], to, f)
		} else {
			err = ep.postRead(id, segs[:k], to, f, uint32(total))
		}
	default:
		return arg(2)
	}
	return status(err)
}

// postable: a Send, Write or Read may be posted: the EP is CONNECTED (or
// disconnecting, or DISCONNECTED: the request is flushed), as DAT says.
func (ep *epObj) postable() C.DAT_RETURN {
	st, ok := ep.ep.PostableState()
	if !ok {
		return datInvalidState | C.DAT_INVALID_STATE_EP_UNCONFIGURED
	}
	switch uint8(st) {
	case ctl.EPConnected, ctl.EPDisconnectPending, ctl.EPDisconnected:
		return datSuccess
	case ctl.EPUnconnected:
		return datInvalidState | C.DAT_INVALID_STATE_EP_UNCONNECTED
	case ctl.EPActivePending:
		return datInvalidState | C.DAT_INVALID_STATE_EP_ACTCONNPENDING
	case ctl.EPCompletionPending:
		return datInvalidState | C.DAT_INVALID_STATE_EP_COMPLPENDING
	}
	return datInvalidState
}

// postRead posts the Read (client.PostReadv splits it per local segment)
// and notes its whole length for its completion (readDone).
func (ep *epObj) postRead(id uint64, segs []client.Segment, from client.RemoteBuffer, f client.Flags, total uint32) error {
	if len(segs) == 0 {
		return client.ErrInvalidParameter // a Read needs a sink
	}
	signaled := f&client.Signaled != 0
	// ep.mu orders the lengths as the Reads are posted.
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if err := ep.ep.PostReadv(id, segs, from, f); err != nil {
		return err
	}
	if signaled {
		ep.reads = append(ep.reads, total)
	}
	return nil
}

// qualOf is a qualifier from a Go integer (tests cannot name C types).
func qualOf(q uint64) C.DAT_CONN_QUAL { return C.DAT_CONN_QUAL(q) }
