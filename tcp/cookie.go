package tcp

import (
	"github.com/softrnic/softrnic/header"
)

// SYN cookies: when a listener's SYN queue is full, the SYN-ACK carries the
// connection's state in its initial sequence number instead of a queue
// entry, and the final ACK of the handshake rebuilds the connection from
// it. The layout follows the one Linux uses (net/ipv4/syncookies.c):
//
//	ISN = H1(addresses) + peer ISN + (count << 24) + ((H2(addresses, count) + mssIndex) mod 2^24)
//
// where count advances every 64 s and a cookie is good for two counts. The
// options the cookie cannot hold (window scale, SACK-permitted) ride in
// the low 6 bits of our timestamp, which the peer echoes, when the peer
// uses timestamps: the peer's window shift and the SACK-permitted bit. Our
// own shift is a function of the buffer size and is recomputed. Without
// timestamps they are lost, as in Linux.

const (
	cookieBits   = 24
	cookieMask   = 1<<cookieBits - 1
	cookiePeriod = 64e9 // ns per count
	cookieMaxAge = 2
	tsOptBits    = 6
	tsOptMask    = 1<<tsOptBits - 1
	tsWSNone     = 0xf
	tsSACKBit    = 1 << 4
)

// cookieMSS are the MSS values a cookie can name (Linux's msstab).
var cookieMSS = [...]uint16{536, 1300, 1440, 1460}

func (s *Stack) cookieHash(id FourTuple, count uint32, salt uint32) uint32 {
	h := s.hash32(id, salt)
	return s.hash32(FourTuple{LocalAddr: id.LocalAddr, RemoteAddr: id.RemoteAddr, LocalPort: uint16(count), RemotePort: uint16(count >> 16)}, h)
}

func (s *Stack) makeCookie(now Time, id FourTuple, peerISN Seq, mssIdx uint32) Seq {
	count := uint32(int64(now) / cookiePeriod)
	return Seq(s.hash32(id, 0x636b) + uint32(peerISN) + count<<cookieBits +
		(s.cookieHash(id, count, 0x6332)+mssIdx)&cookieMask)
}

// checkCookie returns the MSS index a cookie carries, or false.
func (s *Stack) checkCookie(now Time, id FourTuple, peerISN, cookie Seq) (uint32, bool) {
	count := uint32(int64(now) / cookiePeriod)
	v := uint32(cookie) - s.hash32(id, 0x636b) - uint32(peerISN)
	then := v >> cookieBits
	age := (count - then) & (1<<(32-cookieBits) - 1)
	if age >= cookieMaxAge {
		return 0, false
	}
	idx := (v - s.cookieHash(id, count-age, 0x6332)) & cookieMask
	if idx >= uint32(len(cookieMSS)) {
		return 0, false
	}
	return idx, true
}

// sendCookie answers a SYN with a stateless SYN-ACK.
func (l *Listener) sendCookie(now Time, id FourTuple, seg *Segment) {
	s := l.s
	ours := uint16(mssFor(s.opts.MTU, id.LocalAddr.Is6() && !id.LocalAddr.Is4In6()))
	peer := uint16(536)
	if seg.Opts.HasMSS {
		peer = seg.Opts.MSS
	}
	mss := min(ours, peer)
	idx := uint32(0)
	for i, m := range cookieMSS {
		if m <= mss {
			idx = uint32(i)
		}
	}
	cs := ctlSegment{
		id:    id,
		seq:   s.makeCookie(now, id, seg.Seq, idx),
		ack:   seg.Seq + 1,
		flags: header.TCPFlagSYN | header.TCPFlagACK,
		wnd:   uint16(min(s.opts.ReceiveBuffer, 65535)),
	}
	cs.opts.MSS, cs.opts.HasMSS = cookieMSS[idx], true
	if seg.Opts.HasTimestamp && !s.opts.DisableTimestamps {
		ws := uint32(tsWSNone)
		if seg.Opts.HasWindowScale && !s.opts.DisableWindowScale {
			cs.opts.WindowScale, cs.opts.HasWindowScale = rcvScale(s.opts.ReceiveBuffer), true
			ws = uint32(min(seg.Opts.WindowScale, 14))
		}
		if seg.Opts.SACKPermitted && !s.opts.DisableSACK {
			cs.opts.SACKPermitted = true
			ws |= tsSACKBit
		}
		ts := uint32(int64(now)/1e6) + s.hash32(id, 0x7473)
		v := ts&^tsOptMask | ws
		if int32(v-ts) > 0 {
			v -= 1 << tsOptBits
		}
		cs.opts.HasTimestamp, cs.opts.TSVal, cs.opts.TSEcr = true, v, seg.Opts.TSVal
	}
	s.queueCtl(cs)
	s.Stats.SYNCookiesSent++
}

// cookieConn rebuilds a connection from the ACK that answers a cookie.
func (l *Listener) cookieConn(now Time, id FourTuple, seg *Segment) *Conn {
	s := l.s
	if l.s.Stats.SYNCookiesSent == 0 {
		return nil
	}
	idx, ok := s.checkCookie(now, id, seg.Seq-1, seg.Ack-1)
	if !ok {
		s.Stats.SYNCookiesFailed++
		return nil
	}
	if len(l.accept) >= s.opts.AcceptBacklog {
		s.Stats.AcceptQueueDrops++
		return nil
	}
	s.Stats.SYNCookiesValid++
	c := s.newConn(now, id, l.h)
	c.iss = seg.Ack - 1
	c.sndUna, c.sndNxt, c.sndMax = c.iss, c.iss+1, c.iss+1
	c.snd.start = c.iss + 1
	c.irs = seg.Seq - 1
	c.rcv.start = seg.Seq
	c.rcvAdv = c.rcv.start.Add(min(s.opts.ReceiveBuffer, 65535))
	var o header.TCPOptions
	o.MSS, o.HasMSS = cookieMSS[idx], true
	if seg.Opts.HasTimestamp && !s.opts.DisableTimestamps {
		bits := seg.Opts.TSEcr & tsOptMask
		o.HasTimestamp, o.TSVal = true, seg.Opts.TSVal
		if ws := bits & 0xf; ws != tsWSNone {
			o.HasWindowScale, o.WindowScale = true, uint8(ws)
		}
		o.SACKPermitted = bits&tsSACKBit != 0
	}
	c.negotiate(now, &o)
	if o.HasWindowScale {
		c.rcvWS = rcvScale(s.opts.ReceiveBuffer) // what the SYN-ACK offered
	}
	c.listener = l
	c.state = StateSynRcvd
	l.synCount++
	s.add(c)
	return c
}

// rcvScale is the window scale for a receive buffer (RFC 7323 §2.3).
func rcvScale(buf int) uint8 {
	var ws uint8
	for buf>>ws > 65535 && ws < 14 {
		ws++
	}
	return ws
}
