package responses

import (
	"strings"
	"testing"
	"time"
)

// WithDefaults fills the documented defaults and keeps what is set;
// Validate names each negative field by its yaml path.
func TestConfigDefaultsAndValidate(t *testing.T) {
	want := Config{TTL: 30 * 24 * time.Hour, ConversationTTL: 30 * 24 * time.Hour, EventTTL: 24 * time.Hour,
		TurnTimeout: 10 * time.Minute, BackgroundWorkers: 4}
	if got := (Config{}).WithDefaults(); got != want {
		t.Errorf("WithDefaults() = %+v; want %+v", got, want)
	}
	if got := (Config{EventTTL: time.Hour}).WithDefaults().EventTTL; got != time.Hour {
		t.Errorf("WithDefaults changed a set event_ttl to %v", got)
	}
	if errs := want.Validate(); errs != nil {
		t.Errorf("defaults: Validate() = %v; want none", errs)
	}
	errs := Config{TTL: -1, ConversationTTL: -1, EventTTL: -1, TurnTimeout: -1, BackgroundWorkers: -1}.Validate()
	var all []string
	for _, err := range errs {
		all = append(all, err.Error())
	}
	for _, f := range []string{"ttl", "conversation_ttl", "event_ttl", "turn_timeout", "background_workers"} {
		if !strings.Contains(strings.Join(all, "\n"), "config: responses."+f+":") {
			t.Errorf("Validate() = %q; want an error naming responses.%s", all, f)
		}
	}
}
