package main

/*
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include "srn.h"
*/
import "C"

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/client"
)

// iaObj is an open interface adapter: one session with softrnicd.
type iaObj struct {
	handle
	prov *provider
	cl   *client.IA
	attr struct{ MaxEVDDepth uint32 }
	// async is the IA's asynchronous EVD when the provider created it.
	async *evdObj

	// mu guards the object lists below.
	mu   sync.Mutex
	objs map[object]struct{}
	eps  map[*client.EP]*epObj
	sps  map[uint16]*spObj // by TCP port
	// consumer is the IA handle as libdat2 gave it to the consumer, found
	// at the first query that reports it (consumerHandle).
	consumer C.DAT_IA_HANDLE
}

func (ia *iaObj) h() *handle { return &ia.handle }

func (ia *iaObj) track(o object) {
	ia.mu.Lock()
	ia.objs[o] = struct{}{}
	ia.mu.Unlock()
}

func (ia *iaObj) untrack(o object) {
	ia.mu.Lock()
	delete(ia.objs, o)
	if ep, ok := o.(*epObj); ok && ep.ep != nil {
		delete(ia.eps, ep.ep)
	}
	if sp, ok := o.(*spObj); ok && ia.sps[sp.port] == sp {
		delete(ia.sps, sp.port)
	}
	ia.mu.Unlock()
}

// epOf is the EP object of a client EP (nil if freed).
func (ia *iaObj) epOf(ep *client.EP) *epObj {
	if ep == nil {
		return nil
	}
	ia.mu.Lock()
	defer ia.mu.Unlock()
	return ia.eps[ep]
}

// openTimeout bounds connecting to the daemon.
const openTimeout = 10 * time.Second

//export srnIAOpen
func srnIAOpen(name *C.char, qlen C.DAT_COUNT, async *C.DAT_EVD_HANDLE, out *C.DAT_IA_HANDLE) C.DAT_RETURN {
	if name == nil {
		return arg(1)
	}
	if out == nil {
		return arg(4)
	}
	p := providerNamed(C.GoString(name))
	if p == nil {
		return datProviderNotFound
	}
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	c, err := client.Open(ctx, client.Options{Socket: p.socket, Iface: p.iface,
		Name: fmt.Sprintf("dapl:%s[%d]", filepath.Base(os.Args[0]), os.Getpid())})
	if err != nil {
		fmt.Fprintf(os.Stderr, "libdaplsoftrnic: %s: %v\n", p.name, err)
		return status(err) | C.DAT_RESOURCE_DEVICE
	}
	ia := &iaObj{prov: p, cl: c, objs: map[object]struct{}{}, eps: map[*client.EP]*epObj{}, sps: map[uint16]*spObj{}}
	ia.attr.MaxEVDDepth = c.Attr().MaxEVDDepth
	newHandle(ia, C.SRN_IA, ia, p.table)
	if addr, err := netip.ParseAddr(c.Attr().Address); err == nil && addr.Is4() {
		sockaddr(&ia.c2().local, netip.AddrPortFrom(addr, 0))
	}
	if async != nil && *async == nil {
		e, rc := ia.newEVD(max(int(qlen), 1), C.DAT_EVD_ASYNC_FLAG)
		if rc != datSuccess {
			_ = c.Close()
			dropHandle(ia)
			return rc
		}
		ia.async = e
		*async = C.DAT_EVD_HANDLE(e.dat())
	}
	*out = C.DAT_IA_HANDLE(ia.dat())
	return datSuccess
}

// c2 is the C half of the IA's handle.
func (ia *iaObj) c2() *C.srn_obj { return ia.handle.c }

// sockaddr writes an IPv4 address and port.
func sockaddr(sa *C.struct_sockaddr_in, ap netip.AddrPort) {
	C.memset(unsafe.Pointer(sa), 0, C.sizeof_struct_sockaddr_in)
	sa.sin_family = C.AF_INET
	a := ap.Addr().As4()
	C.memcpy(unsafe.Pointer(&sa.sin_addr), unsafe.Pointer(&a[0]), 4)
	port := ap.Port()
	*(*[2]byte)(unsafe.Pointer(&sa.sin_port)) = [2]byte{byte(port >> 8), byte(port)}
}

// addrPort reads a "host:port" the daemon reports into a sockaddr, and
// returns the port (0 if there is none).
func addrPort(sa *C.struct_sockaddr_in, s string) uint16 {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return 0
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Unmap().Is4() {
		return 0
	}
	p, _ := strconv.ParseUint(port, 10, 16)
	sockaddr(sa, netip.AddrPortFrom(a.Unmap(), uint16(p)))
	return uint16(p)
}

//export srnIAClose
func srnIAClose(h C.DAT_IA_HANDLE, flags C.DAT_CLOSE_FLAGS) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](h, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	ia.mu.Lock()
	objs := make([]object, 0, len(ia.objs))
	for o := range ia.objs {
		objs = append(objs, o)
	}
	ia.mu.Unlock()
	if flags == C.DAT_CLOSE_GRACEFUL_FLAG {
		for _, o := range objs {
			if o != object(ia.async) {
				return datInvalidState | C.DAT_INVALID_STATE_IA_IN_USE
			}
		}
	} else if flags != C.DAT_CLOSE_ABRUPT_FLAG {
		return arg(2)
	}
	// Closing the session frees every object in the daemon; here the
	// handles go, and registered memory moves back.
	for _, o := range objs {
		if l, ok := o.(*lmrObj); ok {
			_ = l.lmr.Free()
		}
		if e, ok := o.(*evdObj); ok {
			e.close()
		}
	}
	err := ia.cl.Close()
	for _, o := range objs {
		dropHandle(o)
	}
	dropHandle(ia)
	if err != nil {
		return status(err)
	}
	return datSuccess
}

// consumerHandle is the IA handle as the consumer knows it: libdat2 hands
// the consumer a small index for our pointer, translates it back on every
// call, and dats_get_ia_handle translates either way; what a query reports
// must be the consumer's.
func (ia *iaObj) consumerHandle() C.DAT_IA_HANDLE {
	ia.mu.Lock()
	defer ia.mu.Unlock()
	if ia.consumer == nil {
		var idx C.DAT_IA_HANDLE
		if C.dats_get_ia_handle(C.DAT_IA_HANDLE(ia.dat()), &idx) != C.DAT_SUCCESS {
			return C.DAT_IA_HANDLE(ia.dat()) // not opened through libdat2
		}
		ia.consumer = idx
	}
	return ia.consumer
}

//export srnIAQuery
func srnIAQuery(h C.DAT_IA_HANDLE, async *C.DAT_EVD_HANDLE, mask C.DAT_IA_ATTR_MASK, a *C.DAT_IA_ATTR,
	pmask C.DAT_PROVIDER_ATTR_MASK, p *C.DAT_PROVIDER_ATTR) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](h, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	if async != nil {
		*async = nil
		ia.mu.Lock()
		if ia.async != nil {
			*async = C.DAT_EVD_HANDLE(ia.async.dat())
		}
		ia.mu.Unlock()
	}
	at := ia.cl.Attr()
	if a != nil {
		C.memset(unsafe.Pointer(a), 0, C.sizeof_DAT_IA_ATTR)
		cstr(a.adapter_name[:], "softrnic "+at.Name+" ("+at.Datapath+")")
		cstr(a.vendor_name[:], "softrnic")
		a.hardware_version_major = 1
		a.ia_address_ptr = C.DAT_IA_ADDRESS_PTR(unsafe.Pointer(&ia.c2().local))
		a.max_eps = C.DAT_COUNT(at.MaxEP)
		a.max_dto_per_ep = C.DAT_COUNT(min(at.MaxSQ, at.MaxRQ))
		a.max_rdma_read_per_ep_in = C.DAT_COUNT(at.MaxIRD)
		a.max_rdma_read_per_ep_out = C.DAT_COUNT(at.MaxORD)
		a.max_evds = C.DAT_COUNT(at.MaxEVD)
		a.max_evd_qlen = C.DAT_COUNT(at.MaxEVDDepth)
		a.max_iov_segments_per_dto = C.DAT_COUNT(at.MaxSGE)
		a.max_lmrs = 1 << 20
		a.max_lmr_block_size = C.DAT_SEG_LENGTH(^uint32(0))
		a.max_lmr_virtual_address = C.DAT_VADDR(^uint64(0))
		a.max_pzs = 1 << 16
		a.max_message_size = C.DAT_SEG_LENGTH(maxMessage)
		a.max_rdma_size = C.DAT_SEG_LENGTH(maxMessage)
		a.max_iov_segments_per_rdma_read = C.DAT_COUNT(maxReadIOV)
		a.max_iov_segments_per_rdma_write = C.DAT_COUNT(at.MaxSGE)
		a.max_rdma_read_in = C.DAT_COUNT(at.MaxIRD)
		a.max_rdma_read_out = C.DAT_COUNT(at.MaxORD)
		a.max_rdma_read_per_ep_in_guaranteed = C.DAT_TRUE
		a.max_rdma_read_per_ep_out_guaranteed = C.DAT_TRUE
		a.zb_supported = C.DAT_FALSE
		a.extension_supported = C.DAT_EXTENSION_NONE
	}
	if p != nil {
		C.memset(unsafe.Pointer(p), 0, C.sizeof_DAT_PROVIDER_ATTR)
		cstr(p.provider_name[:], ia.prov.name)
		p.provider_version_major = 1
		p.dapl_version_major = 2
		p.dapl_version_minor = 0
		p.lmr_mem_types_supported = C.DAT_MEM_TYPE_VIRTUAL
		p.iov_ownership_on_return = C.DAT_IOV_CONSUMER
		p.dat_qos_supported = C.DAT_QOS_BEST_EFFORT
		p.completion_flags_supported = C.DAT_COMPLETION_DEFAULT_FLAG | C.DAT_COMPLETION_SUPPRESS_FLAG |
			C.DAT_COMPLETION_SOLICITED_WAIT_FLAG | C.DAT_COMPLETION_UNSIGNALLED_FLAG | C.DAT_COMPLETION_BARRIER_FENCE_FLAG
		// What libdat2 keys the registry on: not thread-safe (see
		// package comment: it is safe all the same).
		p.is_thread_safe = C.DAT_FALSE
		p.max_private_data_size = C.DAT_COUNT(at.MaxPrivate)
		p.supports_multipath = C.DAT_FALSE
		p.ep_creator = C.DAT_PSP_CREATES_EP_IFASKED
		p.pz_support = C.DAT_PZ_UNIQUE
		p.optimal_buffer_alignment = C.DAT_UINT32(os.Getpagesize())
		p.srq_supported = C.DAT_FALSE
		p.lmr_sync_req = C.DAT_FALSE
		p.dto_async_return_guaranteed = C.DAT_FALSE
		p.rdma_write_for_rdma_read_req = C.DAT_FALSE
		p.rdma_read_lmr_rmr_context_exposure = C.DAT_FALSE
		p.rmr_scope_supported = C.DAT_RMR_SCOPE_EP
		p.is_signal_safe = C.DAT_FALSE
		p.ha_supported = C.DAT_FALSE
		p.num_provider_specific_attr = C.DAT_COUNT(C.srn_num_provider_attrs)
		p.provider_specific_attr = &(*[1 << 10]C.DAT_NAMED_ATTR)(unsafe.Pointer(&C.srn_provider_attrs))[0]
	}
	return datSuccess
}

// cstr copies s into a C char array, NUL-terminated, truncated to fit.
func cstr(dst []C.char, s string) {
	n := min(len(s), len(dst)-1)
	for i := 0; i < n; i++ {
		dst[i] = C.char(s[i])
	}
	dst[n] = 0
}

// pzObj is a protection zone.
type pzObj struct {
	handle
	pz *client.PZ
}

//export srnPZCreate
func srnPZCreate(h C.DAT_IA_HANDLE, out *C.DAT_PZ_HANDLE) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](h, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	if out == nil {
		return arg(2)
	}
	pz, err := ia.cl.CreatePZ()
	if err != nil {
		return status(err)
	}
	o := &pzObj{pz: pz}
	newHandle(o, C.SRN_PZ, ia, ia.prov.table)
	ia.track(o)
	*out = C.DAT_PZ_HANDLE(o.dat())
	return datSuccess
}

//export srnPZQuery
func srnPZQuery(h C.DAT_PZ_HANDLE, mask C.DAT_PZ_PARAM_MASK, p *C.DAT_PZ_PARAM) C.DAT_RETURN {
	pz, ok := lookup[*pzObj](h, C.SRN_PZ)
	if !ok {
		return invalid(C.SRN_PZ)
	}
	if p == nil {
		return arg(3)
	}
	p.ia_handle = pz.ia.consumerHandle()
	return datSuccess
}

//export srnPZFree
func srnPZFree(h C.DAT_PZ_HANDLE) C.DAT_RETURN {
	pz, ok := lookup[*pzObj](h, C.SRN_PZ)
	if !ok {
		return invalid(C.SRN_PZ)
	}
	if err := pz.pz.Free(); err != nil {
		return status(err) | C.DAT_INVALID_STATE_PZ_IN_USE
	}
	pz.ia.untrack(pz)
	dropHandle(pz)
	return datSuccess
}

// lmrObj is a registered region of the consumer's memory.
type lmrObj struct {
	handle
	lmr    *client.LMR
	pz     *pzObj
	addr   uintptr
	length uint64
	priv   C.DAT_MEM_PRIV_FLAGS
}

//export srnLMRCreate
func srnLMRCreate(h C.DAT_IA_HANDLE, typ C.DAT_MEM_TYPE, addr unsafe.Pointer, length C.DAT_VLEN, pzh C.DAT_PZ_HANDLE,
	priv C.DAT_MEM_PRIV_FLAGS, vaType C.DAT_VA_TYPE, out *C.DAT_LMR_HANDLE, lctx *C.DAT_LMR_CONTEXT, rctx *C.DAT_RMR_CONTEXT,
	regLen *C.DAT_VLEN, regAddr *C.DAT_VADDR) C.DAT_RETURN {
	ia, ok := lookup[*iaObj](h, C.SRN_IA)
	if !ok {
		return invalid(C.SRN_IA)
	}
	if typ != C.DAT_MEM_TYPE_VIRTUAL {
		return datNotImplemented // shared and LMR-derived memory
	}
	pz, ok := lookup[*pzObj](pzh, C.SRN_PZ)
	if !ok {
		return invalid(C.SRN_PZ)
	}
	if pz.ia != ia {
		return invalid(C.SRN_PZ)
	}
	if vaType != C.DAT_VA_TYPE_VA {
		return arg(7) // zero-based addressing is not supported (ia_query says so)
	}
	if addr == nil || length == 0 || uint64(length) > 1<<40 {
		return arg(3)
	}
	if priv&^C.DAT_MEM_PRIV_ALL_FLAG != 0 {
		return arg(6)
	}
	if out == nil {
		return arg(8)
	}
	var access client.Access
	if priv&C.DAT_MEM_PRIV_LOCAL_WRITE_FLAG != 0 {
		access |= client.LocalWrite
	}
	if priv&C.DAT_MEM_PRIV_REMOTE_READ_FLAG != 0 {
		access |= client.RemoteRead
	}
	if priv&C.DAT_MEM_PRIV_REMOTE_WRITE_FLAG != 0 {
		access |= client.RemoteWrite
	}
	l, err := pz.pz.RegisterMemory(uintptr(addr), int(length), access)
	if err != nil {
		return status(err)
	}
	o := &lmrObj{lmr: l, pz: pz, addr: uintptr(addr), length: uint64(length), priv: priv}
	newHandle(o, C.SRN_LMR, ia, ia.prov.table)
	ia.track(o)
	*out = C.DAT_LMR_HANDLE(o.dat())
	if lctx != nil {
		*lctx = C.DAT_LMR_CONTEXT(l.Context)
	}
	if rctx != nil {
		*rctx = C.DAT_RMR_CONTEXT(l.Context)
	}
	if regLen != nil {
		*regLen = length
	}
	if regAddr != nil {
		*regAddr = C.DAT_VADDR(uintptr(addr))
	}
	return datSuccess
}

//export srnLMRQuery
func srnLMRQuery(h C.DAT_LMR_HANDLE, mask C.DAT_LMR_PARAM_MASK, p *C.DAT_LMR_PARAM) C.DAT_RETURN {
	l, ok := lookup[*lmrObj](h, C.SRN_LMR)
	if !ok {
		return invalid(C.SRN_LMR)
	}
	if p == nil {
		return arg(3)
	}
	C.memset(unsafe.Pointer(p), 0, C.sizeof_DAT_LMR_PARAM)
	p.ia_handle = l.ia.consumerHandle()
	p.mem_type = C.DAT_MEM_TYPE_VIRTUAL
	*(*uintptr)(unsafe.Pointer(&p.region_desc)) = l.addr
	p.length = C.DAT_VLEN(l.length)
	p.pz_handle = C.DAT_PZ_HANDLE(l.pz.dat())
	p.mem_priv = l.priv
	p.va_type = C.DAT_VA_TYPE_VA
	p.lmr_context = C.DAT_LMR_CONTEXT(l.lmr.Context)
	p.rmr_context = C.DAT_RMR_CONTEXT(l.lmr.Context)
	p.registered_size = C.DAT_VLEN(l.length)
	p.registered_address = C.DAT_VADDR(l.addr)
	return datSuccess
}

//export srnLMRFree
func srnLMRFree(h C.DAT_LMR_HANDLE) C.DAT_RETURN {
	l, ok := lookup[*lmrObj](h, C.SRN_LMR)
	if !ok {
		return invalid(C.SRN_LMR)
	}
	if err := l.lmr.Free(); err != nil {
		return status(err) | C.DAT_INVALID_STATE_LMR_IN_USE
	}
	l.ia.untrack(l)
	dropHandle(l)
	return datSuccess
}

// srnLMRSync: registered memory is coherent (the daemon maps the same
// pages); nothing to do.
//
//export srnLMRSync
func srnLMRSync(h C.DAT_IA_HANDLE, iov *C.DAT_LMR_TRIPLET, n C.DAT_VLEN) C.DAT_RETURN {
	if _, ok := lookup[*iaObj](h, C.SRN_IA); !ok {
		return invalid(C.SRN_IA)
	}
	return datSuccess
}
