package rnic

import (
	"errors"
	"fmt"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/tcp"
)

// stream is the reliable byte stream a QP's LLP runs MPA over: a
// connection of softrnic's TCP engine (a *tcp.Conn, the accelerated
// datapath) or a kernel TCP socket (kernelConn). Its methods are called
// with the connection's lock held and must not block.
type stream interface {
	// Kick asks for Fill to be called: the LLP has octets to send.
	Kick()
	// Close sends a FIN after every octet Fill gave.
	Close()
	// Abort resets the connection; what is unsent is dropped.
	Abort()
	// MSS is the largest segment the stream sends.
	MSS() int
	// Err is why the stream ended, nil for an orderly close.
	Err() error
}

var _ stream = (*tcp.Conn)(nil)

// mpaConn runs one queue pair over a stream, on either datapath: the
// resumable MPA startup (Request and Reply, fed octets as they arrive),
// then every in-order octet straight to the QP engine (on the accelerated
// datapath placement reads the receive frame) and the QP engine's FPDUs
// into the stream's send buffer as the stream asks for them (Fill). The
// connection that owns it calls it under one lock, never concurrently:
// the engine connection on its poller, the kernel connection under its
// mutex; with the QP's mutex too once there is a QP.
type mpaConn struct {
	qp  *qp.QP
	cfg mpa.Config
	// startup holds the peer's frame as it arrives; out the frame we
	// still have to send.
	startup []byte
	out     []byte
	sent    uint64
	conn    stream
	// Params is the outcome of MPA startup, once ready.
	Params mpa.Params
	// Err is why startup failed, if it did.
	Err error
	// OnReady, if set, is called when the QP has reached RTS.
	OnReady func(*mpaConn)
	// OnClose, if set, is called when the QP's connection sends its FIN
	// (a graceful disconnect drained, or the QP ended).
	OnClose func()
	// OnRequest, if set, makes a responder wait for its consumer: it is
	// called with the peer's MPA Request, and the connection waits
	// until Accept or Reject. Without it a responder accepts at once.
	OnRequest func(*mpaConn, *mpa.Frame)
	// Rejected holds the peer's private data when it rejected our
	// Request (Err then wraps mpa.ErrRejected).
	Rejected []byte
	// req is the peer's Request while the consumer decides (waiting).
	req *mpa.Frame
	// unwritten: octets Fill gave a WroteLater stream, not yet taken.
	unwritten int

	// The flags, together (an mpaConn is held for each connection).
	initiator bool
	// ready: MPA startup is done and the QP is in RTS.
	ready bool
	// heard: octets from the peer after MPA startup reached the QP.
	heard bool
	// waiting: a Request waits for Accept or Reject; closeAfter: close
	// once out is sent (a Reject).
	waiting    bool
	closeAfter bool
	closing    bool
	// WroteLater: the stream reports with Wrote which octets of those
	// Fill gave it took (a kernel socket, which may take part of them
	// later or never); otherwise they are taken when Fill returns (the
	// TCP engine's send buffer).
	WroteLater bool
}

// newMPAConn prepares q to run over a TCP connection as MPA initiator
// (the side that connected) or responder, with cfg for the negotiation.
func newMPAConn(q *qp.QP, cfg mpa.Config, initiator bool) *mpaConn {
	return &mpaConn{qp: q, cfg: cfg, initiator: initiator}
}

// Ready reports whether the QP runs.
func (e *mpaConn) Ready() bool { return e.ready }

// Kick asks the TCP engine to pull FPDUs after work was posted to the QP.
func (e *mpaConn) Kick() {
	if e.conn != nil {
		e.conn.Kick()
	}
}

// Receive takes in-order stream octets from the TCP engine.
func (e *mpaConn) Receive(c stream, b []byte) int {
	e.conn = c
	if e.Err != nil {
		return len(b)
	}
	if !e.ready {
		e.startup = append(e.startup, b...)
		f, n, err := mpa.ParseFrame(e.startup, e.initiator)
		if errors.Is(err, mpa.ErrShortFrame) {
			return len(b)
		}
		if err != nil {
			e.fail(c, err)
			return len(b)
		}
		rest := e.startup[n:]
		if e.initiator {
			p, err := e.cfg.Complete(&f)
			if err != nil {
				if errors.Is(err, mpa.ErrRejected) {
					e.Rejected = append([]byte{}, f.PrivateData...)
				}
				if wire := negotiationTerminate(p, err); wire != nil {
					// The Terminate goes out, then our FIN, as on the
					// kernel datapath; the consumer learns of the
					// failure at once (see engineConn.Receive).
					e.Err = fmt.Errorf("mpa startup: %w", err)
					e.out, e.closeAfter = wire, true
					c.Kick()
					return len(b)
				}
				e.fail(c, err)
				return len(b)
			}
			e.start(c, p)
		} else if e.OnRequest != nil {
			if e.waiting {
				return len(b) // the initiator may not speak before our Reply
			}
			req := f
			req.PrivateData = append([]byte(nil), f.PrivateData...)
			e.req, e.waiting = &req, true
			e.OnRequest(e, e.req)
			return len(b)
		} else {
			wire, p, err := acceptWire(e.cfg, &f)
			if err != nil {
				e.fail(c, err)
				return len(b)
			}
			e.out = wire
			e.start(c, p)
		}
		e.startup = nil
		if len(rest) > 0 && e.ready {
			e.heard = true
			e.qp.Receive(rest)
		}
		c.Kick()
		return len(b)
	}
	e.heard = true
	e.qp.Receive(b)
	c.Kick() // the QP may owe responses or a Terminate
	return len(b)
}

// Accept answers the waiting Request with an MPA Reply built from cfg and
// runs q on the connection. Call it on the connection's poller. An
// initiator IRD below our ORD shrinks our ORD, as on the kernel datapath.
func (e *mpaConn) Accept(q *qp.QP, cfg mpa.Config) error {
	if !e.waiting || e.conn == nil {
		return errors.New("rnic: no request waiting")
	}
	if e.Err != nil {
		return e.Err
	}
	e.waiting = false
	e.qp, e.cfg = q, cfg
	wire, p, err := acceptWire(cfg, e.req)
	e.req = nil // answered
	if err != nil {
		e.fail(e.conn, err)
		return e.Err
	}
	e.out = wire
	e.start(e.conn, p)
	e.conn.Kick()
	return e.Err
}

// Reject answers the waiting Request with a Reject carrying private, then
// closes the connection. Call it on the connection's poller.
func (e *mpaConn) Reject(private []byte) {
	if !e.waiting || e.conn == nil {
		return
	}
	e.waiting = false
	e.out = rejectWire(e.req, private)
	e.req = nil // answered
	e.Err = mpa.ErrRejected
	if len(e.out) == 0 {
		e.conn.Close()
		return
	}
	e.closeAfter = true
	e.conn.Kick()
}

func (e *mpaConn) start(c stream, p mpa.Params) {
	emss := min(c.MSS(), mpa.MaxULPDU)
	if err := e.qp.Connect(p, emss, e.initiator); err != nil {
		e.fail(c, err)
		return
	}
	e.Params, e.ready = p, true
	if e.OnReady != nil {
		e.OnReady(e)
	}
}

func (e *mpaConn) fail(c stream, err error) {
	e.Err = fmt.Errorf("mpa startup: %w", err)
	c.Abort()
}

// Fill gives the TCP engine the startup frame, then FPDUs.
func (e *mpaConn) Fill(c stream, dst []byte) int {
	e.conn = c
	if len(e.out) > 0 {
		n := copy(dst, e.out)
		e.out = e.out[n:]
		if len(e.out) == 0 {
			e.out = nil // the frame's memory is not held for the connection's life
			if e.closeAfter {
				c.Close()
			}
		}
		return n
	}
	if !e.ready {
		return 0
	}
	n := e.qp.Transmit(dst)
	switch {
	case e.WroteLater:
		e.unwritten += n
	case n > 0:
		// Octets in the TCP send buffer belong to the LLP from here on.
		e.sent += uint64(n)
		e.qp.Sent(e.sent)
	}
	e.closeIfDone(c, n)
	return n
}

// errDetached is the startup error of a connection whose QP let go of it.
var errDetached = errors.New("rnic: the QP let go of the connection")

// Detach lets go of the QP after a failed startup: nothing that arrives
// from now on reaches it (a Reply read before an abort does not start
// it), and no event or timer of the connection is its; what the
// connection still owes the peer (a Terminate, the FIN) goes out. Call it
// under the connection's locks, the QP's included.
func (e *mpaConn) Detach() {
	if e.Err == nil {
		e.Err = fmt.Errorf("mpa startup: %w", errDetached)
	}
	e.ready = false
	e.qp = nil
	e.OnReady, e.OnClose = nil, nil
}

// Wrote tells a WroteLater MPA layer that the stream took n more octets
// of what Fill gave; the QP's requests complete as their octets are taken.
func (e *mpaConn) Wrote(c stream, n int) {
	n = min(n, e.unwritten)
	if n == 0 || e.qp == nil {
		return
	}
	e.unwritten -= n
	e.sent += uint64(n)
	e.qp.Sent(e.sent)
	e.closeIfDone(c, n)
}

// closeIfDone sends our FIN once the QP ended (after a Terminate or the
// peer's FIN) with nothing more to send (Fill gave n octets), or a graceful
// disconnect has sent everything.
func (e *mpaConn) closeIfDone(c stream, n int) {
	if (n == 0 && e.qp.Ended() && e.unwritten == 0) || e.qp.Drained() {
		c.Close()
		if e.OnClose != nil && !e.closing {
			e.closing = true
			e.OnClose()
		}
	}
}

// Event follows the TCP connection.
func (e *mpaConn) Event(c stream, ev tcp.Event) {
	e.conn = c
	switch ev {
	case tcp.EventEstablished:
		if e.initiator {
			req, err := e.cfg.Request()
			if err != nil {
				e.fail(c, err)
				return
			}
			e.out, _ = req.Append(nil)
			c.Kick()
		}
	case tcp.EventPeerClosed:
		switch {
		case e.ready:
			e.qp.LLPClosed(nil)
		case e.Err == nil:
			// The peer closed before MPA startup completed: it is
			// not coming back with the rest of its frame.
			e.fail(c, fmt.Errorf("%w: the peer closed the connection during MPA startup", ddp.LLPConnectionLost))
		}
	case tcp.EventClosed:
		if e.ready {
			if err := c.Err(); err != nil {
				e.qp.LLPClosed(fmt.Errorf("%w: %w", ddp.LLPConnectionLost, err))
			} else {
				e.qp.LLPClosed(nil)
			}
		}
	}
}
