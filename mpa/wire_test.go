package mpa_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/mpadump"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/internal/tshark"
	"github.com/softrnic/softrnic/mpa"
)

// An FPDU a test session sends, with the fields Wireshark must find in it.
type fpdu struct {
	ulpdu  []byte
	want   map[string]uint64
	badCRC bool
}

func tagged(op ddp.Opcode, last bool, stag uint32, to uint64, payload []byte) fpdu {
	b := make([]byte, ddp.TaggedHeaderLen, ddp.TaggedHeaderLen+len(payload))
	ddp.Tagged(b).Encode(&ddp.TaggedFields{Last: last, Opcode: op, STag: stag, TO: to})
	return fpdu{ulpdu: append(b, payload...), want: map[string]uint64{
		"iwarp_rdma.opcode": uint64(op), "iwarp_ddp.tagged_flag": 1, "iwarp_ddp.last_flag": b2u(last),
		"iwarp_ddp.dv": 1, "iwarp_rdma.version": 1,
		"iwarp_ddp.stag": uint64(stag), "iwarp_ddp.tagged_offset": to,
		"iwarp_mpa.ulpdulength": uint64(len(b) + len(payload)),
	}}
}

func untagged(op ddp.Opcode, msn ddp.MSN, mo, inv uint32, body []byte) fpdu {
	info := op.Info()
	b := make([]byte, ddp.UntaggedHeaderLen, ddp.UntaggedHeaderLen+len(body))
	ddp.Untagged(b).Encode(&ddp.UntaggedFields{Last: true, Opcode: op, InvalidateSTag: inv, QN: info.QN, MSN: msn, MO: mo})
	f := fpdu{ulpdu: append(b, body...), want: map[string]uint64{
		"iwarp_rdma.opcode": uint64(op), "iwarp_ddp.tagged_flag": 0, "iwarp_ddp.last_flag": 1,
		"iwarp_ddp.dv": 1, "iwarp_rdma.version": 1,
		"iwarp_ddp.qn": uint64(info.QN), "iwarp_ddp.msn": uint64(msn), "iwarp_ddp.mo": uint64(mo),
		"iwarp_mpa.ulpdulength": uint64(len(b) + len(body)),
	}}
	if info.Invalidate {
		f.want["iwarp_rdma.inval_stag"] = uint64(inv)
	}
	return f
}

func readRequest(msn ddp.MSN, r ddp.ReadRequestFields) fpdu {
	body := make([]byte, ddp.ReadRequestLen)
	ddp.ReadRequest(body).Encode(&r)
	f := untagged(ddp.OpReadRequest, msn, 0, 0, body)
	f.want["iwarp_rdma.sinkstag"] = uint64(r.SinkSTag)
	f.want["iwarp_rdma.sinkto"] = r.SinkTO
	f.want["iwarp_rdma.rdmardsz"] = uint64(r.Size)
	f.want["iwarp_rdma.srcstag"] = uint64(r.SrcSTag)
	f.want["iwarp_rdma.srcto"] = r.SrcTO
	return f
}

func atomicRequest(msn ddp.MSN, r ddp.AtomicRequestFields) fpdu {
	body := make([]byte, ddp.AtomicRequestLen)
	ddp.AtomicRequest(body).Encode(&r)
	f := untagged(ddp.OpAtomicRequest, msn, 0, 0, body)
	f.want["iwarp_rdma.atomic.opcode"] = uint64(r.Op)
	f.want["iwarp_rdma.atomic.request_identifier"] = uint64(r.RequestID)
	f.want["iwarp_rdma.atomic.remote_stag"] = uint64(r.RemoteSTag)
	f.want["iwarp_rdma.atomic.remote_tagged_offset"] = r.RemoteTO
	f.want["iwarp_rdma.atomic.compare_data"] = r.CompareData
	f.want["iwarp_rdma.atomic.compare_mask"] = r.CompareMask
	if r.Op == ddp.AtomicFetchAdd {
		f.want["iwarp_rdma.atomic.add_data"] = r.AddSwapData
		f.want["iwarp_rdma.atomic.add_mask"] = r.AddSwapMask
	} else {
		f.want["iwarp_rdma.atomic.swap_data"] = r.AddSwapData
		f.want["iwarp_rdma.atomic.swap_mask"] = r.AddSwapMask
	}
	return f
}

func atomicResponse(msn ddp.MSN, id uint32, v uint64) fpdu {
	body := make([]byte, ddp.AtomicResponseLen)
	ddp.AtomicResponse(body).Encode(id, v)
	f := untagged(ddp.OpAtomicResponse, msn, 0, 0, body)
	f.want["iwarp_rdma.atomic.original_request_identifier"] = uint64(id)
	f.want["iwarp_rdma.atomic.original_remote_data_value"] = v
	return f
}

func terminate(f ddp.TerminateFields) fpdu {
	body := make([]byte, f.Len())
	ddp.Terminate(body).Encode(&f)
	m := untagged(ddp.OpTerminate, 1, 0, 0, body)
	m.want["iwarp_rdma.term_layer"] = uint64(f.Error.Layer)
	m.want["iwarp_rdma.term_hdrct_m"] = b2u(f.SegmentLenValid)
	m.want["iwarp_rdma.hdrct_d"] = b2u(f.DDPHeader != nil)
	m.want["iwarp_rdma.hdrct_r"] = b2u(f.RDMAPHeader != nil)
	switch f.Error.Layer {
	case ddp.LayerRDMAP:
		m.want["iwarp_rdma.term_etype_rdma"] = uint64(f.Error.Type)
		m.want["iwarp_rdma.term_errcode_rdma"] = uint64(f.Error.Code)
	case ddp.LayerDDP:
		m.want["iwarp_rdma.term_etype_ddp"] = uint64(f.Error.Type)
		if f.Error.Type == 1 {
			m.want["iwarp_rdma.term_errcode_ddp_tagged"] = uint64(f.Error.Code)
		} else {
			m.want["iwarp_rdma.term_errcode_ddp_untagged"] = uint64(f.Error.Code)
		}
	case ddp.LayerLLP:
		m.want["iwarp_rdma.term_etype_llp"] = uint64(f.Error.Type)
		m.want["iwarp_rdma.term_errcode_llp"] = uint64(f.Error.Code)
	}
	if f.DDPHeader != nil {
		m.want["iwarp_rdma.term_ddp_seg_len"] = uint64(f.SegmentLen)
	}
	return m
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// A write plan for one side: how its FPDUs go into write calls, and so into
// TCP segments.
type step struct {
	fpdus []fpdu
	// split > 0 writes the first split octets of the (single) FPDU,
	// waits until they left, then writes the rest.
	split int
}

// one FPDU per write, each sent on its own before the next (one FPDU per
// segment as long as it fits the MSS).
func each(fs ...fpdu) []step {
	s := make([]step, len(fs))
	for i, f := range fs {
		s[i] = step{fpdus: []fpdu{f}}
	}
	return s
}

type session struct {
	name           string
	ini, resp      mpa.Config
	client, server []step
	// segmentation: the capture must show FPDUs sharing a segment and
	// FPDUs spanning segments.
	segmentation bool
}

func (s *session) sent(client bool) []fpdu {
	steps := s.server
	if client {
		steps = s.client
	}
	var out []fpdu
	for _, st := range steps {
		out = append(out, st.fpdus...)
	}
	return out
}

func sessions() []session {
	readRsp := ddp.ReadRequestFields{SinkSTag: 0x11223344, SinkTO: 0x1000, Size: 256, SrcSTag: 0x55667788, SrcTO: 0xfedcba9876543210}
	termRead := func() ddp.TerminateFields {
		h := make([]byte, ddp.UntaggedHeaderLen)
		ddp.Untagged(h).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpReadRequest, QN: 1, MSN: 9})
		body := make([]byte, ddp.ReadRequestLen)
		ddp.ReadRequest(body).Encode(&readRsp)
		return ddp.TerminateFields{Error: ddp.RDMAPAccessRights, SegmentLenValid: true, SegmentLen: 46, DDPHeader: h, RDMAPHeader: body}
	}
	termQN := func() ddp.TerminateFields {
		h := make([]byte, ddp.UntaggedHeaderLen)
		ddp.Untagged(h).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpSend, QN: 7, MSN: 3})
		return ddp.TerminateFields{Error: ddp.DDPUntaggedInvalidQN, SegmentLenValid: true, SegmentLen: 18, DDPHeader: h}
	}
	termTagged := func() ddp.TerminateFields {
		h := make([]byte, ddp.TaggedHeaderLen)
		ddp.Tagged(h).Encode(&ddp.TaggedFields{Opcode: ddp.OpWrite, STag: 0xbad, TO: 4096})
		return ddp.TerminateFields{Error: ddp.DDPTaggedInvalidSTag, SegmentLenValid: true, SegmentLen: 1000, DDPHeader: h}
	}
	markerSends := func(n int) []fpdu {
		var fs []fpdu
		for i := 0; i < n; i++ {
			fs = append(fs, untagged(ddp.OpSend, ddp.MSN(i+1), 0, 0, payload(300+i*150, byte(i))))
		}
		return fs
	}
	return []session{{
		name: "enhanced setup, CRC, every opcode",
		ini:  mpa.Config{CRC: true, IRD: 4, ORD: 8, PrivateData: []byte("softrnic client")},
		resp: mpa.Config{IRD: 16, ORD: 2, PrivateData: []byte("softrnic server")},
		client: each(
			tagged(ddp.OpWrite, true, 0x01000002, 0x7f0000001000, payload(100, 1)),
			readRequest(1, readRsp),
			untagged(ddp.OpSend, 1, 0, 0, payload(64, 2)),
			untagged(ddp.OpSendInvalidate, 2, 0, 0xabcdef01, payload(20, 3)),
			untagged(ddp.OpSendSE, 3, 0, 0, payload(5, 4)),
			untagged(ddp.OpSendSEInvalidate, 4, 0, 0x00000101, payload(1, 5)),
			untagged(ddp.OpImmediateData, 5, 0, 0, payload(8, 6)),
			untagged(ddp.OpImmediateDataSE, 6, 0, 0, payload(8, 7)),
			atomicRequest(2, ddp.AtomicRequestFields{Op: ddp.AtomicFetchAdd, RequestID: 1, RemoteSTag: 0x300, RemoteTO: 0x40, AddSwapData: 1, CompareMask: ^uint64(0)}),
			atomicRequest(3, ddp.AtomicRequestFields{Op: ddp.AtomicCmpSwap, RequestID: 2, RemoteSTag: 0x300, RemoteTO: 0x48, AddSwapData: 9, AddSwapMask: ^uint64(0), CompareData: 1, CompareMask: ^uint64(0)}),
			terminate(termRead()),
		),
		server: each(
			tagged(ddp.OpReadResponse, true, readRsp.SinkSTag, readRsp.SinkTO, payload(256, 9)),
			atomicResponse(1, 1, 41),
			atomicResponse(2, 2, 1),
			terminate(termQN()),
		),
	}, {
		name: "revision 1, no CRC",
		ini:  mpa.Config{Revision: 1, PrivateData: []byte{1, 2, 3}},
		resp: mpa.Config{},
		client: each(
			untagged(ddp.OpSend, 1, 0, 0, payload(33, 1)),
			tagged(ddp.OpWrite, false, 0x42, 0, payload(64, 2)),
			tagged(ddp.OpWrite, true, 0x42, 64, payload(64, 3)),
			readRequest(1, ddp.ReadRequestFields{SinkSTag: 1, Size: 1, SrcSTag: 2}),
			terminate(ddp.TerminateFields{Error: ddp.LLPCRC}),
		),
		server: each(
			tagged(ddp.OpReadResponse, true, 1, 0, payload(1, 4)),
			terminate(termTagged()),
		),
	}, {
		name:   "markers both ways, CRC",
		ini:    mpa.Config{CRC: true, Markers: true, IRD: 1, ORD: 1},
		resp:   mpa.Config{Markers: true, IRD: 1, ORD: 1},
		client: each(markerSends(8)...),
		server: each(
			tagged(ddp.OpReadResponse, false, 7, 0, payload(1000, 1)),
			tagged(ddp.OpReadResponse, false, 7, 1000, payload(1000, 2)),
			tagged(ddp.OpReadResponse, true, 7, 2000, payload(1000, 3)),
		),
	}, {
		name:         "FPDUs split across segments and coalesced",
		segmentation: true,
		ini:          mpa.Config{CRC: true},
		resp:         mpa.Config{},
		client: append(each(
			tagged(ddp.OpWrite, true, 0x900, 0, payload(3400, 1)),
			untagged(ddp.OpSend, 1, 0, 0, payload(3400, 2)),
		), step{split: 9, fpdus: []fpdu{untagged(ddp.OpSend, 2, 0, 0, payload(40, 3))}},
			step{fpdus: []fpdu{
				untagged(ddp.OpSend, 3, 0, 0, payload(10, 4)),
				untagged(ddp.OpSendSE, 4, 0, 0, payload(11, 5)),
				tagged(ddp.OpWrite, true, 0x901, 0, payload(12, 6)),
				untagged(ddp.OpSend, 5, 0, 0, payload(13, 7)),
			}},
			step{fpdus: []fpdu{untagged(ddp.OpSend, 6, 0, 0, payload(64, 8))}},
		),
		server: each(tagged(ddp.OpReadResponse, true, 0x77, 0, payload(3400, 9))),
	}, {
		name: "one corrupted CRC",
		ini:  mpa.Config{CRC: true},
		resp: mpa.Config{CRC: true},
		client: each(
			untagged(ddp.OpSend, 1, 0, 0, payload(100, 1)),
			untagged(ddp.OpSend, 2, 0, 0, payload(100, 2)),
			func() fpdu { f := untagged(ddp.OpSend, 3, 0, 0, payload(100, 3)); f.badCRC = true; return f }(),
		),
	}}
}

// writeSteps frames and writes a side's FPDUs as planned.
func writeSteps(c *net.TCPConn, fr *mpa.Framer, crc bool, steps []step) error {
	for _, st := range steps {
		var buf []byte
		for _, f := range st.fpdus {
			buf = fr.Append(buf, f.ulpdu, nil)
			if f.badCRC {
				if !crc {
					return errors.New("bad CRC asked without CRC")
				}
				buf[len(buf)-1] ^= 0xff
			}
		}
		parts := [][]byte{buf}
		if st.split > 0 {
			parts = [][]byte{buf[:st.split], buf[st.split:]}
		}
		for _, p := range parts {
			if _, err := c.Write(p); err != nil {
				return err
			}
			if err := waitSent(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitSent returns once the kernel has no unsent octets queued, so that the
// next write starts a new segment.
func waitSent(c *net.TCPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		var ierr error
		if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQNSD) }); err != nil {
			return err
		}
		if ierr != nil {
			return ierr
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d octets still unsent after 10 s", n)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// readFrame reads one MPA startup frame.
func readFrame(c net.Conn, reply bool) (mpa.Frame, error) {
	hdr := make([]byte, mpa.FrameHeaderLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return mpa.Frame{}, err
	}
	n, err := mpa.FrameLen(hdr)
	if err != nil {
		return mpa.Frame{}, err
	}
	b := make([]byte, n)
	copy(b, hdr)
	if _, err := io.ReadFull(c, b[mpa.FrameHeaderLen:]); err != nil {
		return mpa.Frame{}, err
	}
	f, _, err := mpa.ParseFrame(b, reply)
	return f, err
}

// receive parses the peer's FPDU stream to its end with our own parser.
func receive(c net.Conn, p mpa.Params) ([][]byte, error) {
	a := mpa.NewAssembler(p.CRC, p.MarkersRx)
	var got [][]byte
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			var perr error
			if got, perr = a.Feed(buf[:n], got); perr != nil {
				_, _ = io.Copy(io.Discard, c)
				return got, perr
			}
		}
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
	}
}

func checkReceived(got [][]byte, err error, want []fpdu) error {
	good := want
	for i, f := range want {
		if f.badCRC {
			good = want[:i]
			if !errors.Is(err, ddp.LLPCRC) {
				return fmt.Errorf("corrupted FPDU %d: error %v, want a CRC error", i, err)
			}
			err = nil
			break
		}
	}
	if err != nil {
		return err
	}
	if len(got) != len(good) {
		return fmt.Errorf("parsed %d ULPDUs, want %d", len(got), len(good))
	}
	for i := range good {
		if !bytes.Equal(got[i], good[i].ulpdu) {
			return fmt.Errorf("ULPDU %d differs", i)
		}
	}
	return nil
}

func serve(c *net.TCPConn, s *session) error {
	defer c.Close()
	req, err := readFrame(c, false)
	if err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	reply, p, err := s.resp.Accept(&req)
	if err != nil {
		return err
	}
	wire, err := reply.Append(nil)
	if err != nil {
		return err
	}
	if _, err := c.Write(wire); err != nil {
		return err
	}
	if err := waitSent(c); err != nil {
		return err
	}
	return fullOperation(c, p, s.server, s.sent(true))
}

// fullOperation sends this side's FPDUs while checking the peer's as they
// arrive, then closes its half of the connection.
func fullOperation(c *net.TCPConn, p mpa.Params, mine []step, theirs []fpdu) error {
	errc := make(chan error, 1)
	go func() {
		got, rerr := receive(c, p)
		errc <- checkReceived(got, rerr, theirs)
	}()
	if err := writeSteps(c, mpa.NewFramer(p.CRC, p.MarkersTx), p.CRC, mine); err != nil {
		return err
	}
	if err := c.CloseWrite(); err != nil {
		return err
	}
	return <-errc
}

func dial(c *net.TCPConn, s *session) error {
	defer c.Close()
	if err := c.SetNoDelay(true); err != nil {
		return err
	}
	req, err := s.ini.Request()
	if err != nil {
		return err
	}
	wire, err := req.Append(nil)
	if err != nil {
		return err
	}
	if _, err := c.Write(wire); err != nil {
		return err
	}
	reply, err := readFrame(c, true)
	if err != nil {
		return fmt.Errorf("read reply: %w", err)
	}
	p, err := s.ini.Complete(&reply)
	if err != nil {
		return err
	}
	return fullOperation(c, p, s.client, s.sent(false))
}

// TestWireDissectedByWireshark runs real TCP sessions carrying MPA startup
// and FPDUs of every opcode between two namespaces, captures them, and has
// tshark — an implementation that shares no code with ours — decode them.
func TestWireDissectedByWireshark(t *testing.T) {
	testenv.RequireTool(t, "tshark")
	testenv.RequireTool(t, "tcpdump")
	pair := topology.NewTest(t, topology.Options{})
	ss := sessions()

	var ln *net.TCPListener
	if err := pair.B.Do(func() error {
		l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: pair.B.Addr.Addr().AsSlice()})
		ln = l
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	pcap := filepath.Join(t.TempDir(), "iwarp.pcap")
	cap, err := capture.Start(pair.A, pair.A.Link, fmt.Sprintf("tcp port %d", port), pcap)
	if err != nil {
		t.Fatal(err)
	}
	srvErr := make(chan error, 1)
	go func() {
		for i := range ss {
			_ = ln.SetDeadline(time.Now().Add(60 * time.Second))
			c, err := ln.AcceptTCP()
			if err != nil {
				srvErr <- err
				return
			}
			_ = c.SetNoDelay(true)
			if err := serve(c, &ss[i]); err != nil {
				srvErr <- fmt.Errorf("server, %s: %w", ss[i].name, err)
				return
			}
		}
		srvErr <- nil
	}()
	for i := range ss {
		c, err := pair.A.DialTCP(netip.MustParseAddrPort(ln.Addr().String()), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		if err := dial(c, &ss[i]); err != nil {
			t.Fatalf("client, %s: %v", ss[i].name, err)
		}
	}
	if err := <-srvErr; err != nil {
		t.Fatal(err)
	}
	if err := cap.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("tcpdump: %s", cap.Report())
	if os.Getenv("SOFTRNIC_KEEP_PCAP") != "" {
		data, _ := os.ReadFile(pcap)
		_ = os.WriteFile(os.Getenv("SOFTRNIC_KEEP_PCAP"), data, 0o644)
	}

	pkts, err := tshark.Dissect(pcap, tshark.IWARPArgs...)
	if err != nil {
		t.Fatal(err)
	}
	checkDissection(t, pkts, ss, port)
	checkOwnDecoder(t, pcap, ss)
}

// checkOwnDecoder runs the same capture through internal/mpadump, which
// interop runs use where Wireshark loses FPDUs to re-segmentation: it must
// find every FPDU each side sent, with the startup frames and Terminates as
// encoded, and stop at exactly the corrupted CRC.
func checkOwnDecoder(t *testing.T, path string, ss []session) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := mpadump.Analyze(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Conns) != len(ss) {
		t.Fatalf("mpadump found %d connections, want %d", len(rep.Conns), len(ss))
	}
	for i, c := range rep.Conns {
		s := &ss[i]
		wantReq, _ := s.ini.Request()
		if c.Request == nil || c.Reply == nil || c.Request.CRC != wantReq.CRC || c.Request.Markers != wantReq.Markers ||
			!bytes.Equal(c.Request.PrivateData, wantReq.PrivateData) {
			t.Errorf("%s: mpadump startup frames %+v / %+v", s.name, c.Request, c.Reply)
			continue
		}
		if c.CRC != (s.ini.CRC || s.resp.CRC) || c.ToServer.Markers != s.resp.Markers || c.ToClient.Markers != s.ini.Markers {
			t.Errorf("%s: mpadump CRC %v markers %v/%v", s.name, c.CRC, c.ToServer.Markers, c.ToClient.Markers)
		}
		for _, d := range []struct {
			dir    *mpadump.Dir
			client bool
		}{{c.ToServer, true}, {c.ToClient, false}} {
			sent := s.sent(d.client)
			want, wantTerms := len(sent), 0
			var wantErr error
			for j, f := range sent {
				if f.badCRC {
					want, wantErr = j, ddp.LLPCRC
					break
				}
				if ddp.Header(f.ulpdu).Opcode() == ddp.OpTerminate {
					wantTerms++
				}
			}
			if d.dir.FPDUs != want || len(d.dir.Terminates) != wantTerms || !errors.Is(d.dir.Err, wantErr) || (wantErr == nil && d.dir.Err != nil) {
				t.Errorf("%s (client %v): mpadump decoded %d FPDUs, %d Terminates, error %v; want %d, %d, %v",
					s.name, d.client, d.dir.FPDUs, len(d.dir.Terminates), d.dir.Err, want, wantTerms, wantErr)
			}
		}
	}
}

// pdu is one MPA PDU as Wireshark dissected it, with the iWARP layers after it.
type pdu struct {
	frame  int
	stream uint64
	client bool
	mpa    tshark.Proto
	iwarp  []tshark.Proto
	// inFrame is the number of MPA PDUs in the frame; reassembled says
	// the frame completed a PDU that began in earlier segments.
	inFrame     int
	reassembled bool
}

func (p *pdu) field(name string) (tshark.Field, bool) {
	if f, ok := p.mpa.Get(name); ok {
		return f, true
	}
	for i := range p.iwarp {
		if f, ok := p.iwarp[i].Get(name); ok {
			return f, true
		}
	}
	return tshark.Field{}, false
}

func collect(t *testing.T, pkts []tshark.Packet, port int) []pdu {
	var out []pdu
	for _, pk := range pkts {
		streamF, ok1 := pk.Field("tcp.stream")
		srcF, ok2 := pk.Field("tcp.srcport")
		if !ok1 || !ok2 {
			continue
		}
		stream, _ := streamF.Uint()
		src, _ := srcF.Uint()
		_, reassembled := pk.Field("tcp.reassembled.length")
		first := len(out)
		for i, pr := range pk.Protos {
			if pr.Name != "iwarp_mpa" {
				continue
			}
			p := pdu{frame: pk.Number, stream: stream, client: int(src) != port, mpa: pr}
			for _, next := range pk.Protos[i+1:] {
				if next.Name == "iwarp_mpa" {
					break
				}
				if strings.HasPrefix(next.Name, "iwarp") {
					p.iwarp = append(p.iwarp, next)
				}
			}
			p.reassembled = reassembled
			out = append(out, p)
		}
		for i := first; i < len(out); i++ {
			out[i].inFrame = len(out) - first
		}
	}
	return out
}

func checkDissection(t *testing.T, pkts []tshark.Packet, ss []session, port int) {
	pdus := collect(t, pkts, port)
	byStream := map[uint64][]pdu{}
	var streams []uint64
	for _, p := range pdus {
		if _, ok := byStream[p.stream]; !ok {
			streams = append(streams, p.stream)
		}
		byStream[p.stream] = append(byStream[p.stream], p)
	}
	if len(streams) != len(ss) {
		t.Fatalf("Wireshark found MPA in %d TCP streams, want %d", len(streams), len(ss))
	}
	badCRCs := 0
	for i, st := range streams {
		s := &ss[i]
		var req, rep *pdu
		var fromClient, fromServer []pdu
		for j := range byStream[st] {
			p := &byStream[st][j]
			switch {
			case hasField(p, "iwarp_mpa.req"):
				req = p
			case hasField(p, "iwarp_mpa.rep"):
				rep = p
			case hasField(p, "iwarp_mpa.fpdu"):
				if p.client {
					fromClient = append(fromClient, *p)
				} else {
					fromServer = append(fromServer, *p)
				}
			}
		}
		if req == nil || rep == nil {
			t.Errorf("%s: Request %v, Reply %v dissected", s.name, req != nil, rep != nil)
			continue
		}
		checkStartup(t, s, req, rep)
		crc := s.ini.CRC || s.resp.CRC
		badCRCs += checkFPDUs(t, s.name+" client", fromClient, s.sent(true), crc)
		badCRCs += checkFPDUs(t, s.name+" server", fromServer, s.sent(false), crc)
		if s.ini.Markers || s.resp.Markers {
			checkMarkers(t, s, fromClient, fromServer)
		}
		if s.segmentation {
			coalesced, reassembled := 0, 0
			for _, p := range fromClient {
				if p.inFrame > 1 {
					coalesced++
				}
				if p.reassembled {
					reassembled++
				}
			}
			// The plan: four FPDUs in one write, and three FPDUs
			// (two over the MSS, one split by hand) across segments.
			if coalesced < 4 || reassembled < 3 {
				t.Errorf("%s: %d FPDUs shared a segment, %d spanned segments; the test did not exercise segmentation", s.name, coalesced, reassembled)
			}
		}
	}
	if badCRCs != 1 {
		t.Errorf("Wireshark reported %d bad CRCs, want exactly the one corrupted", badCRCs)
	}
}

func hasField(p *pdu, name string) bool { _, ok := p.mpa.Get(name); return ok }

func checkStartup(t *testing.T, s *session, req, rep *pdu) {
	t.Helper()
	wantReq, _ := s.ini.Request()
	gotReq, err := frameFromWireshark(req)
	if err != nil {
		t.Errorf("%s: Request: %v", s.name, err)
		return
	}
	if gotReq.CRC != wantReq.CRC || gotReq.Markers != wantReq.Markers || gotReq.Revision != wantReq.Revision {
		t.Errorf("%s: Request flags as dissected %+v, sent %+v", s.name, gotReq, wantReq)
	}
	wantPD, _ := wantReq.Append(nil)
	if !bytes.Equal(gotReq.pd, wantPD[mpa.FrameHeaderLen:]) {
		t.Errorf("%s: Request private data %x, sent %x", s.name, gotReq.pd, wantPD[mpa.FrameHeaderLen:])
	}
	// Wireshark does not know RFC 6581: the IRD/ORD words are the first
	// four octets of its private data; check them ourselves.
	if wantReq.Enhanced {
		ird := binary.BigEndian.Uint16(gotReq.pd) & mpa.MaxIRDORD
		ord := binary.BigEndian.Uint16(gotReq.pd[2:]) & mpa.MaxIRDORD
		if ird != s.ini.IRD || ord != s.ini.ORD {
			t.Errorf("%s: Request IRD/ORD %d/%d, want %d/%d", s.name, ird, ord, s.ini.IRD, s.ini.ORD)
		}
	}
	gotRep, err := frameFromWireshark(rep)
	if err != nil {
		t.Errorf("%s: Reply: %v", s.name, err)
		return
	}
	if gotRep.Reject || gotRep.CRC != (s.resp.CRC || s.ini.CRC) || gotRep.Markers != s.resp.Markers {
		t.Errorf("%s: Reply as dissected %+v", s.name, gotRep)
	}
}

type dissectedFrame struct {
	CRC, Markers, Reject bool
	Revision             uint8
	pd                   []byte
}

func frameFromWireshark(p *pdu) (dissectedFrame, error) {
	var f dissectedFrame
	get := func(name string) (uint64, error) {
		fl, ok := p.mpa.Get(name)
		if !ok {
			return 0, fmt.Errorf("no field %s", name)
		}
		return fl.Uint()
	}
	var err error
	var v uint64
	if v, err = get("iwarp_mpa.crc_flag"); err != nil {
		return f, err
	}
	f.CRC = v != 0
	if v, err = get("iwarp_mpa.marker_flag"); err != nil {
		return f, err
	}
	f.Markers = v != 0
	if v, err = get("iwarp_mpa.rej_flag"); err != nil {
		return f, err
	}
	f.Reject = v != 0
	if v, err = get("iwarp_mpa.rev"); err != nil {
		return f, err
	}
	f.Revision = uint8(v)
	if pd, ok := p.mpa.Get("iwarp_mpa.privatedata"); ok {
		f.pd, err = hexBytes(pd.Value)
	}
	return f, err
}

func hexBytes(s string) ([]byte, error) {
	b := make([]byte, len(s)/2)
	_, err := fmt.Sscanf(s, "%x", &b)
	return b, err
}

// checkFPDUs compares what one side sent with what Wireshark dissected, in
// stream order, and returns the number of bad CRCs reported.
func checkFPDUs(t *testing.T, who string, got []pdu, want []fpdu, crc bool) int {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: Wireshark dissected %d FPDUs, sent %d", who, len(got), len(want))
		return 0
	}
	bad := 0
	for i := range want {
		p := &got[i]
		if crc {
			f, ok := p.mpa.Get("iwarp_mpa.crc_check")
			switch {
			case !ok:
				t.Errorf("%s FPDU %d (frame %d): no CRC check", who, i, p.frame)
			case strings.Contains(f.ShowName, "Bad CRC32"):
				bad++
				if !want[i].badCRC {
					t.Errorf("%s FPDU %d (frame %d): %s", who, i, p.frame, f.ShowName)
				}
			case !strings.Contains(f.ShowName, "Good CRC32"):
				t.Errorf("%s FPDU %d (frame %d): CRC verdict %q", who, i, p.frame, f.ShowName)
			case want[i].badCRC:
				t.Errorf("%s FPDU %d (frame %d): corrupted CRC reported good", who, i, p.frame)
			}
		} else if _, ok := p.mpa.Get("iwarp_mpa.crc"); !ok {
			t.Errorf("%s FPDU %d (frame %d): no CRC field", who, i, p.frame)
		}
		for name, v := range want[i].want {
			f, ok := p.field(name)
			if !ok {
				t.Errorf("%s FPDU %d (frame %d, opcode %d): Wireshark shows no %s", who, i, p.frame, want[i].want["iwarp_rdma.opcode"], name)
				continue
			}
			gv, err := f.Uint()
			if err != nil || gv != v {
				t.Errorf("%s FPDU %d (frame %d): %s = %q, sent %#x", who, i, p.frame, name, f.Show, v)
			}
		}
	}
	return bad
}

// checkMarkers counts the markers Wireshark found against those we framed.
func checkMarkers(t *testing.T, s *session, fromClient, fromServer []pdu) {
	t.Helper()
	count := func(ps []pdu) int {
		n := 0
		for _, p := range ps {
			for _, f := range p.mpa.Fields {
				if f.Name == "iwarp_mpa.marker_fpduptr" {
					n++
				}
			}
		}
		return n
	}
	expect := func(fs []fpdu) int {
		fr := mpa.NewFramer(true, true)
		n := 0
		for _, f := range fs {
			n += (fr.WireLen(len(f.ulpdu)) - mpa.FPDULen(len(f.ulpdu))) / mpa.MarkerLen
			fr.Append(nil, f.ulpdu, nil)
		}
		return n
	}
	if got, want := count(fromClient), expect(s.sent(true)); got != want || want < 2 {
		t.Errorf("%s: Wireshark found %d markers from the client, we framed %d", s.name, got, want)
	}
	if got, want := count(fromServer), expect(s.sent(false)); got != want || want < 2 {
		t.Errorf("%s: Wireshark found %d markers from the server, we framed %d", s.name, got, want)
	}
}
