package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestProgress(t *testing.T) {
	var b bytes.Buffer
	pr := startProgress(&b, "write_bw 4096 B", 1000, 0, time.Now().Add(-2*time.Second))
	pr.update(63) // not a multiple of 64: the clock is not read
	if b.Len() != 0 {
		t.Fatalf("early output %q", b.String())
	}
	pr.update(64)
	if got := b.String(); !strings.HasPrefix(got, "\rwrite_bw 4096 B: 64 of 1000 iterations (6%), 2 s") {
		t.Fatalf("progress line %q", got)
	}
	n := b.Len()
	pr.update(128) // within the second: nothing
	if b.Len() != n {
		t.Fatalf("second line within a second: %q", b.String()[n:])
	}
	pr.end()
	if !strings.HasSuffix(b.String(), "\r\033[K") {
		t.Fatalf("line not erased at the end: %q", b.String())
	}

	b.Reset()
	pr = startProgress(&b, "read_bw 64 B", 5000, 10*time.Second, time.Now().Add(-3*time.Second))
	pr.update(640)
	if got := b.String(); !strings.HasPrefix(got, "\rread_bw 64 B: 3 of 10 s, 640 iterations") {
		t.Fatalf("timed progress line %q", got)
	}

	// Not a terminal: silent, and end has nothing to erase.
	pr = &progress{}
	pr.update(64)
	pr.end()
}
