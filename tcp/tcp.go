// Package tcp is softrnic's TCP engine: the TCP offload part of the RNIC.
//
// It is a pure state machine. Nothing in it starts a goroutine, reads a
// clock or makes a system call; the poller that owns a Stack drives it with
// three kinds of input and collects its output:
//
//   - Stack.Input(now, src, dst, segment): a received TCP segment (the IP
//     header already checked and removed by the caller);
//   - Stack.Advance(now): time passes; expired timers fire;
//   - application actions on a Conn: Write, Read, Close, Abort, and on the
//     Stack: Connect, Listen, Accept.
//
// and Stack.Output(now, buf) fills buf with the next TCP segment to send
// (header, options, payload and checksum) until it returns 0. In-order
// payload is handed to the connection's Handler as a sub-slice of the
// received segment, so the MPA/DDP layer can place it into registered
// memory straight from the receive frame; only what the Handler leaves, and
// out-of-order data, is copied into the receive buffer. The transmitter
// pulls from the send buffer, which a Filler can write FPDUs into in
// place; retransmission re-reads the send buffer.
//
// One Stack belongs to one poller; nothing here is safe for concurrent use.
// Time is a monotonic count of nanoseconds chosen by the caller.
//
// The TCP it speaks: RFC 9293 (state machine, simultaneous open and close,
// TIME-WAIT), RFC 5961 (challenge ACKs, RST and SYN checks, ACK validation),
// RFC 6528 initial sequence numbers, SYN cookies when the SYN queue is full,
// RFC 7323 window scaling and timestamps (RTTM, PAWS), RFC 2018 SACK with
// RACK-TLP loss detection (RFC 8985, rack.go) and RFC 6675 loss recovery,
// PRR (RFC 6937, prr.go), RFC 6298 retransmission timer, RFC 5681 fast
// retransmit, delayed ACKs with a quick-ACK mode, zero-window probing,
// keepalive, and congestion control behind an interface (NewReno, CUBIC per
// RFC 9438, CUBIC by default).
package tcp

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Time is a monotonic instant in nanoseconds, chosen by the driver.
type Time int64

// Add returns t + d.
func (t Time) Add(d time.Duration) Time { return t + Time(d) }

// Sub returns t - u.
func (t Time) Sub(u Time) time.Duration { return time.Duration(t - u) }

// State is a connection state (RFC 9293 §3.3.2).
type State uint8

// States.
const (
	StateClosed State = iota
	StateListen
	StateSynSent
	StateSynRcvd
	StateEstablished
	StateFinWait1
	StateFinWait2
	StateCloseWait
	StateClosing
	StateLastAck
	StateTimeWait
)

var stateNames = [...]string{"CLOSED", "LISTEN", "SYN-SENT", "SYN-RECEIVED", "ESTABLISHED",
	"FIN-WAIT-1", "FIN-WAIT-2", "CLOSE-WAIT", "CLOSING", "LAST-ACK", "TIME-WAIT"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// synchronized: the state is past the handshake (RFC 9293 §3.10.7.4).
func (s State) synchronized() bool { return s >= StateEstablished }

// Errors a connection ends with (Conn.Err).
var (
	ErrReset     = errors.New("tcp: connection reset by peer")
	ErrRefused   = errors.New("tcp: connection refused")
	ErrTimedOut  = errors.New("tcp: connection timed out")
	ErrAborted   = errors.New("tcp: connection aborted")
	ErrClosed    = errors.New("tcp: connection closed")
	ErrPortInUse = errors.New("tcp: port in use")
	ErrNoPorts   = errors.New("tcp: no ephemeral port free")
)

// FourTuple names a connection from the local side.
type FourTuple struct {
	LocalAddr, RemoteAddr netip.Addr
	LocalPort, RemotePort uint16
}

func (f FourTuple) String() string {
	return fmt.Sprintf("%v -> %v", netip.AddrPortFrom(f.LocalAddr, f.LocalPort), netip.AddrPortFrom(f.RemoteAddr, f.RemotePort))
}

// Event is something that happened to a connection.
type Event uint8

// Events given to Handler.Event.
const (
	// EventEstablished: the handshake completed.
	EventEstablished Event = iota + 1
	// EventWritable: send buffer space was freed after a Write came up short.
	EventWritable
	// EventReadable: data the Handler left in the receive buffer can be Read.
	EventReadable
	// EventPeerClosed: the peer's FIN arrived after all its data.
	EventPeerClosed
	// EventClosed: the connection is over; Conn.Err says how. No more
	// events follow.
	EventClosed
)

func (e Event) String() string {
	switch e {
	case EventEstablished:
		return "established"
	case EventWritable:
		return "writable"
	case EventReadable:
		return "readable"
	case EventPeerClosed:
		return "peer-closed"
	case EventClosed:
		return "closed"
	}
	return fmt.Sprintf("Event(%d)", uint8(e))
}

// Handler is the consumer of a connection: the MPA layer in the RNIC.
type Handler interface {
	// Receive is given in-order payload, valid only during the call, and
	// returns how many octets it consumed. What it leaves is copied into
	// the receive buffer (shrinking the advertised window) and can be
	// taken later with Conn.Read.
	Receive(c *Conn, b []byte) int
	// Event reports a state change.
	Event(c *Conn, ev Event)
}

// Filler is an optional Handler extension: when the connection may send
// more than its send buffer holds, it calls Fill with free send-buffer
// space so the producer can build its data there in place (MPA builds
// FPDUs straight into it). Fill returns how many octets it wrote, at most
// len(dst); it must not write past len(dst).
type Filler interface {
	Fill(c *Conn, dst []byte) int
}

// Options configure a Stack and its connections. Zero fields take the
// defaults documented on each.
type Options struct {
	// MTU of the interface the stack sends on, for the MSS (default 1500).
	MTU int
	// SendBuffer and ReceiveBuffer bound what a connection holds
	// (default 4 MiB each: enough for one connection to fill a 25 Gbit/s
	// link at 1 ms RTT); the receive window offers ReceiveBuffer. They
	// are limits, not reservations: memory is taken as octets are
	// queued and given back when none are (see buffer.go).
	SendBuffer, ReceiveBuffer int
	// CongestionControl by name: "cubic" (default) or "newreno".
	CongestionControl string
	// DisableSACK, DisableTimestamps, DisableWindowScale turn options off.
	DisableSACK, DisableTimestamps, DisableWindowScale bool
	// RTOMin, RTOMax, RTOInitial (defaults 200 ms, 120 s, 1 s; RFC 6298
	// §2 asks 1 s initially; Linux uses a 200 ms floor).
	RTOMin, RTOMax, RTOInitial time.Duration
	// DelayedACK is the longest an ACK waits (default 40 ms, as Linux).
	DelayedACK time.Duration
	// QuickACKs: segments acknowledged at once after the handshake and
	// after loss (default 16).
	QuickACKs int
	// SynRetries and Retries bound retransmissions of a SYN and of data
	// before the connection times out (defaults 6 and 15, as Linux).
	SynRetries, Retries int
	// TimeWait is how long TIME-WAIT lasts, 2*MSL (default 60 s).
	TimeWait time.Duration
	// FinTimeout bounds FIN-WAIT-2: a peer that acknowledged our FIN
	// and never sends its own is reset after it (default 60 s, Linux's
	// tcp_fin_timeout); otherwise it would hold the connection, its port
	// and its buffers for ever.
	FinTimeout time.Duration
	// KeepAlive turns keepalive on with KeepIdle, KeepInterval and
	// KeepCount (defaults 2 h, 75 s, 9 as RFC 9293 §3.8.4 and Linux).
	KeepAlive              bool
	KeepIdle, KeepInterval time.Duration
	KeepCount              int
	// SynBacklog bounds half-open connections per listener before SYN
	// cookies are used (default 256); AcceptBacklog bounds established
	// connections waiting for Accept (default 128).
	SynBacklog, AcceptBacklog int
	// Secret keys initial sequence numbers and SYN cookies (RFC 6528).
	// Zero picks nothing: callers must give a random one; tests give a
	// fixed one to be deterministic.
	Secret [16]byte
	// EphemeralPorts is the range Connect picks local ports from
	// (default 32768..60999, as Linux).
	EphemeralLow, EphemeralHigh uint16
}

func (o *Options) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MTU, 1500)
	def(&o.SendBuffer, 4<<20)
	def(&o.ReceiveBuffer, 4<<20)
	if o.CongestionControl == "" {
		o.CongestionControl = "cubic"
	}
	defD(&o.RTOMin, 200*time.Millisecond)
	defD(&o.RTOMax, 120*time.Second)
	defD(&o.RTOInitial, time.Second)
	defD(&o.DelayedACK, 40*time.Millisecond)
	def(&o.QuickACKs, 16)
	def(&o.SynRetries, 6)
	def(&o.Retries, 15)
	defD(&o.TimeWait, 60*time.Second)
	defD(&o.FinTimeout, 60*time.Second)
	defD(&o.KeepIdle, 2*time.Hour)
	defD(&o.KeepInterval, 75*time.Second)
	def(&o.KeepCount, 9)
	def(&o.SynBacklog, 256)
	def(&o.AcceptBacklog, 128)
	if o.EphemeralLow == 0 || o.EphemeralHigh < o.EphemeralLow {
		o.EphemeralLow, o.EphemeralHigh = 32768, 60999
	}
}

// mssFor is the MSS of an MTU: IP and TCP headers without options
// (RFC 9293 §3.7.1).
func mssFor(mtu int, v6 bool) int {
	if v6 {
		return mtu - 60
	}
	return mtu - 40
}
