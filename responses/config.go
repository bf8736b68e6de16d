package responses

import (
	"fmt"
	"time"
)

// Config tunes the Responses and Conversations APIs (responses: in the
// gateway's configuration file). Zero fields take the defaults
// (WithDefaults); negative ones are errors (Validate).
type Config struct {
	// TTL is how long a stored response and its items live after its
	// chain was last continued; default 30 days.
	TTL time.Duration `yaml:"ttl"`
	// ConversationTTL is how long a conversation and its items live
	// after their last use; default 30 days. (OpenAI keeps conversations
	// without a TTL; a shared Redis needs a bound.)
	ConversationTTL time.Duration `yaml:"conversation_ttl"`
	// EventTTL is how long a background response's event buffer is kept
	// after its last event, for GET ?stream=true replays; default 24h.
	EventTTL time.Duration `yaml:"event_ttl"`
	// TurnTimeout bounds one upstream turn, from the request to the last
	// chunk; default 10m.
	TurnTimeout time.Duration `yaml:"turn_timeout"`
	// BackgroundWorkers is how many background responses one Service (one
	// gateway) runs at once; default 4.
	BackgroundWorkers int `yaml:"background_workers"`
}

// WithDefaults returns c with every zero field at its default.
func (c Config) WithDefaults() Config {
	c.TTL = orDefault(c.TTL, DefaultTTL)
	c.ConversationTTL = orDefault(c.ConversationTTL, DefaultTTL)
	c.EventTTL = orDefault(c.EventTTL, DefaultEventTTL)
	c.TurnTimeout = orDefault(c.TurnTimeout, DefaultTurnTimeout)
	c.BackgroundWorkers = orDefault(c.BackgroundWorkers, DefaultBackgroundWorkers)
	return c
}

// Validate checks c; its errors name the field by its yaml path
// (responses.ttl, …).
func (c Config) Validate() []error {
	var errs []error
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"ttl", c.TTL}, {"conversation_ttl", c.ConversationTTL}, {"event_ttl", c.EventTTL}, {"turn_timeout", c.TurnTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("config: responses.%s: %v is negative", d.field, d.v))
		}
	}
	if c.BackgroundWorkers < 0 {
		errs = append(errs, fmt.Errorf("config: responses.background_workers: %d is negative", c.BackgroundWorkers))
	}
	return errs
}
