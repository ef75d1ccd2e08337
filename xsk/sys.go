package xsk

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The AF_XDP socket options that x/sys/unix has no typed wrapper for, and the
// wakeup calls, which must not allocate: the rest of the package calls these.

// setsockoptXDP sets a SOL_XDP option from the size bytes at p.
func setsockoptXDP(fd, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt),
		uintptr(p), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

// getsockoptXDP reads a SOL_XDP option into the size bytes at p and returns
// how many the kernel wrote.
func getsockoptXDP(fd, opt int, p unsafe.Pointer, size uintptr) (uintptr, error) {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt),
		uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0, e
	}
	return uintptr(l), nil
}

// addressOf returns the virtual address of b's first byte, for XDP_UMEM_REG.
func addressOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// registerUMEM is setsockopt(XDP_UMEM_REG).
func registerUMEM(fd int, reg *unix.XDPUmemReg) error {
	return setsockoptXDP(fd, unix.XDP_UMEM_REG, unsafe.Pointer(reg), unsafe.Sizeof(*reg))
}

// setRingSize is setsockopt(XDP_RX_RING, XDP_TX_RING, XDP_UMEM_FILL_RING or
// XDP_UMEM_COMPLETION_RING).
func setRingSize(fd, opt int, size uint32) error {
	return unix.SetsockoptInt(fd, unix.SOL_XDP, opt, int(size))
}

// mmapOffsets is getsockopt(XDP_MMAP_OFFSETS). Kernels before 5.4 report the
// layout without the flags field; they are not supported.
func mmapOffsets(fd int) (unix.XDPMmapOffsets, error) {
	var off unix.XDPMmapOffsets
	n, err := getsockoptXDP(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off))
	if err != nil {
		return off, err
	}
	if n != unsafe.Sizeof(off) {
		return off, unix.EPROTONOSUPPORT
	}
	return off, nil
}

// xdpOptions is getsockopt(XDP_OPTIONS): XDP_OPTIONS_ZEROCOPY when bound in
// zero-copy mode.
func xdpOptions(fd int) (uint32, error) {
	var flags uint32
	_, err := getsockoptXDP(fd, unix.XDP_OPTIONS, unsafe.Pointer(&flags), unsafe.Sizeof(flags))
	return flags, err
}

// statistics is getsockopt(XDP_STATISTICS). Older kernels fill only the first
// three counters; the others stay zero.
func statistics(fd int) (unix.XDPStatistics, error) {
	var st unix.XDPStatistics
	_, err := getsockoptXDP(fd, unix.XDP_STATISTICS, unsafe.Pointer(&st), unsafe.Sizeof(st))
	return st, err
}

// sendtoKick is sendto(fd, NULL, 0, MSG_DONTWAIT, NULL, 0): the TX wakeup.
func sendtoKick(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}

// recvfromKick is recvfrom(fd, NULL, 0, MSG_DONTWAIT, NULL, NULL): the fill
// ring wakeup.
func recvfromKick(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}

// mapRing maps one ring of a socket: the ring header at the offsets the
// kernel reported, then size entries of entrySize bytes.
func mapRing(fd int, pgoff int64, off unix.XDPRingOffset, size, entrySize uint32) ([]byte, error) {
	length := int(off.Desc + uint64(size)*uint64(entrySize))
	return unix.Mmap(fd, pgoff, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
}
