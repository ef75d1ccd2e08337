// Package pcap reads the classic capture files tcpdump writes and decodes
// their TCP segments, for tools that check what went on the wire without
// depending on a dissector's heuristics. It is not on any datapath.
package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/softrnic/softrnic/header"
)

// Link-layer header types (www.tcpdump.org/linktypes.html) the decoder knows.
const (
	LinkEthernet  = 1
	LinkRaw       = 101
	LinkLinuxSLL  = 113
	LinkIPv4      = 228
	LinkIPv6      = 229
	LinkLinuxSLL2 = 276
)

const (
	magicMicro = 0xa1b2c3d4
	magicNano  = 0xa1b23c4d
	// Record sizes beyond this are a corrupt file, not a packet.
	maxRecord = 1 << 20
)

// ErrPcapNG is returned for pcapng files: write classic pcap (tcpdump -w
// does) or convert with editcap -F pcap.
var ErrPcapNG = errors.New("pcap: pcapng file; convert it with editcap -F pcap")

// Reader reads packets from a classic pcap file.
type Reader struct {
	r        *bufio.Reader
	order    binary.ByteOrder
	LinkType uint32
	nano     bool
	buf      []byte
	hdr      [16]byte
}

// Packet is one captured record. Data aliases the Reader's buffer until the
// next call to Next.
type Packet struct {
	// Seconds and Nanos: the capture time.
	Seconds, Nanos uint32
	// Data is what was captured; OrigLen what was on the wire. Truncated
	// when they differ.
	Data    []byte
	OrigLen int
}

// NewReader reads the file header.
func NewReader(r io.Reader) (*Reader, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var h [24]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return nil, fmt.Errorf("pcap: file header: %w", err)
	}
	rd := &Reader{r: br}
	switch {
	case binary.LittleEndian.Uint32(h[:]) == 0x0a0d0d0a:
		return nil, ErrPcapNG
	case binary.LittleEndian.Uint32(h[:]) == magicMicro:
		rd.order = binary.LittleEndian
	case binary.BigEndian.Uint32(h[:]) == magicMicro:
		rd.order = binary.BigEndian
	case binary.LittleEndian.Uint32(h[:]) == magicNano:
		rd.order, rd.nano = binary.LittleEndian, true
	case binary.BigEndian.Uint32(h[:]) == magicNano:
		rd.order, rd.nano = binary.BigEndian, true
	default:
		return nil, fmt.Errorf("pcap: not a pcap file (magic %#x)", binary.BigEndian.Uint32(h[:]))
	}
	// The upper bits of the link type field carry FCS information.
	rd.LinkType = rd.order.Uint32(h[20:]) & 0x0fffffff
	return rd, nil
}

// Next returns the next packet, or io.EOF after the last.
func (r *Reader) Next() (Packet, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			err = fmt.Errorf("pcap: truncated record header: %w", err)
		}
		return Packet{}, err
	}
	p := Packet{Seconds: r.order.Uint32(r.hdr[0:]), Nanos: r.order.Uint32(r.hdr[4:])}
	if !r.nano {
		p.Nanos *= 1000
	}
	n := r.order.Uint32(r.hdr[8:])
	p.OrigLen = int(r.order.Uint32(r.hdr[12:]))
	if n > maxRecord {
		return Packet{}, fmt.Errorf("pcap: record of %d octets: corrupt file", n)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	r.buf = r.buf[:n]
	if _, err := io.ReadFull(r.r, r.buf); err != nil {
		return Packet{}, fmt.Errorf("pcap: truncated record: %w", io.ErrUnexpectedEOF)
	}
	p.Data = r.buf
	return p, nil
}

// Segment is a decoded TCP segment. Payload aliases the packet.
type Segment struct {
	Src, Dst netip.AddrPort
	Seq, Ack uint32
	Flags    uint8
	Window   uint16
	Payload  []byte
	// Truncated: the capture holds less of the payload than was sent.
	Truncated bool
}

// TCP flags, as the header package names them.
const (
	FlagFIN = header.TCPFlagFIN
	FlagSYN = header.TCPFlagSYN
	FlagRST = header.TCPFlagRST
	FlagPSH = header.TCPFlagPSH
	FlagACK = header.TCPFlagACK
)

// ErrNotTCP says the packet is not an unfragmented TCP segment over IP.
var ErrNotTCP = errors.New("pcap: not a TCP segment")

// DecodeTCP finds the TCP segment in a packet of the given link type.
// Packets that are not TCP give ErrNotTCP; malformed ones another error.
func DecodeTCP(link uint32, p Packet) (Segment, error) {
	b := p.Data
	var ethertype uint16
	switch link {
	case LinkEthernet:
		e := header.Ethernet(b)
		if !e.IsValid() {
			return Segment{}, errors.New("pcap: short Ethernet header")
		}
		ethertype, b = e.Type(), e.Payload()
		for ethertype == 0x8100 || ethertype == 0x88a8 { // VLAN tags
			if len(b) < 4 {
				return Segment{}, errors.New("pcap: short VLAN tag")
			}
			ethertype, b = binary.BigEndian.Uint16(b[2:]), b[4:]
		}
	case LinkLinuxSLL:
		if len(b) < 16 {
			return Segment{}, errors.New("pcap: short SLL header")
		}
		ethertype, b = binary.BigEndian.Uint16(b[14:]), b[16:]
	case LinkLinuxSLL2:
		if len(b) < 20 {
			return Segment{}, errors.New("pcap: short SLL2 header")
		}
		ethertype, b = binary.BigEndian.Uint16(b[0:]), b[20:]
	case LinkRaw, LinkIPv4, LinkIPv6:
		if len(b) == 0 {
			return Segment{}, errors.New("pcap: empty packet")
		}
		ethertype = header.EtherTypeIPv4
		if b[0]>>4 == header.IPv6Version {
			ethertype = header.EtherTypeIPv6
		}
	default:
		return Segment{}, fmt.Errorf("pcap: link type %d not supported", link)
	}
	// How much of the IP packet was cut off by the snap length.
	short := p.OrigLen - len(p.Data)
	var src, dst netip.Addr
	switch ethertype {
	case header.EtherTypeIPv4:
		// Not ip.IsValid: the snap length may have cut the datagram
		// short of its Total Length.
		ip := header.IPv4(b)
		if len(b) < header.IPv4MinLen || ip.Version() != header.IPv4Version {
			return Segment{}, errors.New("pcap: bad IPv4 header")
		}
		ihl, total := ip.HeaderLen(), ip.TotalLen()
		if ihl < header.IPv4MinLen || total < ihl || len(b)+short < total {
			return Segment{}, errors.New("pcap: bad IPv4 lengths")
		}
		if ip.Protocol() != header.IPProtocolTCP {
			return Segment{}, ErrNotTCP
		}
		if ip.IsFragment() {
			return Segment{}, errors.New("pcap: fragmented IPv4 packet (reassembly not supported)")
		}
		src, dst = ip.Src(), ip.Dst()
		short = total - min(total, len(b)) // Ethernet padding trimmed below
		b = b[ihl:min(total, len(b))]
	case header.EtherTypeIPv6:
		ip := header.IPv6(b)
		if len(b) < header.IPv6Len || b[0]>>4 != header.IPv6Version {
			return Segment{}, errors.New("pcap: bad IPv6 header")
		}
		end := header.IPv6Len + ip.PayloadLen()
		next := ip.NextHeader()
		src, dst = ip.Src(), ip.Dst()
		short = end - min(end, len(b))
		b = b[header.IPv6Len:min(end, len(b))]
		for next != header.IPProtocolTCP {
			switch next {
			case 0, 43, 60: // hop-by-hop, routing, destination options
				if len(b) < 8 || len(b) < 8+int(b[1])*8 {
					return Segment{}, errors.New("pcap: bad IPv6 extension header")
				}
				next, b = b[0], b[8+int(b[1])*8:]
			case 44:
				return Segment{}, errors.New("pcap: fragmented IPv6 packet (reassembly not supported)")
			default:
				return Segment{}, ErrNotTCP
			}
		}
	default:
		return Segment{}, ErrNotTCP
	}
	t := header.TCP(b)
	if !t.IsValid(len(b)) {
		return Segment{}, errors.New("pcap: bad TCP header")
	}
	return Segment{
		Src:       netip.AddrPortFrom(src, t.SrcPort()),
		Dst:       netip.AddrPortFrom(dst, t.DstPort()),
		Seq:       t.Seq(),
		Ack:       t.Ack(),
		Flags:     t.Flags(),
		Window:    t.Window(),
		Payload:   t.Payload(),
		Truncated: short > 0,
	}, nil
}
