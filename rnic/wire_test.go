package rnic

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/internal/tshark"
	"github.com/softrnic/softrnic/qp"
)

// TestEngineWireDissectedByWireshark runs every operation between two
// devices in two namespaces, CRC on and off, captures the link and has
// tshark decode it: every TCP segment after MPA startup must belong to a
// dissected FPDU, every CRC must be good, and every opcode must appear.
func TestEngineWireDissectedByWireshark(t *testing.T) {
	testenv.RequireTool(t, "tshark")
	testenv.RequireTool(t, "tcpdump")
	net2 := topology.NewTest(t, topology.Options{})
	for _, noCRC := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", !noCRC), func(t *testing.T) {
			srv, cli := newHost(t), newHost(t)
			var ln *Listener
			must(t, net2.B.Do(func() (err error) {
				ln, err = srv.dev.Listen(net.JoinHostPort(net2.B.Addr.Addr().String(), "0"), ListenOptions{})
				return err
			}))
			defer ln.Close()
			pcap := filepath.Join(t.TempDir(), "engine.pcap")
			cap, err := capture.Start(net2.A, net2.A.Link, fmt.Sprintf("tcp port %d", ln.Addr().Port), pcap)
			must(t, err)

			attr := QPAttr{NoCRC: noCRC}
			sbuf := srv.mr(1<<20, qp.LocalWrite|qp.RemoteWrite|qp.RemoteRead|qp.RemoteAtomic)
			cbuf := cli.mr(1<<20, qp.LocalWrite)
			s, c := srv.qp(attr), cli.qp(attr)
			for i := 0; i < 8; i++ {
				must(t, s.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{LKey: sbuf.STag, Addr: sbuf.Base + uint64(i)*8192, Length: 8192}}}))
			}
			victim := srv.mr(64, qp.LocalWrite|qp.RemoteWrite)
			accepted := make(chan error, 1)
			go func() {
				cr, err := ln.Accept(context.Background())
				if err == nil {
					err = cr.Accept(s, []byte("server"))
				}
				accepted <- err
			}()
			must(t, net2.A.Do(func() error {
				_, err := c.Connect(context.Background(), ln.Addr().String(), ConnectOptions{PrivateData: []byte("client")})
				return err
			}))
			must(t, <-accepted)

			wrs := []qp.SendWR{
				{Op: qp.OpWrite, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base, Length: 100000}}, RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + 100000},
				{Op: qp.OpSend, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base, Length: 5000}}},
				{Op: qp.OpSend, Flags: qp.Solicited | qp.Inline, InlineData: []byte("se")},
				{Op: qp.OpSendInvalidate, Flags: qp.Inline, InlineData: []byte("inv"), InvalidateSTag: victim.STag},
				{Op: qp.OpSendInvalidate, Flags: qp.Solicited | qp.Inline, InlineData: []byte("seinv"), InvalidateSTag: victim.STag},
				{Op: qp.OpRead, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + 200000, Length: 60000}}, RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base},
				{Op: qp.OpFetchAdd, Add: 1, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + 300000, Length: 8}}, RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + 512000},
				{Op: qp.OpCmpSwap, Compare: 1, Swap: 2, SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + 300008, Length: 8}}, RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + 512000},
				{Op: qp.OpImmediate, Immediate: [8]byte{1}},
				{Op: qp.OpImmediate, Flags: qp.Solicited, Immediate: [8]byte{2}},
			}
			for i := range wrs {
				wrs[i].ID = uint64(i)
				wrs[i].Flags |= qp.Signaled
				must(t, c.PostSend(&wrs[i]))
			}
			checkOK(t, wait(t, cli.scq, len(wrs)))
			// Last, a Write to an STag the server does not have: the
			// server's Terminate ends the connection.
			must(t, c.PostSend(&qp.SendWR{Op: qp.OpWrite, Flags: qp.Inline, InlineData: []byte("x"), RemoteSTag: 0x77700, RemoteTO: 0}))
			if ev := waitEvent(t, s, TerminateSent); ev.Err != ddp.DDPTaggedInvalidSTag {
				t.Fatalf("server: %+v", ev)
			}
			waitEvent(t, c, Broken)
			waitEvent(t, s, Broken)
			s.Destroy()
			c.Destroy()
			must(t, cap.Stop())

			pkts, err := tshark.Dissect(pcap, tshark.IWARPArgs...)
			must(t, err)
			checkEngineCapture(t, pkts, !noCRC)
		})
	}
}

func checkEngineCapture(t *testing.T, pkts []tshark.Packet, crc bool) {
	t.Helper()
	opcodes := map[uint64]int{}
	fpdus, startup, good, bad := 0, 0, 0, 0
	for _, p := range pkts {
		lenF, _ := p.Field("tcp.len")
		tcpLen, _ := lenF.Uint()
		hasMPA, reassembledLater := false, false
		if _, ok := p.Field("tcp.reassembled_in"); ok {
			reassembledLater = true
		}
		for i := range p.Protos {
			pr := &p.Protos[i]
			if pr.Name != "iwarp_mpa" {
				continue
			}
			hasMPA = true
			if _, ok := pr.Get("iwarp_mpa.fpdu"); !ok {
				startup++
				continue
			}
			fpdus++
			if crc {
				f, _ := pr.Get("iwarp_mpa.crc_check")
				switch {
				case strings.Contains(f.ShowName, "Good CRC32"):
					good++
				default:
					bad++
					t.Errorf("frame %d: %s", p.Number, f.ShowName)
				}
			} else if _, ok := pr.Get("iwarp_mpa.crc"); !ok {
				t.Errorf("frame %d: FPDU without CRC field", p.Number)
			}
		}
		if tcpLen > 0 && !hasMPA && !reassembledLater {
			t.Errorf("frame %d: %d octets of TCP payload Wireshark did not dissect as MPA", p.Number, tcpLen)
		}
		for i := range p.Protos {
			for _, f := range p.Protos[i].Fields {
				if f.Name == "iwarp_rdma.opcode" {
					v, _ := f.Uint()
					opcodes[v]++
				}
			}
		}
	}
	if startup != 2 {
		t.Errorf("%d MPA startup frames dissected, want Request and Reply", startup)
	}
	for _, op := range []ddp.Opcode{ddp.OpWrite, ddp.OpReadRequest, ddp.OpReadResponse, ddp.OpSend, ddp.OpSendInvalidate,
		ddp.OpSendSE, ddp.OpSendSEInvalidate, ddp.OpTerminate, ddp.OpImmediateData, ddp.OpImmediateDataSE,
		ddp.OpAtomicRequest, ddp.OpAtomicResponse} {
		if opcodes[uint64(op)] == 0 {
			t.Errorf("no %v in the capture", op)
		}
	}
	t.Logf("%d FPDUs dissected (%d CRCs good, %d bad), opcodes %v", fpdus, good, bad, opcodes)
}
