package main

/*
#include <string.h>
#include "srn.h"
*/
import "C"

import (
	"errors"
	"math/rand/v2"
	"unsafe"

	"github.com/softrnic/softrnic/client"
)

// spObj is a public or reserved service point: a listening TCP port.
type spObj struct {
	handle
	sp    *client.PSP
	port  uint16
	qual  C.DAT_CONN_QUAL
	evd   *evdObj
	flags C.DAT_PSP_FLAGS
	ep    *epObj // an RSP's EP
}

// listen starts a service point on the qualifier's port.
func (ia *iaObj) listen(qual C.DAT_CONN_QUAL, evd *evdObj, flags C.DAT_PSP_FLAGS, ep *epObj) (*spObj, C.DAT_RETURN) {
	port := qualPort(qual)
	if port == 0 {
		return nil, arg(2)
	}
	var psp *client.PSP
	var err error
	if ep != nil {
		psp, err = ia.cl.CreateRSP(port, ep.ep, evd.evd)
	} else {
		psp, err = ia.cl.CreatePSP(port, evd.evd, flags == C.DAT_PSP_PROVIDER_FLAG)
	}
	if err != nil {
		// The daemon reports a port it cannot listen on as a state
		// error: for DAT, the qualifier is in use.
		if errors.Is(err, client.ErrInvalidState) && ep == nil {
			return nil, datConnQualInUse
		}
		return nil, status(err)
	}
	sp := &spObj{sp: psp, port: port, qual: qual, evd: evd, flags: flags, ep: ep}
	kind := uint32(C.SRN_PSP)
	if ep != nil {
		kind = C.SRN_RSP
	}
	newHandle(sp, kind, ia, ia.prov.table)
	ia.mu.Lock()
	ia.objs[sp] = struct{}{}
	ia.sps[port] = sp
	ia.mu.Unlock()
	return sp, datSuccess
}

func (ia *iaObj) crEVD(h C.DAT_EVD_HANDLE) (*evdObj, C.DAT_RETURN) {
	e, ok := ia.evdArg(h)
	if !ok || e == nil {
		return nil, datInvalidHandle | C.DAT_INVALID_HANDLE_EVD_CR
	}
	if e.flags&C.DAT_EVD_CR_FLAG == 0 || e.evd == nil {
		return nil, datInvalidHandle | C.DAT_INVALID_HANDLE_EVD_CR
	}
	return e, datSuccess
}

//export srnPSPCreate
func srnPSPCreate(h C.DAT_IA_HANDLE, qual C.DAT_CONN_QUAL, evdh C.DAT_EVD_HANDLE, flags C.DAT_PSP_FLAGS, out *C.DAT_PSP_HANDLE) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](h, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	evd, rc := ia.crEVD(evdh)
	if rc != datSuccess {
		return rc
	}
	if flags != C.DAT_PSP_CONSUMER_FLAG && flags != C.DAT_PSP_PROVIDER_FLAG {
		return arg(4)
	}
	if out == nil {
		return arg(5)
	}
	sp, rc := ia.listen(qual, evd, flags, nil)
	if rc != datSuccess {
		return rc
	}
	*out = C.DAT_PSP_HANDLE(sp.dat())
	return datSuccess
}

// Ports dat_psp_create_any tries: the upper half of the dynamic range,
// clear of the 33534.. range large qualifiers fold into only in part; any
// port in use is skipped.
const (
	anyPortLow   = 49152
	anyPortCount = 16384
	anyTries     = 64
)

//export srnPSPCreateAny
func srnPSPCreateAny(h C.DAT_IA_HANDLE, qual *C.DAT_CONN_QUAL, evdh C.DAT_EVD_HANDLE, flags C.DAT_PSP_FLAGS, out *C.DAT_PSP_HANDLE) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](h, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	if qual == nil {
		return arg(2)
	}
	evd, rc := ia.crEVD(evdh)
	if rc != datSuccess {
		return rc
	}
	if flags != C.DAT_PSP_CONSUMER_FLAG && flags != C.DAT_PSP_PROVIDER_FLAG {
		return arg(4)
	}
	if out == nil {
		return arg(5)
	}
	start := rand.IntN(anyPortCount)
	for i := 0; i < anyTries; i++ {
		q := C.DAT_CONN_QUAL(anyPortLow + (start+i*977)%anyPortCount)
		sp, rc := ia.listen(q, evd, flags, nil)
		if rc == datConnQualInUse {
			continue
		}
		if rc != datSuccess {
			return rc
		}
		*qual = q
		*out = C.DAT_PSP_HANDLE(sp.dat())
		return datSuccess
	}
	return datConnQualNone
}

//export srnPSPQuery
func srnPSPQuery(h C.DAT_PSP_HANDLE, mask C.DAT_PSP_PARAM_MASK, p *C.DAT_PSP_PARAM) C.DAT_RETURN {
	sp, ok := lookup[*spObj](h, C.SRN_PSP)
	if !ok {
		return invalid(C.SRN_PSP)
	}
	if p == nil {
		return arg(3)
	}
	p.ia_handle = sp.ia.consumerHandle()
	p.conn_qual = sp.qual
	p.evd_handle = C.DAT_EVD_HANDLE(sp.evd.dat())
	p.psp_flags = sp.flags
	return datSuccess
}

//export srnRSPCreate
func srnRSPCreate(h C.DAT_IA_HANDLE, qual C.DAT_CONN_QUAL, eph C.DAT_EP_HANDLE, evdh C.DAT_EVD_HANDLE, out *C.DAT_RSP_HANDLE) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](h, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	ep, ok := lookup[*epObj](eph, C.SRN_EP)
	if !ok || ep.ia != ia {
		return invalid(C.SRN_EP)
	}
	evd, rc := ia.crEVD(evdh)
	if rc != datSuccess {
		return rc
	}
	if out == nil {
		return arg(5)
	}
	sp, rc := ia.listen(qual, evd, 0, ep)
	if rc != datSuccess {
		return rc
	}
	*out = C.DAT_RSP_HANDLE(sp.dat())
	return datSuccess
}

//export srnRSPQuery
func srnRSPQuery(h C.DAT_RSP_HANDLE, mask C.DAT_RSP_PARAM_MASK, p *C.DAT_RSP_PARAM) C.DAT_RETURN {
	sp, ok := lookup[*spObj](h, C.SRN_RSP)
	if !ok {
		return invalid(C.SRN_RSP)
	}
	if p == nil {
		return arg(3)
	}
	p.ia_handle = sp.ia.consumerHandle()
	p.conn_qual = sp.qual
	p.evd_handle = C.DAT_EVD_HANDLE(sp.evd.dat())
	p.ep_handle = C.DAT_EP_HANDLE(sp.ep.dat())
	return datSuccess
}

// srnSPFree frees a PSP or an RSP.
//
//export srnSPFree
func srnSPFree(h C.DAT_HANDLE) C.DAT_RETURN {
	sp, ok := lookup[*spObj](h, C.SRN_PSP)
	if !ok {
		if sp, ok = lookup[*spObj](h, C.SRN_RSP); !ok {
			return invalid(C.SRN_PSP)
		}
	}
	if err := sp.sp.Free(); err != nil && !errors.Is(err, client.ErrClosed) {
		return status(err)
	}
	sp.ia.untrack(sp)
	dropHandle(sp)
	return datSuccess
}

// crObj is a connection request.
type crObj struct {
	handle
	cr         *client.CR
	sp         *spObj
	ep         *epObj // the provider-created or reserved EP, if any
	remotePort uint16
	// ownsEP: ep was created for this request (a provider PSP's); a
	// reject ends it with the request.
	ownsEP bool
}

// newCR makes the CR object of a connection request event, and returns
// its service point's handle and qualifier.
func (ia *iaObj) newCR(ev *client.Event) (*crObj, C.DAT_HANDLE, uint64, C.DAT_RETURN) {
	// A request the daemon has already given up on (its peer went, or
	// it timed out) still reaches the consumer, whose accept then fails:
	// the event is not lost with the wait that took it.
	info, _ := ev.CR.Query()
	cr := &crObj{cr: ev.CR}
	newHandle(cr, C.SRN_CR, ia, ia.prov.table)
	cr.remotePort = addrPort(&cr.c.remote, info.RemoteAddr)
	n := min(len(info.PrivateData), C.SRN_MAX_PDATA)
	if n > 0 {
		C.memcpy(unsafe.Pointer(&cr.c.pdata[0]), unsafe.Pointer(&info.PrivateData[0]), C.size_t(n))
	}
	cr.c.pdata_len = C.DAT_COUNT(n)
	var local C.struct_sockaddr_in
	port := addrPort(&local, info.LocalAddr)
	ia.mu.Lock()
	cr.sp = ia.sps[port]
	if ev.EP != nil {
		cr.ep = ia.eps[ev.EP]
	}
	ia.mu.Unlock()
	if ev.EP != nil && cr.ep == nil {
		// A provider-created EP: it gets a handle now, with the PSP's
		// defaults and no PZ or EVDs until the consumer sets them.
		cr.ep = &epObj{ep: ev.EP, attr: defaultEPAttr()}
		cr.ownsEP = true
		ia.addEP(cr.ep)
	}
	ia.track(cr)
	var sp C.DAT_HANDLE
	qual := uint64(port)
	if cr.sp != nil {
		qual = uint64(cr.sp.qual)
		// An RSP's too, although DAT says the RSP is gone by now:
		// libdapl names it and dapltest checks that it does.
		sp = C.DAT_HANDLE(cr.sp.dat())
	}
	return cr, sp, qual, datSuccess
}

//export srnCRQuery
func srnCRQuery(h C.DAT_CR_HANDLE, mask C.DAT_CR_PARAM_MASK, p *C.DAT_CR_PARAM) C.DAT_RETURN {
	cr, ok := lookup[*crObj](h, C.SRN_CR)
	if !ok {
		return invalid(C.SRN_CR)
	}
	if p == nil {
		return arg(3)
	}
	C.memset(unsafe.Pointer(p), 0, C.sizeof_DAT_CR_PARAM)
	p.remote_ia_address_ptr = C.DAT_IA_ADDRESS_PTR(unsafe.Pointer(&cr.c.remote))
	p.remote_port_qual = C.DAT_PORT_QUAL(cr.remotePort)
	p.private_data_size = cr.c.pdata_len
	if cr.c.pdata_len > 0 {
		p.private_data = C.DAT_PVOID(unsafe.Pointer(&cr.c.pdata[0]))
	}
	if cr.ep != nil {
		p.local_ep_handle = C.DAT_EP_HANDLE(cr.ep.dat())
	}
	return datSuccess
}

//export srnCRAccept
func srnCRAccept(h C.DAT_CR_HANDLE, eph C.DAT_EP_HANDLE, pdLen C.DAT_COUNT, pd C.DAT_PVOID) C.DAT_RETURN {
	cr, ok := lookup[*crObj](h, C.SRN_CR)
	if !ok {
		return invalid(C.SRN_CR)
	}
	ep := cr.ep
	if eph != nil {
		if ep, ok = lookup[*epObj](eph, C.SRN_EP); !ok || ep.ia != cr.ia {
			return invalid(C.SRN_EP)
		}
	}
	if ep == nil {
		return invalid(C.SRN_EP)
	}
	if pdLen < 0 || int(pdLen) > int(cr.ia.cl.Attr().MaxPrivate) || (pdLen > 0 && pd == nil) {
		return arg(3)
	}
	var data []byte
	if pdLen > 0 {
		data = C.GoBytes(unsafe.Pointer(pd), C.int(pdLen))
	}
	var target *client.EP
	if eph != nil {
		target = ep.ep
	}
	ep.mu.Lock()
	ep.active = false
	ep.mu.Unlock()
	if err := cr.cr.Accept(target, data); err != nil {
		return status(err)
	}
	cr.ia.untrack(cr)
	dropHandle(cr)
	return datSuccess
}

//export srnCRReject
func srnCRReject(h C.DAT_CR_HANDLE, pdLen C.DAT_COUNT, pd C.DAT_PVOID) C.DAT_RETURN {
	cr, ok := lookup[*crObj](h, C.SRN_CR)
	if !ok {
		return invalid(C.SRN_CR)
	}
	if pdLen < 0 || int(pdLen) > int(cr.ia.cl.Attr().MaxPrivate) || (pdLen > 0 && pd == nil) {
		return arg(2)
	}
	var data []byte
	if pdLen > 0 {
		data = C.GoBytes(unsafe.Pointer(pd), C.int(pdLen))
	}
	if err := cr.cr.Reject(data); err != nil {
		return status(err)
	}
	if cr.ownsEP {
		// The daemon drops the EP it made for the request.
		cr.ia.untrack(cr.ep)
		dropHandle(cr.ep)
	}
	cr.ia.untrack(cr)
	dropHandle(cr)
	return datSuccess
}
