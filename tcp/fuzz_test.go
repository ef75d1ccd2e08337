package tcp_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// FuzzInput throws arbitrary segments at an established connection in the
// middle of a transfer. Nothing may panic, and whatever either side
// delivers must still be its peer's stream, octet for octet: every
// injected payload is the true stream content at the sequence number the
// segment claims, so only misplacement could corrupt delivery. The second
// half of each input is also fed raw, as a whole TCP segment with a
// correct checksum, to exercise the header and option parser.
func FuzzInput(f *testing.F) {
	f.Add([]byte{0x10, 0, 10, 0, 0, 0, 100, 4, 0, 0, 50})
	f.Add([]byte{0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x02, 0x7f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x11, 0, 0, 0, 0, 0, 10, 12, 1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x10, 0xff, 0xf0, 0, 1, 0xff, 0xff, 10, 1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 3, 0, 0, 20})
	f.Fuzz(func(t *testing.T, data []byte) {
		o := tcp.Options{SendBuffer: 64 << 10, ReceiveBuffer: 64 << 10, TimeWait: time.Second}
		p := newPair(t, 1, o, plainLink(), plainLink(), 200000, 100000, true)
		p.net.Run(time.Second, func() bool { return p.server.Recvd > 30000 && p.client.Recvd > 30000 })
		srv := p.server.Conn
		cliISS := tcp.IssForTest(p.cconn)
		for rest := data; len(rest) >= 11; {
			flags := rest[0]
			seqOff := int16(binary.BigEndian.Uint16(rest[1:]))
			ackOff := int16(binary.BigEndian.Uint16(rest[3:]))
			wnd := binary.BigEndian.Uint16(rest[5:])
			optLen := int(rest[7]) % 41
			rest = rest[8:]
			if len(rest) < optLen+3 {
				break
			}
			opts := rest[:optLen]
			plen := int(binary.BigEndian.Uint16(rest[optLen:])) % 3000
			rest = rest[optLen+2:]
			seq := tcp.RcvNxtForTest(srv) + tcp.Seq(int32(seqOff))
			ack := tcp.SndNxtForTest(srv) + tcp.Seq(int32(ackOff))
			// The payload is the client's stream at that sequence
			// number (before the stream start: the pattern of a
			// negative offset would be wrong, so such segments carry
			// none).
			var payload []byte
			first := seq // the sequence number of the first data octet
			if flags&header.TCPFlagSYN != 0 {
				first++
			}
			if off := int64(int32(first - cliISS - 1)); off >= 0 {
				payload = make([]byte, plen)
				sim.FillPattern(1, uint64(off), payload)
			}
			b := make([]byte, 20+40+len(payload))
			padded := (optLen + 3) &^ 3
			copy(b[20:], opts)
			header.TCP(b).Encode(&header.TCPFields{SrcPort: p.cconn.ID().LocalPort, DstPort: port, Seq: uint32(seq), Ack: uint32(ack),
				Flags: flags, Window: wnd, OptionsLen: padded})
			copy(b[20+padded:], payload)
			b = b[:20+padded+len(payload)]
			header.TCP(b).SetChecksum(p.net.A.Addr, p.net.B.Addr)
			p.net.B.Stack.Input(p.net.Now, p.net.A.Addr, p.net.B.Addr, b)
			p.net.Step()
		}
		// Raw: the input as a segment of its own.
		if len(data) >= 20 {
			raw := append([]byte(nil), data...)
			binary.BigEndian.PutUint16(raw[0:], p.cconn.ID().LocalPort)
			binary.BigEndian.PutUint16(raw[2:], port)
			header.TCP(raw).SetChecksum(p.net.A.Addr, p.net.B.Addr)
			p.net.B.Stack.Input(p.net.Now, p.net.A.Addr, p.net.B.Addr, raw)
		}
		p.net.Run(time.Minute, func() bool { return p.done(true) })
		p.check(t, "fuzz")
	})
}
