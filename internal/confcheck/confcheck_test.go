package confcheck

import (
	"testing"
	"time"
)

// Each negative field is named by its yaml path; zero and positive pass.
func TestNonNegative(t *testing.T) {
	errs := NonNegative("upstream", Field("a", 0), Field("b", -time.Second), Field("c", time.Second), Field("d", -1))
	if len(errs) != 2 || errs[0].Error() != "config: upstream.b: -1s is negative" || errs[1].Error() != "config: upstream.d: -1ns is negative" {
		t.Errorf("errors %v; want upstream.b and upstream.d", errs)
	}
	if errs := NonNegative("health"); errs != nil {
		t.Errorf("no fields: %v", errs)
	}
}
