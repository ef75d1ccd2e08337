package ctl

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// SocketDir is where daemons put their sockets by default.
const SocketDir = "/run/softrnic"

// DefaultSocket is where the daemon for iface listens by default, and where
// clients look for it.
func DefaultSocket(iface string) string { return filepath.Join(SocketDir, iface+".sock") }

// FindSocket is the socket of the one daemon in SocketDir, for a client
// told neither a socket nor an interface (the libraries' rule too, in
// verbs/ibverbs/ctl.c): of several sockets there, the one a daemon answers
// on, if only one does (the others left by daemons killed). None, or
// several live ones, is an error that says so: which daemon is meant
// cannot be guessed.
func FindSocket() (string, error) {
	found, _ := filepath.Glob(filepath.Join(SocketDir, "*.sock"))
	var socks []string
	for _, f := range found {
		if st, err := os.Stat(f); err == nil && st.Mode()&fs.ModeSocket != 0 {
			socks = append(socks, f)
		}
	}
	all := len(socks)
	if all > 1 {
		live := socks[:0]
		for _, f := range socks {
			if answers(f) {
				live = append(live, f)
			}
		}
		socks = live
	}
	switch {
	case len(socks) == 1:
		return socks[0], nil
	case all > 1 && len(socks) == 0:
		return "", fmt.Errorf("%d sockets in %s and no softrnicd answers on any: is the daemon running? (name its socket to choose another)", all, SocketDir)
	case len(socks) == 0:
		return "", fmt.Errorf("no softrnicd socket in %s: is the daemon running? (name its socket to choose another)", SocketDir)
	}
	return "", fmt.Errorf("%d softrnicd sockets in %s (%s): name the one to use", len(socks), SocketDir, strings.Join(socks, ", "))
}

// answers says whether a daemon listens on the socket at path. A daemon
// whose backlog is full (EAGAIN: the connect does not wait) is alive, only
// busy.
func answers(path string) bool {
	c, err := net.Dial("unixpacket", path)
	if err == nil {
		c.Close()
		return true
	}
	return errors.Is(err, syscall.EAGAIN)
}

// Op names a request (and its reply).
type Op uint16

// Operations. The numbers are the protocol: never renumber.
const (
	OpHello Op = iota + 1
	OpQueryIA
	OpCreatePZ
	OpFreePZ
	OpRegisterLMR
	OpFreeLMR
	OpCreateEVD
	OpFreeEVD
	OpCreateEP
	OpModifyEP
	OpQueryEP
	OpFreeEP
	OpConnect
	OpDisconnect
	OpResetEP
	OpCreatePSP
	OpFreePSP
	OpCreateRSP
	OpQueryCR
	OpAcceptCR
	OpRejectCR
	OpStats
	OpCreateSSP
	OpFreeSSP
	OpQuerySSP
	OpSocketConnect
	OpRegisterProcessMemory
	OpConnectQP
	OpReservePort
	OpFreePort
	OpResolveRoute
	opEnd
)

var opNames = [...]string{"", "Hello", "QueryIA", "CreatePZ", "FreePZ", "RegisterLMR", "FreeLMR", "CreateEVD", "FreeEVD",
	"CreateEP", "ModifyEP", "QueryEP", "FreeEP", "Connect", "Disconnect", "ResetEP", "CreatePSP", "FreePSP", "CreateRSP",
	"QueryCR", "AcceptCR", "RejectCR", "Stats",
	"CreateSSP", "FreeSSP", "QuerySSP", "SocketConnect", "RegisterProcessMemory",
	"ConnectQP", "ReservePort", "FreePort", "ResolveRoute"}

func (o Op) String() string {
	if o > 0 && o < opEnd {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint16(o))
}

// Valid reports whether the op is known.
func (o Op) Valid() bool { return o > 0 && o < opEnd }

// Status is a DAT-style return code.
type Status uint32

// Statuses (DAT 2.0 major codes, by name).
const (
	Success Status = iota
	InvalidHandle
	InvalidState
	InvalidParameter
	InsufficientResources
	InvalidAddress
	ProtectionViolation
	NotImplemented
	ModelNotSupported
	Timeout
	InternalError
	ProtocolError
	statusEnd
)

var statusNames = [...]string{"SUCCESS", "INVALID_HANDLE", "INVALID_STATE", "INVALID_PARAMETER", "INSUFFICIENT_RESOURCES",
	"INVALID_ADDRESS", "PROTECTION_VIOLATION", "NOT_IMPLEMENTED", "MODEL_NOT_SUPPORTED", "TIMEOUT", "INTERNAL_ERROR", "PROTOCOL_ERROR"}

func (s Status) String() string {
	if s < statusEnd {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint32(s))
}

// Error is a failed reply: a status and the daemon's message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %s", e.Status, e.Message) }

// Is makes errors.Is(err, &Error{Status: s}) match on the status alone.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status && t.Message == ""
}

// ErrorBody is the body of a failed reply.
type ErrorBody struct{ Message string }

// Hello opens a session. The reply passes the session's doorbell eventfd
// and the memfd of its shared region (internal/shm: one region per
// session, carved into every ring of its EPs and EVDs).
type Hello struct {
	Client string
}

// IAAttr are the interface adapter's attributes.
type IAAttr struct {
	Name          string // interface
	Datapath      string // kernel or xdp
	Address       string // the IP address of the interface
	MaxEP         uint32
	MaxEVD        uint32
	MaxEVDDepth   uint32
	MaxLMRSize    uint64
	MaxPrivate    uint16
	MaxSGE        uint8
	MaxIRD        uint16
	MaxORD        uint16
	MaxSQ, MaxRQ  uint32
	DaemonVersion string
	// DatapathCPUs is the CPUs the daemon's datapath runs on, bit i%8 of
	// octet i/8 for CPU i: the xdp pollers' or, on the kernel datapath,
	// every CPU the daemon may use. A client that spins on a CPU in it
	// holds off the work it waits for.
	DatapathCPUs []byte
}

// HelloReply carries the IA attributes.
type HelloReply struct {
	Session uint32
	IA      IAAttr
	// Region is the size of the shared region, mapped whole.
	Region uint64
}

// Handle is a session-local object handle; 0 is never valid.
type Handle struct{ H uint32 }

// CreatePZReply returns the new PZ.
type CreatePZReply struct{ PZ uint32 }

// Access rights of an LMR (the bits of qp.Access).
const (
	AccessLocalWrite   = 1
	AccessRemoteRead   = 2
	AccessRemoteWrite  = 4
	AccessRemoteAtomic = 8
)

// RegisterLMR registers [Offset, Offset+Length) of the memfd passed with
// the request, which the client maps at VA. The memfd must be sealed
// against shrinking. Offset and Length need not be page-aligned: the
// region is exactly those octets (VA is the address of octet Offset).
type RegisterLMR struct {
	PZ     uint32
	Offset uint64
	Length uint64
	VA     uint64
	Access uint8
}

// RegisterProcessMemory registers the octets [VA, VA+Length) of the
// session's own process, which the daemon reaches through /proc/PID/mem
// (internal/procmem): nothing is shared, nothing pinned, so any range will
// do (a field inside a heap object) and fork leaves the pages the
// process's own. The tagged offset of octet i is VA+i. The reply is a
// RegisterLMRReply; FreeLMR frees it as any LMR.
type RegisterProcessMemory struct {
	PZ     uint32
	VA     uint64
	Length uint64
	Access uint8
}

// RegisterLMRReply gives the LMR handle and its STag (the RMR context a
// peer uses).
type RegisterLMRReply struct {
	LMR  uint32
	STag uint32
}

// EVD flags: what a DAT EVD receives.
const (
	EVDDTO        = 1 // data transfer completions
	EVDConnection = 2 // connection events
	EVDCR         = 4 // connection requests
)

// CreateEVD creates an event dispatcher with a ring of Depth entries in
// the session's region; the reply passes the eventfd the daemon signals
// when the client armed the EVD.
type CreateEVD struct {
	Depth  uint32
	Flags  uint8
	Vector uint32
}

// CreateEVDReply gives the handle and ring size.
type CreateEVDReply struct {
	EVD     uint32
	Entries uint32
	Offset  uint32 // of the ring in the region
}

// EPAttr are the attributes of an endpoint.
type EPAttr struct {
	PZ         uint32 // 0: none (no QP until one is set)
	RecvEVD    uint32
	RequestEVD uint32
	ConnectEVD uint32
	SQDepth    uint32
	RQDepth    uint32
	IRD, ORD   uint16
	NoCRC      bool
	Markers    bool
	MPARev     uint8
	PeerToPeer bool
	// RTR: the peer-to-peer RTR messages offered or accepted, as
	// mpa.RTR (send 1, write 2, read 4); 0 is write or read.
	RTR uint8
}

// CreateEP creates an endpoint. With a PZ its send and receive rings are
// blocks of the session's region, and the reply passes the doorbell of
// the EP's ready queue (internal/shm), the eventfd to write when a post
// puts the EP on a queue whose need-wakeup flag is up: the poller of the
// EP's QP on the accelerated datapath, else the session's ring loop of
// the QP's completion vector.
type CreateEP struct{ Attr EPAttr }

// EPReply is returned by CreateEP and ModifyEP: the handle and, when a QP
// exists, where its rings are in the region, its slot (what the client
// puts on the ready queue) and the queue (the queue's doorbell comes with
// it; a queue's place never changes within a session).
type EPReply struct {
	EP                 uint32
	HasRings           bool
	SQEntries          uint32
	RQEntries          uint32
	SQOffset, RQOffset uint32
	Slot               uint32
	Queue              uint32 // the completion vector
	QueueOffset        uint32
	QueueEntries       uint32
	// QPN is the QP's number, unique in the daemon: what a verbs
	// program gives its peer to name the QP by (ConnectQP), and
	// ibv_qp.qp_num. 0 without a QP.
	QPN uint32
}

// ModifyEP changes attributes; Mask says which (EPModify*).
type ModifyEP struct {
	EP   uint32
	Mask uint32
	Attr EPAttr
}

// ModifyEP mask bits.
const (
	ModifyPZ = 1 << iota
	ModifyEVDs
	ModifyDepths
	ModifyIRDORD
	ModifyImmutable // a field that can never change: always refused
)

// EPInfo is what QueryEP returns.
type EPInfo struct {
	State       uint8
	Attr        EPAttr
	LocalAddr   string
	RemoteAddr  string
	PrivateData []byte // the peer's, once connected
	HasQP       bool
}

// Connect starts an active connection.
type Connect struct {
	EP          uint32
	Addr        string // host:port
	PrivateData []byte
	TimeoutUS   uint64
	// RetryRefusedUS: while this much of the timeout has not passed, a
	// connection the peer's host refuses (no listener on the port yet)
	// is tried again, with backoff, instead of failing at once. The
	// RDMA-CM's programs need it: perftest's server listens for its
	// test connection only after the exchange that lets the client
	// connect, and Debian's perftest crashes on the retry it makes
	// itself. 0: refused is the outcome at once.
	RetryRefusedUS uint64
}

// Disconnect closes a connection.
type Disconnect struct {
	EP       uint32
	Graceful bool
}

// CreatePSP listens on a port. With ProviderEP each request comes with an
// endpoint the provider created (DAT_PSP_PROVIDER_FLAG).
type CreatePSP struct {
	Port       uint16
	EVD        uint32
	ProviderEP bool
}

// ReservePort holds a TCP port of the daemon's address for the session
// until it listens there (CreatePSP on the port takes the reservation
// over) or frees it (FreePort): the RDMA-CM's rdma_bind_addr. Port 0
// picks a free one. A port another reservation holds, or that the host
// cannot bind, is refused with InvalidState.
type ReservePort struct{ Port uint16 }

// ReservePortReply names the reservation and its port.
type ReservePortReply struct {
	Reservation uint32
	Port        uint16
}

// ResolveRoute asks whether the daemon's host can reach Addr (an IP
// address) from the daemon's address, by its own routing (the RDMA-CM's
// address resolution): success, or InvalidAddress with the reason.
type ResolveRoute struct{ Addr string }

// CreateRSP listens on a port for one request, for one EP.
type CreateRSP struct {
	Port uint16
	EP   uint32
	EVD  uint32
}

// CreateSSP makes a Socket Service Point (seed 000) of the connected TCP
// socket passed with the request: the daemon sends FinalMessage on it,
// then waits for the peer's MPA Request, which becomes a connection
// request on EVD (a CR EVD) for EP (reserved; 0: one the provider makes).
// The socket is the daemon's from here; FreeSSP may give it back.
type CreateSSP struct {
	EP           uint32
	EVD          uint32
	FinalMessage []byte
}

// FreeSSPReply says whether the socket came back with the reply: it does
// while the SSP still held it untouched (no connection request yet).
type FreeSSPReply struct{ Returned bool }

// SSPInfo is what QuerySSP returns.
type SSPInfo struct {
	EP, EVD uint32
	// Operational until the SSP made its request or its socket went
	// down (DAT_IW_SSP_STATE_OPERATIONAL / NON_OPERATIONAL).
	Operational           bool
	LocalAddr, RemoteAddr string
}

// SocketConnect connects EP over the connected TCP socket passed with the
// request (seed 000's dat_iw_socket_connect): the MPA Request goes on it
// once its streaming octets were acknowledged. The outcome is an event,
// as Connect's. The socket is the daemon's from here; a failure resets
// it.
type SocketConnect struct {
	EP          uint32
	PrivateData []byte
	TimeoutUS   uint64
}

// ConnectQP connects EP's QP the InfiniBand way: its owner learnt the
// peer's address and QP number out of band (a verbs program's own TCP
// exchange, then ibv_modify_qp to RTR with the peer's GID or LID and QP
// number) and the peer's owner does the same with this QP's. Of the two
// (address, QPN) pairs the lower connects, to the peer daemon's
// IB-connection port, with the QPNs in the MPA Request's private data;
// the higher waits for that connection (daemon/ibconn.go). The reply comes
// at once; the outcome is the EP's state (CONNECTED, or DISCONNECTED when
// no connection came within the daemon's bound), published in its send
// ring, and a connection event on its connect EVD if it has one.
type ConnectQP struct {
	EP uint32
	// RemoteAddr is the peer's IPv4 address; "" takes it from RemoteLID.
	RemoteAddr string
	// RemoteLID, without RemoteAddr: the low 16 bits of the peer's IPv4
	// address, the rest this host's (a LID names a port within one
	// subnet; ibv_query_port reports this device's so).
	RemoteLID uint16
	RemoteQPN uint32
}

// ConnectQPReply says which side this QP is.
type ConnectQPReply struct {
	Active bool
	// Peer is where the active side connects: the peer's address and
	// IB-connection port.
	Peer string
}

// CRInfo is what QueryCR returns.
type CRInfo struct {
	PrivateData []byte
	RemoteAddr  string
	LocalAddr   string
	EP          uint32 // the provider-created or reserved EP, if any
}

// AcceptCR accepts a request on EP (0: the CR's own EP).
type AcceptCR struct {
	CR          uint32
	EP          uint32
	PrivateData []byte
}

// RejectCR rejects a request.
type RejectCR struct {
	CR          uint32
	PrivateData []byte
}

// StatsReply counts the daemon's live objects over all sessions, and its
// stalls, for tests and operators. Fields are only ever appended: the
// codec has no optional fields, so a peer built before a field was added
// refuses the longer reply (trailing octets) rather than misreading it.
type StatsReply struct {
	Sessions uint32
	PZ       uint32
	LMR      uint32
	EVD      uint32
	EP       uint32
	PSP      uint32
	CR       uint32
	// Stalls counts the episodes in which one of the daemon's loops (an
	// xdp poller, a session's poll loop) had work and made no progress
	// for 5 s; each was logged with the stacks of all goroutines.
	Stalls uint64
}

// EP states (DAT 2.0, digest 003 §2).
const (
	EPUnconnected uint8 = iota
	EPReserved
	EPPassivePending
	EPActivePending
	EPTentativePending
	EPCompletionPending
	EPConnected
	EPDisconnectPending
	EPDisconnected
)

// EPStateName names an EP state.
func EPStateName(s uint8) string {
	names := [...]string{"UNCONNECTED", "RESERVED", "PASSIVE_CONNECTION_PENDING", "ACTIVE_CONNECTION_PENDING",
		"TENTATIVE_CONNECTION_PENDING", "COMPLETION_PENDING", "CONNECTED", "DISCONNECT_PENDING", "DISCONNECTED"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("state(%d)", s)
}

// Connection events (the Event of a connection EVE).
const (
	EvEstablished uint32 = iota + 1
	EvPeerRejected
	EvNonPeerRejected
	EvUnreachable
	EvTimedOut
	EvDisconnected
	EvBroken
	EvAcceptCompletionError
	// EvSocketDown: a Socket Service Point's socket was not connected,
	// or its connection ended, before the peer's request (on the SSP's
	// EVD, the SSP's handle in the event's Handle).
	EvSocketDown
)
