// Package tun opens Linux TUN devices: virtual network interfaces whose
// "wire" is a file descriptor in this process. Every IP packet the kernel
// routes out of the interface is one read(2) on the descriptor; every write(2)
// of one IP packet is received by the kernel as if it had arrived on the
// interface.
//
// This is the only package of the tree that makes the TUN system calls; the
// rest uses Device.
//
// # Goroutines
//
// The package starts none. A Device is an *os.File on a non-blocking
// descriptor, registered with Go's network poller: a ReadPacket with no packet
// waiting parks the goroutine (not an OS thread) until one arrives, its read
// deadline passes or Close is called. One reader and one writer may run at the
// same time; Close may be called from any goroutine.
//
// # Namespaces
//
// The device is created in the network namespace of the calling OS thread at
// the moment of Open, and stays there. To put it in another namespace, call
// Open from code run by topology.Host.Do. The descriptor is not tied to the
// thread: after Open returns, any goroutine may read and write it.
package tun

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// cloneDevice is the TUN/TAP clone device: each open(2) of it yields a fresh
// descriptor that TUNSETIFF then attaches to a new (or existing) interface.
const cloneDevice = "/dev/net/tun"

// ErrTruncated is returned by ReadPacket when the packet was longer than the
// buffer. The bytes that did not fit are lost: the kernel has dequeued the
// whole packet.
var ErrTruncated = errors.New("tun: packet longer than read buffer")

// Device is an open TUN interface in IFF_TUN|IFF_NO_PI mode: reads and writes
// carry bare IP packets (IPv4 or IPv6, told apart by the version nibble), with
// no struct tun_pi in front and no virtio_net_hdr (IFF_VNET_HDR is not set, so
// the kernel never hands over GSO super-packets or partial checksums, and
// expects none).
//
// The interface lives as long as the descriptor: it is not made persistent
// (TUNSETPERSIST), so Close removes it, with its addresses and routes.
type Device struct {
	file *os.File
	fd   int // file's descriptor, kept to avoid os.File.Fd (see Fd)
	name string
}

// Open creates a TUN interface named name in the calling thread's network
// namespace and returns the descriptor attached to it. An empty name lets the
// kernel pick "tun%d"; Name reports the result. The interface is created
// down, with no address; bringing it up, its MTU and routes are the caller's
// business (ip link, ip route).
//
// In system-call terms:
//
//	fd = open("/dev/net/tun", O_RDWR|O_NONBLOCK|O_CLOEXEC)
//	ioctl(fd, TUNSETIFF, &ifreq{ifr_name: name, ifr_flags: IFF_TUN|IFF_NO_PI})
//
// TUNSETIFF needs CAP_NET_ADMIN in the namespace. The descriptor is opened
// non-blocking so that os.NewFile registers it with the network poller.
func Open(name string) (*Device, error) {
	ifr, err := unix.NewIfreq(name) // rejects names of IFNAMSIZ bytes or more
	if err != nil {
		return nil, fmt.Errorf("tun: open %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)

	fd, err := unix.Open(cloneDevice, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("tun: open %s: %w", cloneDevice, err)
	}
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tun: TUNSETIFF %q: %w", name, err)
	}
	// The kernel writes the final name back into ifr_name.
	d := &Device{fd: fd, name: ifr.Name()}
	d.file = os.NewFile(uintptr(fd), cloneDevice+":"+d.name)
	return d, nil
}

// Name is the interface name, as ip(8) shows it inside the namespace.
func (d *Device) Name() string { return d.name }

// ReadPacket reads one IP packet into buf and returns its length. It blocks
// until a packet is queued on the interface, the read deadline passes
// (an error matching os.ErrDeadlineExceeded) or the Device is closed (an
// error matching os.ErrClosed).
//
// buf should hold the interface MTU. The kernel cuts a longer packet to
// len(buf) without saying so; ReadPacket notices from the IP header's length
// field and returns len(buf) with ErrTruncated.
func (d *Device) ReadPacket(buf []byte) (int, error) {
	n, err := d.file.Read(buf)
	if err != nil {
		return 0, err
	}
	// read(2) on a TUN descriptor copies what fits, drops the rest and
	// returns the copied length: only the IP header can tell.
	if n == len(buf) && ipLen(buf) > n {
		return n, ErrTruncated
	}
	return n, nil
}

// ipLen is the length an IP packet's header claims, or 0 if b is too short
// to tell or is an IPv6 jumbogram.
func ipLen(b []byte) int {
	switch {
	case len(b) >= 4 && b[0]>>4 == 4:
		return int(b[2])<<8 | int(b[3]) // total length, header included
	case len(b) >= 6 && b[0]>>4 == 6:
		if pl := int(b[4])<<8 | int(b[5]); pl != 0 {
			return 40 + pl // payload length excludes the fixed header
		}
	}
	return 0
}

// WritePacket hands one IP packet to the kernel, which receives it on the
// interface (and routes, forwards or delivers it like any other). pkt must be
// a whole IPv4 or IPv6 packet starting with its IP header; the kernel drops a
// malformed one, usually without an error here. Checksums are not computed
// for the caller.
func (d *Device) WritePacket(pkt []byte) error {
	n, err := d.file.Write(pkt)
	if err != nil {
		return err
	}
	if n != len(pkt) {
		return fmt.Errorf("tun: short write: %d of %d bytes", n, len(pkt))
	}
	return nil
}

// SetReadDeadline sets the time after which a pending or future ReadPacket
// fails with os.ErrDeadlineExceeded. The zero time means no deadline.
func (d *Device) SetReadDeadline(t time.Time) error { return d.file.SetReadDeadline(t) }

// Fd returns the descriptor, for batch I/O (a read loop until EAGAIN, io_uring)
// that the *os.File cannot express. It is non-blocking: a read with nothing
// queued fails with EAGAIN. It stays owned by the Device: do not close it,
// and do not use it after Close, when the number may already name another file.
//
// Unlike os.File.Fd, Fd leaves the descriptor non-blocking and the deadlines
// working.
func (d *Device) Fd() int { return d.fd }

// Close closes the descriptor, which removes the interface. A ReadPacket
// blocked in another goroutine returns with an error matching os.ErrClosed.
// A second Close returns such an error too.
func (d *Device) Close() error { return d.file.Close() }
