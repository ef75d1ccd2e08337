// Command softrnic-dump decodes the iWARP connections in a pcap file with
// softrnic's own MPA and DDP code and checks them: every TCP stream is
// reassembled, its MPA Request and Reply decoded, and every FPDU after them
// framed, CRC-checked and its DDP/RDMAP header validated. Unlike a
// dissector, it does not depend on how the stream was cut into segments.
//
//	softrnic-dump [-v] [--crc on|off] [-w OUT.pcap] FILE.pcap
//
// With -w it also writes the connections again with each MPA startup frame
// and FPDU in a TCP segment of its own (same octets, new cuts), which
// Wireshark dissects completely even when a middlebox re-chunked the stream
// and its MPA dissector could not reassemble the FPDUs.
//
// It prints one block per connection and exits 1 if any connection has a
// problem (a CRC or marker error, an invalid header, octets missing from the
// capture, a stream closed inside an FPDU), if --crc is given and a
// connection's CRC setting differs, or if the file holds no FPDU at all.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/mpadump"
	"github.com/softrnic/softrnic/mpa"
)

func main() {
	fs := flag.NewFlagSet("softrnic-dump", flag.ExitOnError)
	verbose := fs.Bool("v", false, "also print the private data of the startup frames")
	crc := fs.String("crc", "", "require every MPA connection to have CRC `on` or `off`")
	out := fs.String("w", "", "write the connections re-cut one FPDU per segment to `FILE`")
	var want wanted
	fs.IntVar(&want.rev, "rev", 0, "require every MPA connection to have run MPA revision `N` (Request and Reply)")
	p2p := fs.String("p2p", "", "require every MPA connection to be peer-to-peer with the `RTR` write, read or send (the Reply picks it, the client sends it first), or not peer-to-peer (off)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: softrnic-dump [-v] [--crc on|off] [--rev 1|2] [--p2p write|read|send|off] [-w OUT.pcap] FILE.pcap")
		fs.PrintDefaults()
	}
	fs.Parse(os.Args[1:])
	want.crc = *crc
	var p2pOK bool
	want.rtr, p2pOK = map[string]mpa.RTR{"": 0, "off": 0, "write": mpa.RTRWrite, "read": mpa.RTRRead, "send": mpa.RTRSend}[*p2p]
	want.noP2P = *p2p == "off"
	if fs.NArg() != 1 || (*crc != "" && *crc != "on" && *crc != "off") || (want.rev != 0 && want.rev != 1 && want.rev != 2) || !p2pOK {
		fs.Usage()
		os.Exit(2)
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-dump:", err)
		os.Exit(2)
	}
	defer f.Close()
	rep, err := mpadump.AnalyzeWith(f, mpadump.Options{Keep: *out != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-dump:", err)
		os.Exit(2)
	}
	if *out != "" {
		if err := writeNormalized(rep, *out); err != nil {
			fmt.Fprintln(os.Stderr, "softrnic-dump:", err)
			os.Exit(2)
		}
	}
	if !print(os.Stdout, rep, want, *verbose) {
		os.Exit(1)
	}
}

func writeNormalized(rep *mpadump.Report, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	if err := rep.WriteNormalized(w); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// wanted is what every connection must have negotiated: CRC "on" or
// "off", revision 1 or 2, peer-to-peer with one RTR or not at all; the
// zero values ask nothing.
type wanted struct {
	crc   string
	rev   int
	rtr   mpa.RTR
	noP2P bool
}

// mode is what is wrong with a connection's mode, or "".
func (want wanted) mode(c *mpadump.Conn) string {
	req, rep := c.Request, c.Reply
	if want.rev != 0 && (int(req.Revision) != want.rev || int(rep.Revision) != want.rev) {
		return fmt.Sprintf("MPA revision %d (Request) and %d (Reply), expected %d", req.Revision, rep.Revision, want.rev)
	}
	switch {
	case want.noP2P && (req.PeerToPeer || rep.PeerToPeer):
		return "peer-to-peer, expected not"
	case want.rtr != 0 && (!rep.PeerToPeer || rep.RTR != want.rtr):
		return fmt.Sprintf("Reply peer-to-peer %v with RTR %v, expected peer-to-peer with RTR %v", rep.PeerToPeer, rep.RTR, want.rtr)
	case want.rtr != 0 && c.ToServer.Leading != want.rtr:
		return fmt.Sprintf("the client's first message is not a zero-length %v (RTR)", want.rtr)
	}
	return ""
}

// print writes the report and says whether everything checked out.
func print(w io.Writer, rep *mpadump.Report, want wanted, verbose bool) bool {
	wantCRC := want.crc
	ok := true
	for i, c := range rep.Conns {
		fmt.Fprintf(w, "connection %d: %s -> %s%s\n", i+1, c.Client(), c.Server(), map[bool]string{true: " (reset)"}[c.Reset()])
		if c.Request != nil {
			fmt.Fprintf(w, "  MPA Request: %s\n", frame(c.Request, verbose))
		}
		if c.Reply != nil {
			fmt.Fprintf(w, "  MPA Reply:   %s\n", frame(c.Reply, verbose))
		}
		if c.Request != nil && c.Reply != nil && !c.Reply.Reject {
			fmt.Fprintf(w, "  CRC %s, markers client->server %s, server->client %s\n",
				onOff(c.CRC), onOff(c.ToServer.Markers), onOff(c.ToClient.Markers))
			if wantCRC != "" && onOff(c.CRC) != wantCRC {
				fmt.Fprintf(w, "  PROBLEM: CRC %s, expected %s\n", onOff(c.CRC), wantCRC)
				ok = false
			}
			if r := c.ToServer.Leading; r != 0 && c.Reply.PeerToPeer {
				fmt.Fprintf(w, "  RTR: the client began with a zero-length %v\n", r)
			}
			if p := want.mode(c); p != "" {
				fmt.Fprintf(w, "  PROBLEM: %s\n", p)
				ok = false
			}
		}
		for _, d := range []struct {
			name string
			d    *mpadump.Dir
		}{{"client->server", c.ToServer}, {"server->client", c.ToClient}} {
			fmt.Fprintf(w, "  %s: %d FPDUs, %d ULPDU octets%s\n", d.name, d.d.FPDUs, d.d.Octets, ops(d.d))
			if d.d.Partial {
				fmt.Fprintf(w, "  %s: the capture ends inside an FPDU\n", d.name)
			}
			for _, t := range d.d.Terminates {
				fmt.Fprintf(w, "  %s: Terminate: %v\n", d.name, t)
			}
		}
		if p := c.Problem(); p != "" {
			fmt.Fprintf(w, "  PROBLEM: %s\n", p)
			ok = false
		}
	}
	fmt.Fprintf(w, "%d packets, %d TCP segments, %d connections, %d FPDUs, %d with problems\n",
		rep.Packets, rep.Segments, len(rep.Conns), rep.FPDUs(), rep.Problems())
	if rep.FPDUs() == 0 {
		fmt.Fprintln(w, "PROBLEM: no FPDU in the capture")
		ok = false
	}
	return ok
}

func frame(f *mpa.Frame, verbose bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rev %d", f.Revision)
	for _, x := range []struct {
		on   bool
		name string
	}{{f.Markers, "M"}, {f.CRC, "C"}, {f.Reject, "R"}, {f.Enhanced, "S"}} {
		if x.on {
			b.WriteString(" " + x.name)
		}
	}
	if f.Enhanced {
		fmt.Fprintf(&b, ", IRD %d ORD %d", f.IRD, f.ORD)
		if f.PeerToPeer {
			fmt.Fprintf(&b, ", peer-to-peer RTR %v", f.RTR)
		}
	}
	fmt.Fprintf(&b, ", %d octets of private data", len(f.PrivateData))
	if verbose && len(f.PrivateData) > 0 {
		fmt.Fprintf(&b, " % x", f.PrivateData)
	}
	return b.String()
}

func ops(d *mpadump.Dir) string {
	var parts []string
	for op, n := range d.Ops {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", ddp.Opcode(op), n))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
