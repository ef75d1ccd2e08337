package xsk

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestUMEMOptions(t *testing.T) {
	for _, o := range []UMEMOptions{
		{FrameSize: 1024},
		{FrameSize: 3000},
		{FrameSize: uint32(os.Getpagesize()) * 2},
		{FrameSize: 2048, Headroom: 2048 - 256},
	} {
		if _, err := NewUMEM(o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("NewUMEM(%+v) error %v, want ErrInvalidOptions", o, err)
		}
	}
}

func TestUMEM(t *testing.T) {
	u, err := NewUMEM(UMEMOptions{FrameSize: 2048, FrameCount: 8, Headroom: 64, Name: "xsk-test"})
	if err != nil {
		t.Fatal(err)
	}
	if u.FrameSize() != 2048 || u.FrameCount() != 8 || u.Headroom() != 64 || len(u.Bytes()) != 8*2048 {
		t.Fatalf("geometry %d×%d headroom %d len %d", u.FrameCount(), u.FrameSize(), u.Headroom(), len(u.Bytes()))
	}
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", u.MemFD()))
	if err != nil || !strings.Contains(link, "memfd:xsk-test") {
		t.Errorf("memfd link %q, %v", link, err)
	}
	fr := u.Frame(3*2048 + 100)
	if len(fr) != 2048-100 || cap(fr) != len(fr) {
		t.Fatalf("Frame len %d cap %d", len(fr), cap(fr))
	}
	fr[0] = 0xaa
	p := u.Packet(Desc{Addr: 3*2048 + 100, Len: 10})
	if len(p) != 10 || cap(p) != 10 || p[0] != 0xaa || u.Bytes()[3*2048+100] != 0xaa {
		t.Fatal("Packet does not view the same memory as Frame")
	}
	if _, err := NewSocket(u, SocketOptions{}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("NewSocket without an interface: %v", err)
	}
	if _, err := NewSocket(u, SocketOptions{Ifindex: 1, RXSize: 100}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("NewSocket with ring size 100: %v", err)
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if err := u.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := NewSocket(u, SocketOptions{Ifindex: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewSocket on a closed UMEM: %v", err)
	}
}

func TestModeString(t *testing.T) {
	for m, s := range map[Mode]string{ModeAuto: "auto", ModeCopy: "copy", ModeZeroCopy: "zero-copy", 7: "Mode(7)"} {
		if m.String() != s {
			t.Errorf("%d.String() = %q, want %q", int(m), m.String(), s)
		}
	}
}
