// Package ethtool reads an interface's settings with the kernel's ethtool
// ioctl (SIOCETHTOOL), the requests that `ethtool -i`, `ethtool -l` and
// `ethtool -k` make.
//
// This is the only package of the tree that makes that system call; the
// rest uses its typed functions. It reads and never sets: the tests and
// hack/topology.sh change an interface's features with ethtool(8), the
// command an operator would type.
//
// # Namespaces
//
// Each function opens a socket for its request, and the socket belongs to
// the network namespace of the calling OS thread: the interface is looked
// up there. To read an interface of another namespace, call from a thread
// that has entered it (topology.Host.Do, or a poller's locked thread).
package ethtool

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Driver is the name of the interface's driver (ETHTOOL_GDRVINFO), "veth"
// for a veth end.
func Driver(ifname string) (string, error) {
	var info unix.EthtoolDrvinfo // starts with cmd, like every request
	info.Cmd = unix.ETHTOOL_GDRVINFO
	if err := ioctl(ifname, "driver", unsafe.Pointer(&info)); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(info.Driver[:]), nil
}

// Channels are an interface's queues as ethtool counts them
// (struct ethtool_channels, `ethtool -l`): the most the driver allows and
// the current number of each kind. A driver counts a queue that receives
// and sends as one combined channel, not as RX and TX; veth counts RX and
// TX.
type Channels struct {
	MaxRX, MaxTX, MaxOther, MaxCombined uint32
	RX, TX, Other, Combined             uint32
}

// GetChannels reads the interface's channels (ETHTOOL_GCHANNELS). A
// driver without channels fails with EOPNOTSUPP (errors.Is).
func GetChannels(ifname string) (Channels, error) {
	var req struct {
		cmd uint32
		ch  Channels // the fields in the kernel's order
	}
	req.cmd = unix.ETHTOOL_GCHANNELS
	if err := ioctl(ifname, "channels", unsafe.Pointer(&req)); err != nil {
		return Channels{}, err
	}
	return req.ch, nil
}

// GRO reports whether generic receive offload is on (ETHTOOL_GGRO, the
// rx-gro feature).
func GRO(ifname string) (bool, error) {
	v, err := value(ifname, "GRO", unix.ETHTOOL_GGRO)
	return v != 0, err
}

// ethFlagLRO is ETH_FLAG_LRO of the ETHTOOL_GFLAGS word.
const ethFlagLRO = 1 << 15

// LRO reports whether large receive offload is on (ETHTOOL_GFLAGS,
// ETH_FLAG_LRO; the large-receive-offload feature).
func LRO(ifname string) (bool, error) {
	v, err := value(ifname, "flags", unix.ETHTOOL_GFLAGS)
	return v&ethFlagLRO != 0, err
}

// value makes a request whose answer is one word (struct ethtool_value).
func value(ifname, what string, cmd uint32) (uint32, error) {
	v := [2]uint32{cmd, 0}
	if err := ioctl(ifname, what, unsafe.Pointer(&v)); err != nil {
		return 0, err
	}
	return v[1], nil
}

// ioctl makes one SIOCETHTOOL request about ifname. data points at the
// command's structure, whose first word is the command and which the
// kernel fills in; what names the request in the error.
func ioctl(ifname, what string, data unsafe.Pointer) error {
	// struct ifreq: the name, then ifr_data, the first member of a union
	// that struct ifmap makes 24 octets long on 64-bit hosts.
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [24 - unsafe.Sizeof(uintptr(0))]byte
	}
	if len(ifname) == 0 || len(ifname) >= len(ifr.name) {
		return fmt.Errorf("ethtool: %s of %q: %w", what, ifname, unix.EINVAL)
	}
	copy(ifr.name[:], ifname)
	ifr.data = data
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool: %s of %s: socket: %w", what, ifname, err)
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return fmt.Errorf("ethtool: %s of %s: %w", what, ifname, errno)
	}
	return nil
}
