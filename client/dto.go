package client

import (
	"fmt"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/shm"
)

// Segment is a piece of an LMR (a DAT LMR triplet). With LMR nil, Context
// names the LMR and Offset is the address itself (a DAT triplet's
// lmr_context and virtual_address as given): the daemon checks them, and a
// bad one completes the request with a protection error, as an RNIC would.
type Segment struct {
	LMR     *LMR
	Offset  uint64
	Length  uint32
	Context uint32
}

// RemoteBuffer is a peer's memory (a DAT RMR triplet): its context (STag)
// and the address (tagged offset) to start at.
type RemoteBuffer struct {
	Context uint32
	Address uint64
}

// Flags of posted requests.
type Flags uint8

// Completion flags: the send ring's (shm.WRFlags), which the daemon
// checks.
const (
	// Signaled asks for a completion on success (failures always complete).
	Signaled = Flags(shm.WRSignaled)
	// Solicited sets the solicited-event bit of a Send.
	Solicited = Flags(shm.WRSolicited)
	// Fence waits for earlier Reads and atomics.
	Fence = Flags(shm.WRFence)
)

func toSGL(segs []Segment, max int) ([shm.RingSGE]shm.SGE, uint8, error) {
	var sgl [shm.RingSGE]shm.SGE
	if len(segs) > max {
		return sgl, 0, fmt.Errorf("%w: %d segments, at most %d", ErrInvalidParameter, len(segs), max)
	}
	for i, s := range segs {
		if s.LMR == nil {
			if s.Context == 0 {
				return sgl, 0, fmt.Errorf("%w: segment %d has no LMR", ErrInvalidParameter, i)
			}
			sgl[i] = shm.SGE{LKey: s.Context, Length: s.Length, Addr: s.Offset}
			continue
		}
		sgl[i] = shm.SGE{LKey: s.LMR.Context, Length: s.Length, Addr: s.LMR.Address(s.Offset)}
	}
	return sgl, uint8(len(segs)), nil
}

// postSQ writes one entry into the send ring and wakes the daemon if it
// sleeps. No system call otherwise.
func (e *EP) postSQ(sqe *shm.SQE) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sq == nil {
		return fmt.Errorf("post: %w: the EP has no QP (no PZ)", ErrInvalidState)
	}
	slot, err := e.sq.Reserve()
	if err != nil {
		return fmt.Errorf("post: %w", err)
	}
	if slot == nil {
		return ErrQueueFull
	}
	sqe.Encode(slot)
	e.sq.Commit()
	if e.sq.Flags()&shm.NeedWakeup != 0 {
		return e.ready()
	}
	return nil
}

// PostSend posts a Send of the segments (dat_ep_post_send).
func (e *EP) PostSend(cookie uint64, segs []Segment, flags Flags) error {
	sgl, n, err := toSGL(segs, shm.RingSGE)
	if err != nil {
		return err
	}
	return e.postSQ(&shm.SQE{Op: shm.SQSend, Flags: shm.WRFlags(flags), NSGE: n, ID: cookie, SGL: sgl})
}

// PostSendInvalidate posts a Send that invalidates the peer's STag.
func (e *EP) PostSendInvalidate(cookie uint64, segs []Segment, stag uint32, flags Flags) error {
	sgl, n, err := toSGL(segs, shm.RingSGE)
	if err != nil {
		return err
	}
	return e.postSQ(&shm.SQE{Op: shm.SQSendInvalidate, Flags: shm.WRFlags(flags), NSGE: n, ID: cookie, InvalidateSTag: stag, SGL: sgl})
}

// PostWrite posts an RDMA Write of the segments to the peer's buffer.
func (e *EP) PostWrite(cookie uint64, segs []Segment, to RemoteBuffer, flags Flags) error {
	sgl, n, err := toSGL(segs, shm.RingSGE)
	if err != nil {
		return err
	}
	return e.postSQ(&shm.SQE{Op: shm.SQWrite, Flags: shm.WRFlags(flags), NSGE: n, ID: cookie, RemoteSTag: to.Context, RemoteTO: to.Address, SGL: sgl})
}

// PostRead posts an RDMA Read of the peer's buffer into one segment.
func (e *EP) PostRead(cookie uint64, into Segment, from RemoteBuffer, flags Flags) error {
	sgl, n, err := toSGL([]Segment{into}, 1)
	if err != nil {
		return err
	}
	return e.postSQ(&shm.SQE{Op: shm.SQRead, Flags: shm.WRFlags(flags), NSGE: n, ID: cookie, RemoteSTag: from.Context, RemoteTO: from.Address, SGL: sgl})
}

// PostReadv posts an RDMA Read of the peer's buffer scattered into up to
// four local segments (a DAT Read with several local segments). iWARP's
// Read Request names one sink, so it posts one Read per segment, each
// reading the next part of the peer's buffer: all of them or, when the
// ring has no room for all, none (ErrQueueFull). Only the last carries
// Signaled; its completion's Length is its own segment's.
func (e *EP) PostReadv(cookie uint64, into []Segment, from RemoteBuffer, flags Flags) error {
	if len(into) == 0 || len(into) > shm.RingSGE {
		return fmt.Errorf("%w: %d segments for a Read, 1 to %d", ErrInvalidParameter, len(into), shm.RingSGE)
	}
	var buf [shm.RingSGE]shm.SQE // no allocation per post
	sqes := buf[:len(into)]
	for i, s := range into {
		sgl, n, err := toSGL(into[i:i+1], 1)
		if err != nil {
			return err
		}
		f := flags
		if i < len(into)-1 {
			f &^= Signaled
		}
		sqes[i] = shm.SQE{Op: shm.SQRead, Flags: shm.WRFlags(f), NSGE: n, ID: cookie, RemoteSTag: from.Context, RemoteTO: from.Address, SGL: sgl}
		from.Address += uint64(s.Length)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sq == nil {
		return fmt.Errorf("post: %w: the EP has no QP (no PZ)", ErrInvalidState)
	}
	room, err := e.sq.Room()
	if err != nil {
		return fmt.Errorf("post: %w", err)
	}
	if room < len(sqes) {
		return ErrQueueFull
	}
	for i := range sqes {
		slot, err := e.sq.Reserve()
		if err != nil || slot == nil {
			return fmt.Errorf("post: ring changed under the producer: %w", shm.ErrCorrupt)
		}
		sqes[i].Encode(slot)
		e.sq.Commit()
	}
	if e.sq.Flags()&shm.NeedWakeup != 0 {
		return e.ready()
	}
	return nil
}

// PostFetchAdd adds to the peer's 8-octet value; the original lands in
// result (8 octets).
func (e *EP) PostFetchAdd(cookie uint64, result Segment, at RemoteBuffer, add uint64, flags Flags) error {
	sgl, n, err := toSGL([]Segment{result}, 1)
	if err != nil {
		return err
	}
	return e.postSQ(&shm.SQE{Op: shm.SQFetchAdd, Flags: shm.WRFlags(flags), NSGE: n, ID: cookie, RemoteSTag: at.Context, RemoteTO: at.Address, Compare: add, SGL: sgl})
}

// PostCmpSwap stores swap at the peer if its value equals compare; the
// original lands in result.
func (e *EP) PostCmpSwap(cookie uint64, result Segment, at RemoteBuffer, compare, swap uint64, flags Flags) error {
	sgl, n, err := toSGL([]Segment{result}, 1)
	if err != nil {
		return err
	}
	return e.postSQ(&shm.SQE{Op: shm.SQCmpSwap, Flags: shm.WRFlags(flags), NSGE: n, ID: cookie, RemoteSTag: at.Context, RemoteTO: at.Address,
		Compare: compare, Swap: swap, SGL: sgl})
}

// PostImmediate sends eight octets of RFC 7306 immediate data; after a
// PostWrite it makes an RDMA Write with Immediate.
func (e *EP) PostImmediate(cookie uint64, data [8]byte, flags Flags) error {
	return e.postSQ(&shm.SQE{Op: shm.SQImmediate, Flags: shm.WRFlags(flags), ID: cookie, Immediate: data})
}

// PostRecv posts a receive buffer (dat_ep_post_recv). It may be posted
// before the EP is connected.
func (e *EP) PostRecv(cookie uint64, segs []Segment) error {
	sgl, n, err := toSGL(segs, shm.RQSGE)
	if err != nil {
		return err
	}
	rqe := shm.RQE{ID: cookie, NSGE: n}
	copy(rqe.SGL[:], sgl[:shm.RQSGE])
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.rq == nil {
		return fmt.Errorf("post: %w: the EP has no QP (no PZ)", ErrInvalidState)
	}
	slot, err := e.rq.Reserve()
	if err != nil {
		return fmt.Errorf("post: %w", err)
	}
	if slot == nil {
		return ErrQueueFull
	}
	rqe.Encode(slot)
	e.rq.Commit()
	if e.rq.Flags()&shm.NeedWakeup != 0 {
		return e.ready()
	}
	return nil
}

// PSP is a public service point: a listening port.
type PSP struct {
	ia *IA
	h  uint32
}

// CreatePSP listens on port; connection requests arrive on evd. With
// providerEP each request comes with an EP the provider created, in
// TENTATIVE_CONNECTION_PENDING without a PZ.
func (ia *IA) CreatePSP(port uint16, evd *EVD, providerEP bool) (*PSP, error) {
	var r ctl.Handle
	if _, err := ia.call(ctl.OpCreatePSP, &ctl.CreatePSP{Port: port, EVD: evd.h, ProviderEP: providerEP}, nil, &r); err != nil {
		return nil, fmt.Errorf("create PSP: %w", err)
	}
	return &PSP{ia: ia, h: r.H}, nil
}

// CreateRSP listens on port for one request, for ep (which goes RESERVED).
func (ia *IA) CreateRSP(port uint16, ep *EP, evd *EVD) (*PSP, error) {
	var r ctl.Handle
	if _, err := ia.call(ctl.OpCreateRSP, &ctl.CreateRSP{Port: port, EP: ep.h, EVD: evd.h}, nil, &r); err != nil {
		return nil, fmt.Errorf("create RSP: %w", err)
	}
	return &PSP{ia: ia, h: r.H}, nil
}

// Free stops listening; requests already received are unaffected.
func (p *PSP) Free() error {
	if _, err := p.ia.call(ctl.OpFreePSP, &ctl.Handle{H: p.h}, nil, nil); err != nil {
		return fmt.Errorf("free PSP: %w", err)
	}
	return nil
}

// CR is a connection request.
type CR struct {
	ia *IA
	h  uint32
	// EP is the provider-created or reserved EP, if any.
	EP *EP
}

// CRInfo is what Query returns.
type CRInfo struct {
	PrivateData           []byte
	RemoteAddr, LocalAddr string
}

// Query returns the request's private data and addresses.
func (c *CR) Query() (CRInfo, error) {
	var r ctl.CRInfo
	if _, err := c.ia.call(ctl.OpQueryCR, &ctl.Handle{H: c.h}, nil, &r); err != nil {
		return CRInfo{}, fmt.Errorf("query CR: %w", err)
	}
	return CRInfo{PrivateData: r.PrivateData, RemoteAddr: r.RemoteAddr, LocalAddr: r.LocalAddr}, nil
}

// Accept accepts on ep (nil: the CR's own EP) with private data; the EP
// goes COMPLETION_PENDING and then CONNECTED with an ESTABLISHED event.
func (c *CR) Accept(ep *EP, privateData []byte) error {
	req := &ctl.AcceptCR{CR: c.h, PrivateData: privateData}
	if ep != nil {
		req.EP = ep.h
	}
	if _, err := c.ia.call(ctl.OpAcceptCR, req, nil, nil); err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	return nil
}

// Reject refuses the request; the peer sees PEER_REJECTED with the data.
func (c *CR) Reject(privateData []byte) error {
	if _, err := c.ia.call(ctl.OpRejectCR, &ctl.RejectCR{CR: c.h, PrivateData: privateData}, nil, nil); err != nil {
		return fmt.Errorf("reject: %w", err)
	}
	return nil
}

// Stats are the daemon's live object counts (all sessions).
func (ia *IA) Stats() (ctl.StatsReply, error) {
	var r ctl.StatsReply
	_, err := ia.call(ctl.OpStats, &struct{}{}, nil, &r)
	return r, err
}
