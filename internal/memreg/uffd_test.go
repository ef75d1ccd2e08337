package memreg

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// goMover is a Mover in Go, for this package's tests only (HoldNeighbours
// says why a Go mover may not run where the runtime may stop the world):
// the same steps as the DAT provider's C one (dapl/move.c).
func goMover(uffd, memfd int, start, end uintptr, prot int) (bool, error) {
	n := end - start
	reg := uffdioRegister{rng: uffdioRange{uint64(start), uint64(n)}, mode: uffdRegisterMissing}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(uffd), ioctlUffdRegister, uintptr(unsafe.Pointer(&reg))); errno != 0 {
		return false, nil
	}
	rng := uffdioRange{uint64(start), uint64(n)}
	release := func() {
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(uffd), ioctlUffdUnregister, uintptr(unsafe.Pointer(&rng)))
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(uffd), ioctlUffdWake, uintptr(unsafe.Pointer(&rng)))
	}
	tmp, _, errno := unix.Syscall6(unix.SYS_MREMAP, start, n, n, unix.MREMAP_MAYMOVE|unix.MREMAP_DONTUNMAP, 0, 0)
	if errno != 0 {
		release()
		return false, nil
	}
	putBack := func(err error) (bool, error) {
		_, _, _ = unix.Syscall6(unix.SYS_MREMAP, tmp, n, n, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, start, 0)
		release()
		return true, err
	}
	for off := uintptr(0); off < n; {
		w, _, errno := unix.Syscall6(unix.SYS_PWRITE64, uintptr(memfd), tmp+off, n-off, start+off, 0, 0)
		if errno != 0 || w == 0 {
			return putBack(errno)
		}
		off += w
	}
	if _, _, errno := unix.Syscall6(unix.SYS_MMAP, start, n, uintptr(prot), unix.MAP_SHARED|unix.MAP_FIXED, uintptr(memfd), start); errno != 0 {
		return putBack(errno)
	}
	release()
	_, _, _ = unix.Syscall(unix.SYS_MUNMAP, tmp, n, 0)
	return true, nil
}
