package record

import (
	"strings"
	"testing"
)

// WithDefaults fills the documented defaults; Validate refuses negative
// sizes only when recording is on, naming the yaml path.
func TestConfigDefaultsAndValidate(t *testing.T) {
	got := Config{Dir: "d"}.WithDefaults()
	if got.MaxFileBytes != 64<<20 || got.Keep != 8 || got.Queue != DefaultQueue {
		t.Errorf("WithDefaults() = %+v; want 64 MiB files, 8 kept, queue %d", got, DefaultQueue)
	}
	if errs := got.Validate(); errs != nil {
		t.Errorf("defaults: Validate() = %v; want none", errs)
	}
	if errs := (Config{Keep: -1}).Validate(); errs != nil {
		t.Errorf("recording off: Validate() = %v; want none", errs)
	}
	errs := Config{Dir: "d", MaxFileBytes: -1, Keep: -1}.Validate()
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "record.max_file_bytes") || !strings.Contains(errs[1].Error(), "record.keep") {
		t.Errorf("Validate() = %v; want errors naming record.max_file_bytes and record.keep", errs)
	}
}
