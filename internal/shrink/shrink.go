// Package shrink gives back the memory of maps that were large once: a Go
// map keeps the size of its peak however many entries are deleted, so the
// tables of ten thousand connections come and gone would hold theirs for
// the life of the daemon (issue 16).
package shrink

// Map returns m, or, once m holds at most a quarter of the most it held
// and that was many, a copy of it sized to what it holds. Call it after a
// delete; most is the map's own high-water mark, kept by Map. The copy
// costs as many steps as the deletes that led to it, so deleting stays
// O(1) amortized.
func Map[K comparable, V any](m map[K]V, most *int) map[K]V {
	*most = max(*most, len(m)+1) // its size before the delete
	if *most < From || len(m) > *most/4 {
		return m
	}
	n := make(map[K]V, len(m))
	for k, v := range m {
		n[k] = v
	}
	*most = len(n)
	return n
}

// From is the size below which a map is left as it is.
const From = 64
