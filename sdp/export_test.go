package sdp

// For the package's external tests: the size of each Read Zcopy region,
// and the SrcAvails a connection takes outstanding.
const (
	ZSize      = zSize
	MaxAdverts = maxAdverts
)
