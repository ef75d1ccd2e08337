// Package mpadump decodes the iWARP traffic in a packet capture with the
// project's own MPA and DDP code: each TCP stream is reassembled, its MPA
// startup frames decoded, and every FPDU after them framed, CRC-checked and
// its DDP/RDMAP header checked. It does not rely on a dissector's
// heuristics, so it sees every FPDU however the stream was segmented.
package mpadump

import (
	"errors"
	"fmt"
	"io"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/pcap"
	"github.com/softrnic/softrnic/mpa"
)

// Report is what a capture holds.
type Report struct {
	Conns []*Conn
	keep  bool
	// Packets read and TCP segments among them.
	Packets, Segments int
}

// Problems counts the connections with a problem.
func (r *Report) Problems() int {
	n := 0
	for _, c := range r.Conns {
		if c.Problem() != "" {
			n++
		}
	}
	return n
}

// FPDUs is the number of FPDUs in the whole capture.
func (r *Report) FPDUs() int {
	n := 0
	for _, c := range r.Conns {
		n += c.ToServer.FPDUs + c.ToClient.FPDUs
	}
	return n
}

// Conn is one TCP connection.
type Conn struct {
	tcp *pcap.Conn
	rep *Report
	// first is the number of the packet that opened the connection.
	first int
	// Request and Reply are the MPA startup frames, nil until seen.
	Request, Reply *mpa.Frame
	// CRC: FPDUs carry a CRC (either side asked, RFC 5044 §7.1.2).
	CRC bool
	// ToServer and ToClient are the two FPDU streams.
	ToServer, ToClient *Dir
}

// Dir is one direction of a connection.
type Dir struct {
	// Markers: FPDUs in this direction carry markers (the receiver's
	// startup frame set M).
	Markers bool
	// FPDUs and ULPDU octets decoded; Ops counts them by RDMAP opcode.
	FPDUs  int
	Octets uint64
	Ops    [16]int
	// Terminates are the causes of the Terminate messages sent.
	Terminates []ddp.TerminateError
	// Leading is the first message in this direction, if it is one a
	// peer-to-peer initiator sends as RTR (RFC 6581 §9.2): a
	// zero-length Send, RDMA Write or RDMA Read; else 0.
	Leading mpa.RTR
	// Err is the first thing wrong with the stream: a bad frame, a CRC or
	// marker error, an invalid DDP header. Nothing after it is decoded.
	Err error
	// Partial: the capture ends inside an FPDU.
	Partial bool

	reply    bool
	frameLen int
	// With Options.Keep: every octet delivered, and where each startup
	// frame or FPDU ends in it with the packet that completed it.
	kept  []byte
	units []unit

	frame  *mpa.Frame
	tcp    *pcap.Stream
	held   []byte // octets waiting for the startup frames
	parser *mpa.Parser
	ulpdu  []byte
	conn   *Conn
}

// Retransmitted is the number of octets of this direction that the
// capture holds more than once (TCP retransmissions).
func (d *Dir) Retransmitted() uint64 { return d.tcp.Retransmitted() }

type unit struct {
	end    uint64
	packet int
}

// Client, Server and Reset describe the TCP connection.
func (c *Conn) Client() string { return c.tcp.Client.String() }

// Server is the passive side's address.
func (c *Conn) Server() string { return c.tcp.Server.String() }

// Reset: a TCP RST was seen.
func (c *Conn) Reset() bool { return c.tcp.Reset }

// Problem says what is wrong with the connection, or "".
func (c *Conn) Problem() string {
	for _, d := range []*Dir{c.ToServer, c.ToClient} {
		name := "client->server"
		if d == c.ToClient {
			name = "server->client"
		}
		switch {
		case d.Err != nil:
			return fmt.Sprintf("%s: %v", name, d.Err)
		case d.tcp.Problem() != "":
			return fmt.Sprintf("%s: %s", name, d.tcp.Problem())
		case d.Partial && d.tcp.Closed():
			return fmt.Sprintf("%s: FIN inside an FPDU", name)
		case len(d.held) > 0 && d.frame == nil && d.tcp.Closed():
			return fmt.Sprintf("%s: %d octets that do not complete an MPA startup frame", name, len(d.held))
		case len(d.held) > 0 && d.tcp.Closed():
			return fmt.Sprintf("%s: %d octets after the startup frame, but the other side's frame never came", name, len(d.held))
		}
	}
	return ""
}

// Options change what Analyze keeps.
type Options struct {
	// Keep holds every stream in memory so that WriteNormalized can
	// write them out again.
	Keep bool
}

// Analyze reads a pcap file and decodes every TCP connection in it.
func Analyze(r io.Reader) (*Report, error) { return AnalyzeWith(r, Options{}) }

// AnalyzeWith is Analyze with options.
func AnalyzeWith(r io.Reader, o Options) (*Report, error) {
	rd, err := pcap.NewReader(r)
	if err != nil {
		return nil, err
	}
	rep := &Report{keep: o.Keep}
	asm := &pcap.Assembler{NewConn: func(tc *pcap.Conn) {
		c := &Conn{tcp: tc, rep: rep, first: rep.Packets}
		c.ToServer = &Dir{conn: c, tcp: tc.ToServer}
		c.ToClient = &Dir{conn: c, tcp: tc.ToClient, reply: true}
		tc.ToServer.Deliver = c.ToServer.feed
		tc.ToClient.Deliver = c.ToClient.feed
		rep.Conns = append(rep.Conns, c)
	}}
	for {
		p, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return rep, err
		}
		rep.Packets++
		seg, err := pcap.DecodeTCP(rd.LinkType, p)
		if errors.Is(err, pcap.ErrNotTCP) {
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("packet %d: %w", rep.Packets, err)
		}
		rep.Segments++
		asm.Add(&seg)
	}
	for _, c := range rep.Conns {
		c.ToServer.finish()
		c.ToClient.finish()
	}
	return rep, nil
}

// feed takes in-order stream octets.
func (d *Dir) feed(b []byte) {
	if d.conn.rep.keep {
		d.kept = append(d.kept, b...)
	}
	if d.Err != nil {
		return
	}
	if d.parser == nil {
		d.held = append(d.held, b...)
		d.startup()
		return
	}
	d.parse(b)
}

// startup decodes this direction's startup frame, then, once both frames
// are known, starts FPDU parsing in both directions.
func (d *Dir) startup() {
	c := d.conn
	if d.frame == nil {
		f, n, err := mpa.ParseFrame(d.held, d.reply)
		if errors.Is(err, mpa.ErrShortFrame) {
			return
		}
		if err != nil {
			d.Err = err
			return
		}
		f.PrivateData = append([]byte(nil), f.PrivateData...)
		d.frame = &f
		d.frameLen = n
		d.mark(uint64(n))
		d.held = d.held[n:]
		if d.reply {
			c.Reply = &f
		} else {
			c.Request = &f
		}
	}
	if c.Request == nil || c.Reply == nil {
		return
	}
	if c.Reply.Reject {
		for _, x := range []*Dir{c.ToServer, c.ToClient} {
			if x.frame != nil && len(x.held) > 0 && x.Err == nil {
				x.Err = fmt.Errorf("%d octets after a rejecting MPA Reply", len(x.held))
			}
		}
		return
	}
	// RFC 5044 §7.1.2: CRC if either asks; each side's M asks for
	// markers in what it receives.
	c.CRC = c.Request.CRC || c.Reply.CRC
	c.ToServer.Markers = c.Reply.Markers
	c.ToClient.Markers = c.Request.Markers
	for _, x := range []*Dir{c.ToServer, c.ToClient} {
		if x.parser != nil || x.frame == nil {
			continue
		}
		x.parser = mpa.NewParser(c.CRC, x.Markers)
		held := x.held
		x.held = nil
		x.parse(held)
	}
}

func (d *Dir) parse(b []byte) {
	if d.conn.Reply.Reject {
		if d.Err == nil && len(b) > 0 {
			d.Err = fmt.Errorf("%d octets after a rejecting MPA Reply", len(b))
		}
		return
	}
	for len(b) > 0 && d.Err == nil {
		n, ev, err := d.parser.Next(b)
		b = b[n:]
		if err != nil {
			d.Err = fmt.Errorf("FPDU %d: %w", d.FPDUs+1, err)
			return
		}
		if ev.Kind != mpa.Data {
			continue
		}
		d.ulpdu = append(d.ulpdu, ev.Data...)
		if ev.End {
			d.mark(uint64(d.frameLen) + d.parser.Offset())
			d.segment(d.ulpdu)
			d.ulpdu = d.ulpdu[:0]
		}
	}
}

// mark records the end of a startup frame or FPDU at stream offset end.
func (d *Dir) mark(end uint64) {
	if d.conn.rep.keep {
		d.units = append(d.units, unit{end: end, packet: d.conn.rep.Packets})
	}
}

// segment checks one ULPDU as a receiver would.
func (d *Dir) segment(u []byte) {
	d.FPDUs++
	d.Octets += uint64(len(u))
	// RFC 5044 §7.1.2: a zero-length FPDU is the peer-to-peer ready to
	// receive indication only when negotiated; otherwise, and any other
	// ULPDU, it must be a valid DDP segment.
	seg, err := ddp.ParseSegment(u)
	if err != nil {
		d.Err = fmt.Errorf("FPDU %d (%d octets): invalid DDP segment: %w", d.FPDUs, len(u), err)
		return
	}
	op := seg.Opcode()
	if d.FPDUs == 1 {
		d.Leading = leadingRTR(&seg)
	}
	d.Ops[op]++
	if op == ddp.OpTerminate {
		t := ddp.Terminate(seg.Body)
		if !t.IsValid() {
			d.Err = fmt.Errorf("FPDU %d: Terminate body of %d octets is invalid", d.FPDUs, len(seg.Body))
			return
		}
		d.Terminates = append(d.Terminates, t.Cause())
	}
}

// leadingRTR is the RTR a segment would be as the first of its direction.
func leadingRTR(seg *ddp.Segment) mpa.RTR {
	if !seg.Header.Last() {
		return 0
	}
	switch seg.Opcode() {
	case ddp.OpSend:
		if len(seg.Payload) == 0 {
			return mpa.RTRSend
		}
	case ddp.OpWrite:
		if len(seg.Payload) == 0 {
			return mpa.RTRWrite
		}
	case ddp.OpReadRequest:
		if ddp.ReadRequest(seg.Body).Size() == 0 {
			return mpa.RTRRead
		}
	}
	return 0
}

// finish notes an FPDU the capture ends inside.
func (d *Dir) finish() {
	d.Partial = d.parser != nil && d.Err == nil && d.parser.Incomplete()
}
