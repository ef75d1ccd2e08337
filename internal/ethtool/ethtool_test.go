package ethtool_test

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/ethtool"
	"github.com/softrnic/softrnic/internal/topology"
)

// Every request about an interface the namespace does not have fails with
// ENODEV, and a name that does not fit struct ifreq with EINVAL; neither
// needs root.
func TestErrors(t *testing.T) {
	reads := map[string]func(string) error{
		"Driver":      func(n string) error { _, err := ethtool.Driver(n); return err },
		"GetChannels": func(n string) error { _, err := ethtool.GetChannels(n); return err },
		"GRO":         func(n string) error { _, err := ethtool.GRO(n); return err },
		"LRO":         func(n string) error { _, err := ethtool.LRO(n); return err },
	}
	for name, read := range reads {
		if err := read("srn-missing0"); !errors.Is(err, unix.ENODEV) {
			t.Errorf("%s of a missing interface: %v, want ENODEV", name, err)
		}
		for _, bad := range []string{"", strings.Repeat("x", unix.IFNAMSIZ)} {
			if err := read(bad); !errors.Is(err, unix.EINVAL) {
				t.Errorf("%s of %q: %v, want EINVAL", name, bad, err)
			}
		}
	}
}

// On a veth end in a namespace of its own the requests read what ip(8)
// made and what ethtool(8) shows and sets, and only from inside that
// namespace.
func TestVeth(t *testing.T) {
	tp := topology.NewTest(t, topology.Options{Queues: 3})
	a := tp.A
	do := func(fn func() error) {
		t.Helper()
		if err := a.Do(fn); err != nil {
			t.Fatal(err)
		}
	}
	ethtoolK := func(args ...string) {
		t.Helper()
		if out, err := a.Command("ethtool", append([]string{"-K", a.Link}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ethtool -K %v: %v: %s", args, err, out)
		}
	}
	// feature is what `ethtool -k` shows for a feature: true for on.
	feature := func(name string) bool {
		t.Helper()
		out, err := a.Command("ethtool", "-k", a.Link).CombinedOutput()
		if err != nil {
			t.Fatalf("ethtool -k: %v: %s", err, out)
		}
		for line := range strings.Lines(string(out)) {
			if v, ok := strings.CutPrefix(line, name+": "); ok {
				return strings.HasPrefix(v, "on")
			}
		}
		t.Fatalf("ethtool -k shows no %s:\n%s", name, out)
		return false
	}

	do(func() error {
		drv, err := ethtool.Driver(a.Link)
		if err != nil || drv != "veth" {
			t.Errorf("Driver: %q %v, want veth", drv, err)
		}
		return nil
	})
	// The queues ip(8) made, then fewer of them in use (ethtool -L).
	for _, c := range []struct {
		set    []string
		rx, tx uint32
	}{{nil, 3, 3}, {[]string{"rx", "2", "tx", "1"}, 2, 1}} {
		if c.set != nil {
			if out, err := a.Command("ethtool", append([]string{"-L", a.Link}, c.set...)...).CombinedOutput(); err != nil {
				t.Fatalf("ethtool -L %v: %v: %s", c.set, err, out)
			}
		}
		var ch ethtool.Channels
		var err error
		do(func() error { ch, err = ethtool.GetChannels(a.Link); return nil })
		want := ethtool.Channels{MaxRX: 3, MaxTX: 3, RX: c.rx, TX: c.tx}
		if err != nil || ch != want {
			t.Errorf("GetChannels after ethtool -L %v: %+v %v, want %+v", c.set, ch, err, want)
		}
	}
	for _, on := range []bool{true, false} {
		state := map[bool]string{true: "on", false: "off"}[on]
		ethtoolK("gro", state)
		var gro bool
		var err error
		do(func() error { gro, err = ethtool.GRO(a.Link); return nil })
		if err != nil || gro != on || gro != feature("generic-receive-offload") {
			t.Errorf("GRO after gro %s: %v %v", state, gro, err)
		}
	}
	// veth has no LRO: fixed off.
	var lro bool
	var err error
	do(func() error { lro, err = ethtool.LRO(a.Link); return nil })
	if err != nil || lro || feature("large-receive-offload") {
		t.Errorf("LRO: %v %v, want off", lro, err)
	}
	// A's interface is A's: B's namespace has no veth-a.
	if err := tp.B.Do(func() error { _, err := ethtool.Driver(a.Link); return err }); !errors.Is(err, unix.ENODEV) {
		t.Errorf("Driver of %s from B: %v, want ENODEV", a.Link, err)
	}
}
