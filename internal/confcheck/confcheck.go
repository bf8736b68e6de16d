// Package confcheck holds the checks configuration blocks share, so that
// each block's Validate states its fields and not the rule.
package confcheck

import (
	"fmt"
	"time"
)

// Duration is a duration field of a block, named by its yaml key.
type Duration struct {
	Name  string
	Value time.Duration
}

// NonNegative returns an error for each negative field, named by its yaml
// path (block.name): "config: upstream.idle_timeout: -1s is negative".
func NonNegative(block string, fields ...Duration) []error {
	var errs []error
	for _, f := range fields {
		if f.Value < 0 {
			errs = append(errs, fmt.Errorf("config: %s.%s: %v is negative", block, f.Name, f.Value))
		}
	}
	return errs
}

// Field names a duration field by its yaml key.
func Field(name string, v time.Duration) Duration { return Duration{Name: name, Value: v} }
