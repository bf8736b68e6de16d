package routing

import (
	"time"

	"github.com/warmpath/warmpath/gateway/request"
)

// Turn is a request on its way through the gateway: the parsed request
// (package request) and what admission and routing learn of it.
type Turn struct {
	*request.R
	// BytesPerToken is the model's learned ratio (see tokenRatios), 0
	// while unknown; set before routing.
	BytesPerToken float64
	// early is the tokenization route started before the session lookup
	// (tokenizeEarly), nil when it did not.
	early *TokenCall
	// Placement is the request's routing, prepared before admission
	// (Router.Prepare); nil until then.
	Placement *Placement
	// QueueWait is the time spent in the fair queue.
	QueueWait time.Duration
	// Tokenized is the tokenizer call routing waited for, for the trace;
	// zero when it waited for none.
	Tokenized Tokenized
}

// Tokenized is one tokenizer call as routing waited for it.
type Tokenized struct {
	Start, End time.Time
	Source     string // TokenCall.Source
	Tokens     int
	Err        error
}

// Estimate guesses the prompt's token count from its text, at the
// model's learned bytes per token.
func (r *Turn) Estimate() int { return r.EstimatedTokens(r.BytesPerToken) }
