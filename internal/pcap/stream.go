package pcap

import (
	"fmt"
	"net/netip"
	"sort"
)

// Conn is one TCP connection seen in a capture, with its two byte streams
// reassembled from the segments in sequence order.
type Conn struct {
	// Client sent the first SYN; Server answered it. When the handshake
	// was not captured, Client is the sender of the first segment seen.
	Client, Server netip.AddrPort
	// Handshake: the SYN of each direction was captured, so both streams
	// are known from their first octet.
	Handshake bool
	// ToServer and ToClient are the two directions.
	ToServer, ToClient *Stream
	// Reset: a RST was seen.
	Reset bool
}

// Stream is one direction of a connection. Its consumer gets the octets in
// order, exactly once, as the segments that carry them are added.
type Stream struct {
	// Deliver receives in-order octets; the slice is only valid during
	// the call. Set it before the first segment is added.
	Deliver func([]byte)

	synSeen bool
	base    uint32 // sequence number of stream offset 0
	next    uint64 // next stream offset expected
	// Out-of-order octets, by stream offset, copied.
	pending map[uint64][]byte
	finSeen bool
	finOff  uint64
	// Errors that make the stream incomplete.
	truncated, beforeSYN int
	// Octets that arrived again after their first copy.
	retransmitted uint64
}

// Delivered is the number of octets handed to Deliver.
func (s *Stream) Delivered() uint64 { return s.next }

// Closed: the FIN was captured and every octet before it delivered.
func (s *Stream) Closed() bool { return s.finSeen && s.next == s.finOff && len(s.pending) == 0 }

// Retransmitted is the number of octets that arrived more than once.
func (s *Stream) Retransmitted() uint64 { return s.retransmitted }

// Problem describes why the stream cannot be trusted to be complete, or
// returns "" when every octet it carried was captured.
func (s *Stream) Problem() string {
	switch {
	case !s.synSeen && s.beforeSYN > 0:
		return fmt.Sprintf("%d segments before any SYN: the capture started mid-connection", s.beforeSYN)
	case s.truncated > 0:
		return fmt.Sprintf("%d segments truncated by the capture's snap length", s.truncated)
	case len(s.pending) > 0:
		offs := make([]uint64, 0, len(s.pending))
		for o := range s.pending {
			offs = append(offs, o)
		}
		sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
		return fmt.Sprintf("octets %d..%d missing from the capture", s.next, offs[0])
	case s.finSeen && s.next < s.finOff:
		return fmt.Sprintf("octets %d..%d before the FIN missing from the capture", s.next, s.finOff)
	}
	return ""
}

// add takes one segment of this direction.
func (s *Stream) add(seg *Segment) {
	seq := seg.Seq
	if seg.Flags&FlagSYN != 0 {
		if !s.synSeen {
			s.synSeen, s.base = true, seq+1
		}
		seq++ // data on a SYN starts after it
	}
	if !s.synSeen {
		// Only data matters: a bare RST refusing a SYN has no SYN of its own.
		if len(seg.Payload) > 0 || seg.Flags&FlagFIN != 0 {
			s.beforeSYN++
		}
		return
	}
	if seg.Truncated {
		s.truncated++
		return
	}
	// Stream offset, taken relative to the next expected octet so that
	// sequence numbers may wrap any number of times.
	off := int64(s.next) + int64(int32(seq-s.base-uint32(s.next)))
	data := seg.Payload
	if seg.Flags&FlagFIN != 0 && off >= 0 {
		s.finSeen, s.finOff = true, uint64(off)+uint64(len(data))
	}
	if off < 0 || len(data) == 0 {
		return
	}
	s.place(uint64(off), data)
}

func (s *Stream) place(off uint64, data []byte) {
	if end := off + uint64(len(data)); end <= s.next {
		s.retransmitted += uint64(len(data))
		return
	}
	if off < s.next {
		s.retransmitted += s.next - off
		data = data[s.next-off:]
		off = s.next
	}
	if off > s.next {
		if s.pending == nil {
			s.pending = make(map[uint64][]byte)
		}
		if old, ok := s.pending[off]; !ok || len(old) < len(data) {
			s.pending[off] = append([]byte(nil), data...)
		}
		return
	}
	s.deliver(data)
	for len(s.pending) > 0 {
		progressed := false
		for o, d := range s.pending {
			if o > s.next {
				continue
			}
			delete(s.pending, o)
			progressed = true
			if end := o + uint64(len(d)); end > s.next {
				s.retransmitted += s.next - o
				s.deliver(d[s.next-o:])
			} else {
				s.retransmitted += uint64(len(d))
			}
		}
		if !progressed {
			break
		}
	}
}

func (s *Stream) deliver(b []byte) {
	if len(b) == 0 {
		return
	}
	s.next += uint64(len(b))
	if s.Deliver != nil {
		s.Deliver(b)
	}
}

type connKey struct{ a, b netip.AddrPort }

// Assembler sorts segments into connections.
type Assembler struct {
	conns map[connKey]*Conn
	order []*Conn
	// NewConn is called for each new connection before its first segment
	// is added, to set the streams' Deliver functions.
	NewConn func(*Conn)
}

// Add takes the next segment of the capture, in capture order.
func (a *Assembler) Add(seg *Segment) {
	k := connKey{seg.Src, seg.Dst}
	c := a.conns[k]
	if c == nil {
		c = a.conns[connKey{seg.Dst, seg.Src}]
	}
	// A new SYN (no ACK) on a closed connection's 4-tuple starts a new one.
	if c != nil && seg.Flags&(FlagSYN|FlagACK) == FlagSYN && seg.Src == c.Client && c.ToServer.synSeen && seg.Seq+1 != c.ToServer.base {
		delete(a.conns, connKey{c.Client, c.Server})
		c = nil
	}
	if c == nil {
		c = &Conn{Client: seg.Src, Server: seg.Dst, ToServer: &Stream{}, ToClient: &Stream{}}
		// A SYN-ACK seen first means the SYN was missed; the SYN-ACK's
		// sender is the server.
		if seg.Flags&(FlagSYN|FlagACK) == FlagSYN|FlagACK {
			c.Client, c.Server = seg.Dst, seg.Src
		}
		if a.conns == nil {
			a.conns = make(map[connKey]*Conn)
		}
		a.conns[connKey{c.Client, c.Server}] = c
		a.order = append(a.order, c)
		if a.NewConn != nil {
			a.NewConn(c)
		}
	}
	if seg.Flags&FlagRST != 0 {
		c.Reset = true
	}
	st := c.ToServer
	if seg.Src == c.Server {
		st = c.ToClient
	}
	st.add(seg)
	c.Handshake = c.ToServer.synSeen && c.ToClient.synSeen
}

// Conns returns the connections in the order their first segment appeared.
func (a *Assembler) Conns() []*Conn { return a.order }
