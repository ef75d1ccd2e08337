package mpa

import (
	"errors"
	"fmt"

	"github.com/softrnic/softrnic/ddp"
)

// Config is what one endpoint asks for in MPA startup.
type Config struct {
	// Revision to speak: 2 (RFC 6581 enhanced setup, the default when
	// zero) or 1 (plain RFC 5044).
	Revision uint8
	// CRC asks for CRC32c. It is used if either side asks.
	CRC bool
	// Markers requires markers in the FPDUs this endpoint receives.
	Markers bool
	// IRD and ORD: inbound and outbound RDMA Read (and atomic) depths.
	// MaxIRDORD leaves the negotiation to the ULP (RFC 6581 §9.1).
	IRD, ORD uint16
	// PeerToPeer asks for (initiator) or accepts (responder) the
	// peer-to-peer model, in which the initiator sends one RTR message
	// before anything else.
	PeerToPeer bool
	// RTR is the set of RTR indications this endpoint can send (initiator)
	// or receive (responder). Zero means all three.
	RTR RTR
	// PrivateData for the consumer on the other side.
	PrivateData []byte
}

func (c *Config) revision() uint8 {
	if c.Revision == 0 {
		return 2
	}
	return c.Revision
}

func (c *Config) rtr() RTR {
	if c.RTR == 0 {
		return RTRSend | RTRWrite | RTRRead
	}
	return c.RTR
}

// sendable is the RTR messages this endpoint can send as initiator: a
// zero-length Read needs an ORD of 1 or more.
func (c *Config) sendable() RTR {
	if c.ORD == 0 {
		return c.rtr() &^ RTRRead
	}
	return c.rtr()
}

// answerable is the RTR messages this endpoint can take as responder: a
// zero-length Read needs an IRD of 1 or more to be answered.
func (c *Config) answerable() RTR {
	if c.IRD == 0 {
		return c.rtr() &^ RTRRead
	}
	return c.rtr()
}

// Params is the outcome of MPA startup for one endpoint.
type Params struct {
	Revision uint8
	Enhanced bool
	// CRC is generated and checked in both directions.
	CRC bool
	// MarkersTx: this endpoint inserts markers; MarkersRx: it receives them.
	MarkersTx, MarkersRx bool
	// IRD and ORD this endpoint must use.
	IRD, ORD uint16
	// PeerToPeer with the one RTR indication the initiator sends.
	PeerToPeer bool
	RTR        RTR
	// PeerPrivateData is the other consumer's private data.
	PeerPrivateData []byte
}

// ErrRejected: the responder's consumer rejected the connection. Its private
// data is in the Params returned alongside.
var ErrRejected = errors.New("mpa: connection rejected by the peer")

// Request builds the initiator's MPA Request.
func (c *Config) Request() (Frame, error) {
	f := Frame{
		Markers:     c.Markers,
		CRC:         c.CRC,
		Revision:    c.revision(),
		PrivateData: c.PrivateData,
	}
	if f.Revision >= 2 {
		f.Enhanced = true
		f.IRD, f.ORD = c.IRD, c.ORD
		if c.PeerToPeer {
			f.PeerToPeer = true
			if f.RTR = c.sendable(); f.RTR == 0 {
				return f, fmt.Errorf("mpa: no RTR message to offer: %v needs an ORD of 1 or more", c.rtr())
			}
		}
	}
	return f, f.Validate()
}

// Accept builds the responder's Reply to req and the responder's Params.
// An error is a reason to reject (RFC 6581 §9.1: the initiator's IRD is
// below the ORD the consumer requires), with the reply to send anyway.
func (c *Config) Accept(req *Frame) (Frame, Params, error) {
	// The Reply carries the CRC setting in force: RFC 5044 §7.1.1 makes
	// CRC apply if either frame asks, and strict peers (Linux siw with
	// mpa_crc_required) drop a Reply whose C bit is clear.
	reply := Frame{
		Reply:       true,
		Markers:     c.Markers,
		CRC:         c.CRC || req.CRC,
		Revision:    min(req.Revision, c.revision()),
		PrivateData: c.PrivateData,
	}
	p := Params{
		Revision:        reply.Revision,
		CRC:             req.CRC || c.CRC,
		MarkersTx:       req.Markers,
		MarkersRx:       c.Markers,
		IRD:             c.IRD,
		ORD:             c.ORD,
		PeerPrivateData: req.PrivateData,
	}
	// RFC 6581 §10: an unenhanced Request gets an unenhanced Reply.
	if !req.Enhanced || reply.Revision < 2 {
		return reply, p, reply.Validate()
	}
	reply.Enhanced = true
	p.Enhanced = true
	// §9.1: initiator ORD <= responder IRD, responder ORD <= initiator
	// IRD. 0x3FFF on either side leaves that value to the ULPs: the
	// responder keeps its own and echoes 0x3FFF.
	reply.IRD = c.IRD
	if req.ORD == MaxIRDORD {
		reply.IRD = MaxIRDORD
	}
	var err error
	switch {
	case req.IRD == MaxIRDORD:
		reply.ORD = MaxIRDORD
	case c.ORD > req.IRD:
		// The responder's ORD shrinks to the initiator's IRD; the
		// consumer may prefer to reject instead, so say so.
		reply.ORD = req.IRD
		p.ORD = req.IRD
		err = fmt.Errorf("mpa: initiator IRD %d below responder ORD %d: %w", req.IRD, c.ORD, ddp.LLPInsufficientIRD)
	default:
		reply.ORD = c.ORD
	}
	if req.PeerToPeer {
		// §9.2: A is echoed; the responder picks one RTR the initiator
		// offered, or, with none in common, lists what it supports.
		reply.PeerToPeer = true
		p.PeerToPeer = true
		if pick := pickRTR(req.RTR & c.answerable()); pick != 0 {
			reply.RTR = pick
			p.RTR = pick
		} else {
			reply.RTR = c.answerable()
			if reply.RTR == 0 {
				// Only a Read accepted, with IRD 0: nothing this
				// responder can take. Refuse rather than let a
				// lenient initiator send the Read anyway.
				reply.RTR = c.rtr()
				return reply, p, fmt.Errorf("mpa: no RTR message this responder can take: %v needs an IRD of 1 or more: %w", c.rtr(), ddp.LLPNoMatchingRTR)
			}
		}
	}
	if verr := reply.Validate(); verr != nil {
		return reply, p, verr
	}
	return reply, p, err
}

// Reject builds a Reply that refuses req, carrying the consumer's private
// data (RFC 5044 §7.1.1, R bit).
func (c *Config) Reject(req *Frame) (Frame, error) {
	reply := Frame{
		Reply:       true,
		Reject:      true,
		Markers:     c.Markers,
		CRC:         c.CRC,
		Revision:    min(req.Revision, c.revision()),
		PrivateData: c.PrivateData,
	}
	if req.Enhanced && reply.Revision >= 2 {
		reply.Enhanced = true
		reply.IRD, reply.ORD = c.IRD, c.ORD
	}
	return reply, reply.Validate()
}

// Complete checks the responder's Reply to the initiator's Request and gives
// the initiator's Params. A rejected connection gives ErrRejected with the
// peer's private data in Params. Errors wrapping ddp.LLPInsufficientIRD or
// ddp.LLPNoMatchingRTR must be reported to the peer in a Terminate before
// the connection is closed (RFC 6581 §9).
func (c *Config) Complete(reply *Frame) (Params, error) {
	p := Params{
		Revision:        reply.Revision,
		CRC:             reply.CRC || c.CRC,
		MarkersTx:       reply.Markers,
		MarkersRx:       c.Markers,
		IRD:             c.IRD,
		ORD:             c.ORD,
		PeerPrivateData: reply.PrivateData,
	}
	if reply.Revision > c.revision() {
		return p, fmt.Errorf("%w: reply revision %d above request revision %d", ErrBadRevision, reply.Revision, c.revision())
	}
	if reply.Reject {
		return p, ErrRejected
	}
	// A responder that does not speak RFC 6581 answers unenhanced; the
	// connection goes on with the consumer's own IRD/ORD, as Linux's
	// iWARP drivers do.
	if !reply.Enhanced || c.revision() < 2 {
		if c.PeerToPeer && c.revision() >= 2 {
			return p, fmt.Errorf("mpa: peer-to-peer mode asked, unenhanced reply: %w", ddp.LLPNoMatchingRTR)
		}
		return p, nil
	}
	p.Enhanced = true
	// §9.1: initiator IRD >= responder ORD, initiator ORD <= responder IRD.
	if reply.ORD != MaxIRDORD && c.IRD != MaxIRDORD && reply.ORD > c.IRD {
		return p, fmt.Errorf("mpa: responder ORD %d above our IRD %d: %w", reply.ORD, c.IRD, ddp.LLPInsufficientIRD)
	}
	if reply.IRD != MaxIRDORD && c.ORD != MaxIRDORD {
		p.ORD = min(c.ORD, reply.IRD)
	}
	if c.PeerToPeer {
		if !reply.PeerToPeer {
			return p, fmt.Errorf("mpa: responder refused peer-to-peer mode: %w", ddp.LLPNoMatchingRTR)
		}
		pick := pickRTR(reply.RTR & c.sendable())
		if pick == 0 {
			return p, fmt.Errorf("mpa: responder supports RTR %v, we send %v: %w", reply.RTR, c.sendable(), ddp.LLPNoMatchingRTR)
		}
		if pick == RTRRead && p.ORD == 0 {
			// The responder took a Read RTR with no IRD to answer it.
			return p, fmt.Errorf("mpa: responder picked a Read RTR with IRD 0: %w", ddp.LLPInsufficientIRD)
		}
		p.PeerToPeer = true
		p.RTR = pick
	}
	return p, nil
}

// pickRTR chooses one indication from a set: a zero-length Write first (what
// Linux siw and Chelsio send), then Read, then Send.
func pickRTR(set RTR) RTR {
	for _, r := range []RTR{RTRWrite, RTRRead, RTRSend} {
		if set&r != 0 {
			return r
		}
	}
	return 0
}
