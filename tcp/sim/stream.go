package sim

import (
	"fmt"

	"github.com/softrnic/softrnic/tcp"
)

// Pattern is the octet at offset off of a test stream keyed by seed: cheap
// to compute, different at every offset of a 256 MiB stream in practice,
// and different between streams, so misplaced or duplicated data shows.
func Pattern(seed uint64, off uint64) byte {
	x := (off>>3 + seed*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
	x ^= x >> 31
	return byte(x >> (8 * (off & 7)))
}

// FillPattern writes the pattern for [off, off+len(b)) into b.
func FillPattern(seed, off uint64, b []byte) {
	for i := range b {
		b[i] = Pattern(seed, off+uint64(i))
	}
}

// Endpoint is a Handler that sends Total octets of its pattern (then
// closes if CloseWhenDone) and checks that what it receives is the peer's
// pattern, octet for octet.
type Endpoint struct {
	Seed, PeerSeed uint64
	// Total octets to send; CloseWhenDone sends a FIN after them.
	Total         uint64
	CloseWhenDone bool
	// Hold makes Receive take nothing (to fill the peer's window).
	Hold bool

	Conn        *tcp.Conn
	Sent, Recvd uint64
	Events      []tcp.Event
	Established bool
	PeerClosed  bool
	Closed      bool
	Err         error
	// Corrupt is the first mismatch seen, with its offset.
	Corrupt error
	buf     []byte
}

// Receive checks the octets against the peer's pattern.
func (e *Endpoint) Receive(c *tcp.Conn, b []byte) int {
	if e.Hold {
		return 0
	}
	for i, x := range b {
		if e.Corrupt == nil && x != Pattern(e.PeerSeed, e.Recvd+uint64(i)) {
			e.Corrupt = fmt.Errorf("octet %d: got %#x, want %#x", e.Recvd+uint64(i), x, Pattern(e.PeerSeed, e.Recvd+uint64(i)))
		}
	}
	e.Recvd += uint64(len(b))
	return len(b)
}

// Event records the event and keeps sending.
func (e *Endpoint) Event(c *tcp.Conn, ev tcp.Event) {
	e.Conn = c
	e.Events = append(e.Events, ev)
	switch ev {
	case tcp.EventEstablished, tcp.EventWritable:
		e.Established = true
		e.Pump()
	case tcp.EventReadable:
		if !e.Hold {
			var b [4096]byte
			for {
				n := c.Read(b[:])
				if n == 0 {
					break
				}
				e.Receive(c, b[:n])
			}
		}
	case tcp.EventPeerClosed:
		e.PeerClosed = true
	case tcp.EventClosed:
		e.Closed = true
		e.Err = c.Err()
	}
}

// Pump writes as much of the pattern as the send buffer takes.
func (e *Endpoint) Pump() {
	c := e.Conn
	if c == nil {
		return
	}
	if e.buf == nil {
		e.buf = make([]byte, 64<<10)
	}
	for e.Sent < e.Total {
		k := min(uint64(len(e.buf)), e.Total-e.Sent)
		// Build only what fits; with no space, one octet is enough
		// for the short Write that asks for EventWritable.
		k = min(k, max(uint64(c.SendSpace()), 1))
		FillPattern(e.Seed, e.Sent, e.buf[:k])
		n, err := c.Write(e.buf[:k])
		if err != nil {
			return
		}
		e.Sent += uint64(n)
		if n < int(k) {
			break
		}
	}
	if e.Sent == e.Total && e.CloseWhenDone {
		e.CloseWhenDone = false
		c.Close()
	}
}

// Release stops holding and takes what was buffered.
func (e *Endpoint) Release() {
	e.Hold = false
	e.Event(e.Conn, tcp.EventReadable)
}
