// Command dapl is softrnic's uDAPL 2.0 provider, built as the shared library
// libdaplsoftrnic.so.2 (go build -buildmode=c-shared; make build). libdat2
// loads it for a dat.conf entry such as
//
//	softrnic0 u2.0 nonthreadsafe default libdaplsoftrnic.so.2 dapl.2.0 "veth0 /run/softrnic/veth0.sock" ""
//
// whose ia_params name the daemon's interface and, optionally, its control
// socket (default /run/softrnic/IFACE.sock). Unmodified DAT programs (dtest,
// dapltest) then run over softrnicd.
//
// # Layout
//
// provider.c holds the dat_provider table and the entry points libdat2 looks
// up (dat_provider_init, dat_provider_fini); every DAT function is Go,
// exported through cgo, over the client package: control verbs on the
// daemon's socket, posts and completions on the shared-memory rings, with
// no system call on the data path. Registered memory is the consumer's own
// (malloc'ed buffers): internal/memreg moves it in place onto a memfd the
// daemon maps.
//
// # Concurrency
//
// The consumer calls from any number of threads at once (dapltest does,
// although dat.conf must say "nonthreadsafe"). handles (tab) is a
// read-mostly table under an RWMutex; each IA's object lists are under its
// mu; the client package makes every call it offers safe for concurrent
// use. No lock is held across a call into the client except an EVD's
// waiter flag, which guards nothing else.
package main

/*
#cgo CFLAGS: -O2 -Wall -Wno-unused-function
#cgo LDFLAGS: -ldat2
#include <stdlib.h>
#include <string.h>
#include "srn.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/memreg"
)

func main() {}

// debug: SOFTRNIC_DAPL_DEBUG is set; failed completions and connection
// events are logged to stderr.
var debug = os.Getenv("SOFTRNIC_DAPL_DEBUG") != ""

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "libdaplsoftrnic: "+format+"\n", args...)
}

// DAT return codes.
const (
	datSuccess          = C.DAT_RETURN(C.DAT_SUCCESS)
	datInvalidHandle    = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_INVALID_HANDLE)
	datInvalidParameter = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_INVALID_PARAMETER)
	datInvalidState     = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_INVALID_STATE)
	datInsufficient     = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_INSUFFICIENT_RESOURCES)
	datNotImplemented   = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_NOT_IMPLEMENTED)
	// An empty EVD's dequeue: the bare type, as libdaplofa returns it
	// (dtest -p compares with ==).
	datQueueEmpty         = C.DAT_RETURN(C.DAT_QUEUE_EMPTY)
	datTimeoutExpired     = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_TIMEOUT_EXPIRED)
	datAbort              = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_ABORT)
	datInternal           = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_INTERNAL_ERROR)
	datProviderNotFound   = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_PROVIDER_NOT_FOUND)
	datConnQualInUse      = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_CONN_QUAL_IN_USE)
	datConnQualNone       = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_CONN_QUAL_UNAVAILABLE)
	datInvalidAddress     = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_INVALID_ADDRESS)
	datProtection         = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_PROTECTION_VIOLATION)
	datModelNotSupported  = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_MODEL_NOT_SUPPORTED)
	datLengthError        = C.DAT_RETURN(C.DAT_CLASS_ERROR | C.DAT_LENGTH_ERROR)
	datInvalidStateWaiter = datInvalidState | C.DAT_INVALID_STATE_EVD_WAITER
)

// invalid is DAT_INVALID_HANDLE with the subtype of the handle's kind.
func invalid(k uint32) C.DAT_RETURN { return datInvalidHandle | invalidSubtype[k] }

// invalidSubtype is the DAT_INVALID_HANDLE subtype of each handle kind.
var invalidSubtype = map[uint32]C.DAT_RETURN{
	C.SRN_IA: C.DAT_INVALID_HANDLE_IA, C.SRN_PZ: C.DAT_INVALID_HANDLE_PZ, C.SRN_LMR: C.DAT_INVALID_HANDLE_LMR,
	C.SRN_EVD: C.DAT_INVALID_HANDLE_EVD_REQUEST, C.SRN_EP: C.DAT_INVALID_HANDLE_EP, C.SRN_PSP: C.DAT_INVALID_HANDLE_PSP,
	C.SRN_RSP: C.DAT_INVALID_HANDLE_RSP, C.SRN_CR: C.DAT_INVALID_HANDLE_CR,
}

// arg is DAT_INVALID_PARAMETER naming argument n (1-based).
func arg(n int) C.DAT_RETURN {
	return datInvalidParameter | C.DAT_RETURN(C.DAT_INVALID_ARG1+n-1)
}

// status maps an error from the client to a DAT return code.
func status(err error) C.DAT_RETURN {
	var ce *ctl.Error
	switch {
	case err == nil:
		return datSuccess
	case errors.Is(err, client.ErrQueueFull):
		return datInsufficient
	case errors.Is(err, client.ErrDaemonGone), errors.Is(err, client.ErrClosed):
		return datAbort
	case errors.As(err, &ce):
		switch ce.Status {
		case ctl.InvalidHandle:
			return datInvalidHandle
		case ctl.InvalidState:
			return datInvalidState
		case ctl.InvalidParameter:
			return datInvalidParameter
		case ctl.InsufficientResources:
			return datInsufficient
		case ctl.InvalidAddress:
			return datInvalidAddress
		case ctl.ProtectionViolation:
			return datProtection
		case ctl.NotImplemented:
			return datNotImplemented
		case ctl.ModelNotSupported:
			return datModelNotSupported
		case ctl.Timeout:
			return datTimeoutExpired
		}
	}
	return datInternal
}

// provider is one dat.conf entry naming this library.
type provider struct {
	table  *C.DAT_PROVIDER
	name   string
	iface  string
	socket string
}

var providers struct {
	sync.Mutex
	byName map[string]*provider
}

//export srnRegister
func srnRegister(table *C.DAT_PROVIDER, name, params *C.char) C.DAT_RETURN {
	p := &provider{table: table, name: C.GoString(name)}
	f := strings.Fields(C.GoString(params))
	if len(f) == 0 || len(f) > 2 {
		return arg(2)
	}
	if f[0] != "-" {
		p.iface = f[0]
	}
	if len(f) == 2 {
		p.socket = f[1]
	}
	if p.iface == "" && p.socket == "" {
		return arg(2)
	}
	// The consumer's threads are C's: registrations may hold their
	// accesses to a moving page (internal/memreg).
	if sp, err := memreg.Default(); err == nil {
		sp.HoldNeighbours(moveHeld)
	}
	providers.Lock()
	defer providers.Unlock()
	if providers.byName == nil {
		providers.byName = map[string]*provider{}
	}
	providers.byName[p.name] = p
	return datSuccess
}

//export srnUnregister
func srnUnregister(name *C.char) *C.DAT_PROVIDER {
	providers.Lock()
	defer providers.Unlock()
	p := providers.byName[C.GoString(name)]
	if p == nil {
		return nil
	}
	delete(providers.byName, p.name)
	return p.table
}

func providerNamed(name string) *provider {
	providers.Lock()
	defer providers.Unlock()
	return providers.byName[name]
}

// moveHeld is memreg's Mover: dapl/move.c, in C, so that no Go code of
// the registering thread runs while a page is held.
func moveHeld(uffd, memfd int, start, end uintptr, prot int) (bool, error) {
	switch r := C.srn_move_held(C.int(uffd), C.int(memfd), C.uintptr_t(start), C.uintptr_t(end-start), C.int(prot)); {
	case r == 0:
		return true, nil
	case r < 0:
		return false, nil
	default:
		return true, syscall.Errno(r)
	}
}

// object is what every handle leads to.
type object interface {
	base() *handle
}

// handle is the Go half of a DAT handle: its C half (what the consumer
// holds), its kind and its IA.
type handle struct {
	c    *C.srn_obj
	kind uint32
	ia   *iaObj
}

func (h *handle) base() *handle { return h }

// dat is the handle as the consumer holds it.
func (h *handle) dat() C.DAT_HANDLE { return C.DAT_HANDLE(unsafe.Pointer(h.c)) }

// tab maps handles to objects: the C handle holds its index in objs.
var tab struct {
	sync.RWMutex
	objs  []object
	free  []uint32
	spare []*C.srn_obj // freed C handles, reused
}

// newHandle makes the C half of o's handle and enters o in the table.
func newHandle(o object, kind uint32, ia *iaObj, table *C.DAT_PROVIDER) *handle {
	h := o.base()
	h.kind, h.ia = kind, ia
	tab.Lock()
	defer tab.Unlock()
	if len(tab.spare) > quarantine {
		h.c = tab.spare[0]
		tab.spare = append(tab.spare[:0], tab.spare[1:]...)
		C.memset(unsafe.Pointer(h.c), 0, C.sizeof_srn_obj)
	} else {
		h.c = (*C.srn_obj)(C.calloc(1, C.sizeof_srn_obj))
		if h.c == nil {
			panic("dapl: out of memory for a handle")
		}
	}
	var id uint32
	if n := len(tab.free); n > 0 {
		id = tab.free[n-1]
		tab.free = tab.free[:n-1]
		tab.objs[id] = o
	} else {
		id = uint32(len(tab.objs))
		tab.objs = append(tab.objs, o)
	}
	h.c.provider = table
	h.c.id = C.uint32_t(id)
	h.c.magic = C.uint32_t(C.SRN_MAGIC | kind)
	return h
}

// dropHandle invalidates o's handle: later calls with it get
// DAT_INVALID_HANDLE. Only the owner of the C handle drops it (a handle
// already dropped and given to another object stays that object's).
func dropHandle(o object) {
	h := o.base()
	tab.Lock()
	defer tab.Unlock()
	c := h.c
	if c == nil || uint32(c.magic) != C.SRN_MAGIC|h.kind {
		return
	}
	id := uint32(c.id)
	if int(id) >= len(tab.objs) || tab.objs[id] != o {
		return
	}
	c.magic = 0
	tab.objs[id] = nil
	tab.free = append(tab.free, id)
	tab.spare = append(tab.spare, c)
}

// quarantine is how many freed C handles wait before one is reused, first
// freed first: a consumer that uses a handle after freeing it gets
// DAT_INVALID_HANDLE rather than the next object of the same kind, unless
// that many objects were freed since.
const quarantine = 1024

// lookup returns the live object of kind k that h is, or false.
func lookup[T object](h C.DAT_HANDLE, k uint32) (T, bool) {
	var zero T
	if h == nil {
		return zero, false
	}
	c := (*C.srn_obj)(unsafe.Pointer(h))
	tab.RLock()
	defer tab.RUnlock()
	if uint32(c.magic) != C.SRN_MAGIC|k {
		return zero, false
	}
	id := uint32(c.id)
	if int(id) >= len(tab.objs) {
		return zero, false
	}
	o, ok := tab.objs[id].(T)
	if !ok || o.base().c != c {
		return zero, false
	}
	return o, true
}
