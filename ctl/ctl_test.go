package ctl

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	bodies := []any{
		&Hello{Client: "test"},
		&HelloReply{Session: 7, IA: IAAttr{Name: "veth0", Datapath: "kernel", Address: "192.0.2.1", MaxEP: 1, MaxSGE: 4}},
		&RegisterLMR{PZ: 1, Offset: 4096, Length: 1 << 20, VA: 0x7f0000000000, Access: AccessRemoteWrite | AccessLocalWrite},
		&RegisterProcessMemory{PZ: 1, VA: 0x7f0000000003, Length: 16, Access: AccessRemoteRead},
		&CreateEP{Attr: EPAttr{PZ: 1, RecvEVD: 2, RequestEVD: 3, ConnectEVD: 4, SQDepth: 64, RQDepth: 64, IRD: 8, ORD: 8, PeerToPeer: true, RTR: 4}},
		&EPInfo{State: 5, LocalAddr: "192.0.2.1:4791", PrivateData: []byte{1, 2, 3}, HasQP: true},
		&Connect{EP: 9, Addr: "192.0.2.2:4791", PrivateData: make([]byte, 256), TimeoutUS: 1e6},
	}
	for i, body := range bodies {
		b, err := Marshal(Header{Op: OpCreateEP, ID: uint32(i), Status: InvalidState}, body)
		if err != nil {
			t.Fatal(err)
		}
		h, rest, err := ParseHeader(b)
		if err != nil || h.Op != OpCreateEP || h.ID != uint32(i) || h.Status != InvalidState {
			t.Fatalf("header %+v %v", h, err)
		}
		back := reflect.New(reflect.TypeOf(body).Elem()).Interface()
		if err := Unmarshal(rest, back); err != nil {
			t.Fatalf("%T: %v", body, err)
		}
		if !reflect.DeepEqual(body, back) {
			t.Fatalf("%T: %+v back as %+v", body, body, back)
		}
		// Every truncation fails cleanly.
		for n := 0; n < len(rest); n++ {
			if err := Unmarshal(rest[:n], reflect.New(reflect.TypeOf(body).Elem()).Interface()); !errors.Is(err, ErrMalformed) {
				t.Fatalf("%T truncated to %d: %v", body, n, err)
			}
		}
		if err := Unmarshal(append(bytes.Clone(rest), 0), back); !errors.Is(err, ErrMalformed) {
			t.Fatalf("%T with a trailing octet: %v", body, err)
		}
	}
}

func TestHeaderVector(t *testing.T) {
	b, _ := Marshal(Header{Op: OpConnect, Flags: 0, ID: 0x01020304, Status: Timeout}, &Handle{H: 5})
	want := []byte{'S', 'R', 0, Version, 0, byte(OpConnect), 0, 0, 1, 2, 3, 4, 0, 0, 0, byte(Timeout), 0, 0, 0, 5}
	if !bytes.Equal(b, want) {
		t.Fatalf("got %x\nwant %x", b, want)
	}
	for _, bad := range [][]byte{b[:15], append([]byte{'X'}, b[1:]...), append([]byte{'S', 'R', 0, 2}, b[4:]...)} {
		if _, _, err := ParseHeader(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("%x: %v", bad, err)
		}
	}
	if err := Unmarshal([]byte{2}, &struct{ B bool }{}); !errors.Is(err, ErrMalformed) {
		t.Fatal("bool 2 accepted")
	}
	if _, err := Marshal(Header{}, &Connect{PrivateData: make([]byte, MaxBytes+1)}); err == nil {
		t.Fatal("oversized field encoded")
	}
}

func TestErrorIs(t *testing.T) {
	err := error(&Error{Status: InvalidHandle, Message: "no EP 7"})
	if !errors.Is(err, &Error{Status: InvalidHandle}) || errors.Is(err, &Error{Status: InvalidState}) {
		t.Fatal("errors.Is on status")
	}
}

// FuzzDecode: any packet a client sends is decoded without panic into every
// request type, and what decodes re-encodes identically.
func FuzzDecode(f *testing.F) {
	for _, body := range []any{&Hello{Client: "x"}, &Connect{EP: 1, Addr: "a:1"}, &CreateEP{}, &RegisterLMR{}, &RegisterProcessMemory{}} {
		b, _ := Marshal(Header{Op: OpConnect, ID: 1}, body)
		f.Add(b)
	}
	types := []any{Hello{}, Handle{}, RegisterLMR{}, RegisterProcessMemory{}, CreateEVD{}, CreateEP{}, ModifyEP{}, Connect{}, Disconnect{},
		CreatePSP{}, CreateRSP{}, AcceptCR{}, RejectCR{}, ErrorBody{}}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, body, err := ParseHeader(b)
		if err != nil {
			return
		}
		for _, typ := range types {
			v := reflect.New(reflect.TypeOf(typ)).Interface()
			if Unmarshal(body, v) != nil {
				continue
			}
			again, err := Marshal(h, v)
			if err != nil {
				t.Fatalf("%T decoded but does not encode: %v", v, err)
			}
			if !bytes.Equal(again, b) {
				t.Fatalf("%T: re-encoded %x, was %x", v, again, b)
			}
		}
	})
}

// Op numbers are the protocol: a new op is appended, and its name is the
// one in opNames at its number.
func TestOpNumbers(t *testing.T) {
	for op, want := range map[Op]uint16{OpHello: 1, OpRegisterLMR: 5, OpSocketConnect: 26, OpRegisterProcessMemory: 27} {
		if uint16(op) != want {
			t.Errorf("%v is %d, was %d", op, uint16(op), want)
		}
	}
	for op, want := range map[Op]string{28: "ConnectQP", 29: "ReservePort", 30: "FreePort", 31: "ResolveRoute"} {
		if !op.Valid() || op.String() != want {
			t.Errorf("op %d is %q, valid %v; want %q", uint16(op), op, op.Valid(), want)
		}
	}
	if OpResolveRoute != 31 || Op(32).Valid() {
		t.Errorf("the last op is %d, and op 32 valid %v", uint16(OpResolveRoute), Op(32).Valid())
	}
}
