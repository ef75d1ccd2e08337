package xsk

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Errors, testable with errors.Is.
var (
	// ErrInvalidOptions reports options the kernel would refuse, or options
	// of a shared socket that contradict the UMEM's first socket.
	ErrInvalidOptions = errors.New("xsk: invalid options")
	// ErrClosed reports use of a closed UMEM or socket.
	ErrClosed = errors.New("xsk: closed")
	// ErrInUse reports closing a UMEM that sockets still use.
	ErrInUse = errors.New("xsk: UMEM still has open sockets")
	// ErrNoZeroCopy reports that zero-copy mode was required and the device
	// (or its driver) cannot do it.
	ErrNoZeroCopy = errors.New("xsk: zero-copy not supported by the device")
)

// Defaults of UMEMOptions.
const (
	DefaultFrameSize  = 4096
	DefaultFrameCount = 4096
)

// minFrameSize is the kernel's XDP_UMEM_MIN_CHUNK_SIZE.
const minFrameSize = 2048

// UMEMOptions describe a UMEM. The zero value is 4096 frames of 4096 bytes
// with no headroom.
type UMEMOptions struct {
	// FrameSize is the size of each frame in bytes: a power of two from 2048
	// to the page size. A frame holds one packet. Default 4096.
	FrameSize uint32
	// FrameCount is the number of frames. Default 4096.
	FrameCount uint32
	// Headroom is reserved by the kernel in front of every received packet,
	// in addition to its own XDP_PACKET_HEADROOM (256 bytes) in copy mode.
	// It must leave room for a packet: at most FrameSize-257. Default 0.
	Headroom uint32
	// Name names the memfd, as /proc/<pid>/fd shows it. Default "xsk-umem".
	Name string
}

func (o *UMEMOptions) setDefaults() error {
	if o.FrameSize == 0 {
		o.FrameSize = DefaultFrameSize
	}
	if o.FrameCount == 0 {
		o.FrameCount = DefaultFrameCount
	}
	if o.Name == "" {
		o.Name = "xsk-umem"
	}
	page := uint32(unix.Getpagesize())
	if !isPowerOfTwo(o.FrameSize) || o.FrameSize < minFrameSize || o.FrameSize > page {
		return fmt.Errorf("%w: frame size %d is not a power of two from %d to %d",
			ErrInvalidOptions, o.FrameSize, minFrameSize, page)
	}
	if o.Headroom >= o.FrameSize-unix.XDP_PACKET_HEADROOM {
		return fmt.Errorf("%w: headroom %d leaves no room in a %d-byte frame",
			ErrInvalidOptions, o.Headroom, o.FrameSize)
	}
	if uint64(o.FrameSize)*uint64(o.FrameCount) > 1<<40 {
		return fmt.Errorf("%w: %d frames of %d bytes is too large", ErrInvalidOptions,
			o.FrameCount, o.FrameSize)
	}
	return nil
}

// UMEM is the packet memory that AF_XDP sockets share with the kernel: a
// memfd of FrameCount frames of FrameSize bytes, mapped into this process.
// Addresses in descriptors and in the fill and completion rings are byte
// offsets into it.
//
// A UMEM is registered with the kernel on the first socket made over it
// (NewSocket), not by NewUMEM: the registration socket belongs to the network
// namespace of the thread that creates it, and the first socket is created
// where the interface is.
type UMEM struct {
	mem        []byte
	memfd      int
	frameSize  uint32
	frameCount uint32
	headroom   uint32

	mu      sync.Mutex // guards what follows; control path only
	sockets []*Socket  // open sockets over this UMEM, oldest first
	closed  bool
	// Of the socket that registered the UMEM, which the others inherit
	// (the kernel copies them into every shared socket's binding).
	needWakeup bool
}

// NewUMEM creates the memfd, sizes it and maps it shared and populated.
func NewUMEM(opts UMEMOptions) (_ *UMEM, err error) {
	if err := opts.setDefaults(); err != nil {
		return nil, fmt.Errorf("new umem: %w", err)
	}
	size := int(opts.FrameSize) * int(opts.FrameCount)
	fd, err := unix.MemfdCreate(opts.Name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("new umem: memfd_create: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, fmt.Errorf("new umem: ftruncate %d: %w", size, err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("new umem: mmap %d bytes: %w", size, err)
	}
	return &UMEM{
		mem:        mem,
		memfd:      fd,
		frameSize:  opts.FrameSize,
		frameCount: opts.FrameCount,
		headroom:   opts.Headroom,
	}, nil
}

// FrameSize returns the size of a frame in bytes.
func (u *UMEM) FrameSize() uint32 { return u.frameSize }

// FrameCount returns the number of frames.
func (u *UMEM) FrameCount() uint32 { return u.frameCount }

// Headroom returns the headroom the kernel leaves in front of received
// packets (the option; the kernel adds its own in copy mode).
func (u *UMEM) Headroom() uint32 { return u.headroom }

// Bytes returns the whole mapped region.
func (u *UMEM) Bytes() []byte { return u.mem }

// MemFD returns the memfd backing the UMEM, for mapping it elsewhere. It
// stays owned by the UMEM.
func (u *UMEM) MemFD() int { return u.memfd }

// Frame returns the bytes from addr to the end of the frame that holds addr:
// where a packet to transmit is written, starting at the frame base plus
// whatever headroom the caller keeps.
func (u *UMEM) Frame(addr uint64) []byte {
	end := addr&^uint64(u.frameSize-1) + uint64(u.frameSize)
	return u.mem[addr:end:end]
}

// Packet returns the bytes of the packet d describes. They stay valid while
// the caller owns the frame.
func (u *UMEM) Packet(d Desc) []byte {
	end := d.Addr + uint64(d.Len)
	return u.mem[d.Addr:end:end]
}

// Close unmaps the region and closes the memfd. It fails with ErrInUse while
// sockets over the UMEM are open. Closing twice returns nil.
func (u *UMEM) Close() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil
	}
	if n := len(u.sockets); n > 0 {
		return fmt.Errorf("close umem: %d sockets open: %w", n, ErrInUse)
	}
	u.closed = true
	err := unix.Munmap(u.mem)
	u.mem = nil
	if cerr := unix.Close(u.memfd); err == nil {
		err = cerr
	}
	u.memfd = -1
	if err != nil {
		return fmt.Errorf("close umem: %w", err)
	}
	return nil
}
