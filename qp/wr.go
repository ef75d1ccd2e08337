package qp

import (
	"errors"
	"fmt"
)

// SGE is one local buffer of a work request: Length octets at tagged offset
// Addr of the region LKey.
type SGE struct {
	LKey   uint32
	Addr   uint64
	Length uint32
}

// SendOp is the operation of a send-queue work request.
type SendOp uint8

// Send-queue operations.
const (
	OpSend SendOp = iota
	OpSendInvalidate
	OpWrite
	OpRead
	OpFetchAdd
	OpCmpSwap
	OpLocalInvalidate
	// OpImmediate sends an RFC 7306 Immediate Data message (8 octets in
	// Immediate); after an OpWrite it makes "RDMA Write with Immediate".
	OpImmediate
)

var sendOpNames = [...]string{"send", "send-invalidate", "write", "read", "fetch-add", "cmp-swap", "local-invalidate", "immediate"}

func (o SendOp) String() string {
	if int(o) < len(sendOpNames) {
		return sendOpNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Send flags.
type Flags uint8

// Flags of send work requests.
const (
	// Signaled: a successful completion is reported (failures always are).
	Signaled Flags = 1 << iota
	// Solicited: the Send carries the solicited-event bit.
	Solicited
	// Fence: the request waits until every earlier Read and atomic has
	// completed.
	Fence
	// Inline: the data is copied at post time and the SGL's memory may be
	// reused at once.
	Inline
)

// SendWR is a send-queue work request.
type SendWR struct {
	ID    uint64
	Op    SendOp
	Flags Flags
	SGL   []SGE
	// InlineData, with the Inline flag, is sent instead of the SGL.
	InlineData []byte
	// RemoteSTag and RemoteTO address the peer's buffer (Write, Read,
	// atomics).
	RemoteSTag uint32
	RemoteTO   uint64
	// InvalidateSTag: for OpSendInvalidate the peer's STag to invalidate,
	// for OpLocalInvalidate ours.
	InvalidateSTag uint32
	// Atomic operands: FetchAdd adds Add; CmpSwap stores Swap if the
	// target equals Compare. The result lands in SGL[0] (8 octets).
	Add, Compare, Swap uint64
	// Immediate data of OpImmediate.
	Immediate [8]byte
}

// RecvWR is a receive-queue work request.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// Errors returned by the posting verbs.
var (
	ErrState       = errors.New("qp: invalid state for this operation")
	ErrQueueFull   = errors.New("qp: work queue full")
	ErrInvalidWR   = errors.New("qp: invalid work request")
	ErrTooManySGE  = errors.New("qp: too many SGEs")
	ErrInlineLimit = errors.New("qp: inline data over the inline limit")
	ErrProtection  = errors.New("qp: local protection error")
)
