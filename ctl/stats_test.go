package ctl

import (
	"bytes"
	"errors"
	"testing"
)

// StatsReply's Stalls is appended after the object counts, big-endian at
// its width: the counts keep their offsets, and a body of the earlier
// layout (no Stalls) is refused as malformed, never misread.
func TestStatsReplyLayout(t *testing.T) {
	r := StatsReply{Sessions: 1, PZ: 2, LMR: 3, EVD: 4, EP: 5, PSP: 6, CR: 7, Stalls: 0x0102030405060708}
	b, err := Marshal(Header{Op: OpStats, ID: 9}, &r)
	if err != nil {
		t.Fatal(err)
	}
	_, body, err := ParseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0, 7,
		1, 2, 3, 4, 5, 6, 7, 8}
	if !bytes.Equal(body, want) {
		t.Fatalf("body %x\nwant %x", body, want)
	}
	var back StatsReply
	if err := Unmarshal(body, &back); err != nil || back != r {
		t.Fatalf("back %+v %v", back, err)
	}
	if err := Unmarshal(body[:28], &back); !errors.Is(err, ErrMalformed) {
		t.Fatalf("the body without Stalls: %v", err)
	}
}
