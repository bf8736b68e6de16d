package responses

import (
	"fmt"
	"github.com/warmpath/warmpath/internal/confcheck"
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
	errs := confcheck.NonNegative("responses", confcheck.Field("ttl", c.TTL), confcheck.Field("conversation_ttl", c.ConversationTTL),
		confcheck.Field("event_ttl", c.EventTTL), confcheck.Field("turn_timeout", c.TurnTimeout))
	if c.BackgroundWorkers < 0 {
		errs = append(errs, fmt.Errorf("config: responses.background_workers: %d is negative", c.BackgroundWorkers))
	}
	return errs
}
