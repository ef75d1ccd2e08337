// Package results writes benchmark results as JSON: a file of their own,
// or one key of make bench's bench/results.json, which several programs
// (softrnic-bench, softrnic-scale, softrnic-lossgrid) fill in turn.
package results

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
)

// Write writes v to path, indented.
func Write(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Merge sets key in the JSON object at path to v, keeping what else the
// object holds; a missing file is created.
func Merge(path, key string, v any) error {
	doc := map[string]json.RawMessage{}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, &doc); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	doc[key] = raw
	return Write(path, doc)
}

// Median is the middle of vs, or the mean of the middle two (0 for none):
// what a benchmark of alternated or repeated rounds reads.
func Median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(vs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
