package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// TestDurationFlag: -D takes perftest's whole seconds ("-D 5") and Go
// durations, and refuses negatives and garbage with a message that says
// what it wants.
func TestDurationFlag(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want time.Duration // when ok
		ok   bool
	}{
		{"5", 5 * time.Second, true},
		{"0", 0, true},
		{"+3", 3 * time.Second, true},
		{"5s", 5 * time.Second, true},
		{"1500ms", 1500 * time.Millisecond, true},
		{"2m", 2 * time.Minute, true},
		{"-5", 0, false},
		{"-5s", 0, false},
		{"2.5", 0, false},
		{"five", 0, false},
		{"5 s", 0, false},
		{"", 0, false},
		{"99999999999", 0, false},
		{"99999999999999999999", 0, false},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			o := opts{test: "write_bw"}
			fs := newFlagSet(&o, flag.ContinueOnError)
			var msg strings.Builder
			fs.SetOutput(&msg)
			err := fs.Parse([]string{"-D", tc.arg, "-n", "7"})
			if !tc.ok {
				if err == nil {
					t.Fatalf("-D %q taken as %v", tc.arg, o.duration)
				}
				if !strings.Contains(msg.String(), "-D") || !strings.Contains(msg.String(), "seconds") {
					t.Fatalf("-D %q: the message does not say what -D wants: %q", tc.arg, msg.String())
				}
				return
			}
			if err != nil || o.duration != tc.want || o.iters != 7 {
				t.Fatalf("-D %q: %v, duration %v (want %v), -n %d", tc.arg, err, o.duration, tc.want, o.iters)
			}
		})
	}
}

// TestDefaultFlags: without flags, the defaults are perftest's, and the
// usage text does not list -D's zero default.
func TestDefaultFlags(t *testing.T) {
	for _, tc := range []struct {
		test    string
		latency bool
		size    int
	}{{"write_bw", false, 65536}, {"write_lat", true, 2}} {
		o := opts{test: tc.test, isLatency: tc.latency}
		fs := newFlagSet(&o, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		if o.size != tc.size || o.duration != 0 || o.timeout != 10*time.Minute || o.qps != 1 || o.port != 18515 || o.depth != 128 {
			t.Fatalf("%s defaults: %+v", tc.test, o)
		}
	}
	var usage strings.Builder
	fs := newFlagSet(&opts{test: "write_bw"}, flag.ContinueOnError)
	fs.SetOutput(&usage)
	if err := fs.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	if !strings.Contains(usage.String(), "-D seconds") || strings.Contains(usage.String(), "(default 0s)") {
		t.Fatalf("usage: %s", usage.String())
	}
}
