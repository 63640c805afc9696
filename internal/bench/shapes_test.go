package bench

import "testing"

// A shape named with "+full" is its base shape beside the full queue; an
// unknown base is refused.
func TestShapeNamedFull(t *testing.T) {
	s, err := shapeNamed("keys1000+full", 20_000)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "keys1000+full" || !s.FullQueue || s.Keys != 1000 || s.Messages != 20_000 || s.MinRows != 1 || s.MaxRows != 5 {
		t.Fatalf("keys1000+full = %+v, want keys1000's keys, rows and messages, with the full queue", s)
	}
	if plain, _ := shapeNamed("keys1000", 20_000); plain.FullQueue {
		t.Fatal("keys1000 has the full queue")
	}
	if _, err := shapeNamed("nokeys+full", 20_000); err == nil {
		t.Fatal("an unknown base shape with +full was accepted")
	}
}
