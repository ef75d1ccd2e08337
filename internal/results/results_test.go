package results

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestMergeKeepsOtherKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	if err := Merge(path, "a", map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if err := Merge(path, "b", []int{2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := Merge(path, "a", "again"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc) != 2 || doc["a"] != "again" || len(doc["b"].([]any)) != 2 {
		t.Fatalf("merged %s", b)
	}
	if err := os.WriteFile(path, []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Merge(path, "c", 1); err == nil {
		t.Fatal("merged into a file that is not JSON")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1}, 2}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
