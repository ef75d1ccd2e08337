package qp

import (
	"sync"

	"github.com/softrnic/softrnic/ddp"
)

// Placement into process memory, gathered (the stage). A peer's Write,
// Send or Read Response arrives in FPDUs of about a segment each; placing
// each one into a process-backed region was one copy into the process
// (a pwrite of /proc/PID/mem: the address space looked up and locked, the
// pages found) per 1.4 KiB, 46 of them for a 64 KiB Write, which held
// perftest's ib_write_bw through the verbs libraries to about half the
// bandwidth the Go client gets from a shared region. The stage gathers
// the octets that go to consecutive addresses of one region and copies
// them to the process in one go: when the next octets go elsewhere, when
// it is full, and when their message ends, before its completion (or, for
// a Write, before anything the peer sends after it is taken in), so
// that nothing the application can see is reordered: a message's octets
// reach the process before its completion and before any later message's
// octets, as they did one FPDU at a time. What a connection that ends in
// the middle of a message had gathered is dropped, as the rest of that
// message is (no completion reports it).

// stageSize is the most the stage gathers before it copies: a 64 KiB
// message in one copy. The buffer is the stage's only while it gathers,
// from stagePool: an idle QP holds none, and a QP of shared regions (the
// Go client's) never takes one.
const stageSize = 64 << 10

var stagePool = sync.Pool{New: func() any { return new([stageSize]byte) }}

// stage is the octets gathered for process memory: n of buf, for the
// process's addresses from addr on, in region mr (held while n > 0).
type stage struct {
	buf  *[stageSize]byte // while n > 0
	n    int
	mr   *MR
	addr uint64
	// op is the opcode of the message the octets are of, for a copy
	// that fails when another message's octets come (stageError).
	op ddp.Opcode
}

// stageError is a failed copy of gathered octets, with the opcode of the
// message they were of: placeFailed fails that message's request.
type stageError struct {
	op  ddp.Opcode
	err error
}

func (e *stageError) Error() string { return e.err.Error() }
func (e *stageError) Unwrap() error { return e.err }

// stagePlace gathers data for the octets of m's shadow at (as long as
// data), copying what was gathered before to the process when data does
// not follow it. An error is the copy's: the process memory could not be
// written.
func (q *QP) stagePlace(m *MR, at, data []byte) error {
	s := &q.stage
	addr := m.procAddr(at)
	for len(data) > 0 {
		if s.n > 0 && (s.mr != m || s.addr+uint64(s.n) != addr || s.n == len(s.buf)) {
			if err := q.flushStage(); err != nil {
				return err
			}
		}
		if s.n == 0 {
			if !m.hold() {
				return ErrProtection
			}
			s.mr, s.addr = m, addr
			s.op = ddp.Header(q.rx.hdr[:q.rx.hlen]).Opcode()
			s.buf = stagePool.Get().(*[stageSize]byte)
		}
		k := copy(s.buf[s.n:], data)
		s.n += k
		data = data[k:]
		addr += uint64(k)
	}
	return nil
}

// flushStage copies what the stage gathered to the process.
func (q *QP) flushStage() error {
	s := &q.stage
	if s.n == 0 {
		return nil
	}
	err := s.mr.Proc.WriteAt(s.buf[:s.n], s.addr)
	s.release()
	if err != nil {
		return &stageError{op: s.op, err: err}
	}
	return nil
}

// dropStage forgets what the stage gathered: its connection ended in the
// middle of the message.
func (q *QP) dropStage() {
	if q.stage.n > 0 {
		q.stage.release()
	}
}

// release gives back the region's hold and the buffer.
func (s *stage) release() {
	s.mr.release()
	stagePool.Put(s.buf)
	s.mr, s.n, s.buf = nil, 0, nil
}
