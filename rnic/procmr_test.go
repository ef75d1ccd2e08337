package rnic

import (
	"errors"
	"testing"

	"github.com/softrnic/softrnic/qp"
)

// nullProcess is process memory that holds nothing.
type nullProcess struct{}

func (nullProcess) ReadAt([]byte, uint64) error  { return errors.New("nothing") }
func (nullProcess) WriteAt([]byte, uint64) error { return errors.New("nothing") }

// A process-backed region is checked as any other and published whole:
// the STag finds it with its process memory, its shadow and its base.
func TestRegisterProcessMR(t *testing.T) {
	h := newHost(t)
	shadow := make([]byte, 16)
	if _, err := h.dev.RegisterProcessMR(h.pd, shadow, nil, 0x1003, qp.LocalWrite); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("without process memory: %v", err)
	}
	if _, err := h.dev.RegisterProcessMR(h.pd, nil, nullProcess{}, 0x1003, qp.LocalWrite); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("without a shadow: %v", err)
	}
	if _, err := h.dev.RegisterProcessMR(h.pd, shadow, nullProcess{}, 0x1003, qp.RemoteWrite); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("remote write without local write: %v", err)
	}
	if _, err := h.dev.RegisterProcessMR(h.pd, shadow, nullProcess{}, ^uint64(0)-7, qp.LocalWrite); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("wrapping: %v", err)
	}
	m, err := h.dev.RegisterProcessMR(h.pd, shadow, nullProcess{}, 0x1003, qp.LocalWrite|qp.RemoteRead)
	must(t, err)
	got := h.dev.stags.Lookup(m.STag)
	if got != m.MR || got.Proc != (nullProcess{}) || got.Base != 0x1003 || &got.Buf[0] != &shadow[0] || len(got.Buf) != 16 ||
		got.Access != qp.LocalWrite|qp.RemoteRead {
		t.Fatalf("looked up %+v", got)
	}
	must(t, m.Deregister())
	if h.dev.stags.Lookup(m.STag) != nil {
		t.Fatal("found after Deregister")
	}
}
