package gateway

import (
	"time"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
)

// turn is a request on its way through this gateway: the parsed request
// (package request) and what admission and routing learn of it here.
type turn struct {
	*request.R
	// bytesPerToken is the model's learned ratio (see tokenRatios), 0
	// while unknown; Do sets it before routing.
	bytesPerToken float64
	// early is the tokenization route started before the session lookup
	// (tokenizeEarly), nil when it did not.
	early *routing.TokenCall
	// placement is the request's routing, prepared before admission
	// (placement.go); nil until then.
	placement *placement
	// queueWait is the time spent in the fair queue.
	queueWait time.Duration
	// tokenized is the tokenizer call routing waited for, for the trace;
	// zero when it waited for none.
	tokenized tokenized
}

// tokenized is one tokenizer call as routing waited for it.
type tokenized struct {
	start, end time.Time
	source     string // tokenCall.source
	tokens     int
	err        error
}

// estimatedTokens guesses the prompt's token count from its text, at the
// model's learned bytes per token.
func (r *turn) estimatedTokens() int { return r.EstimatedTokens(r.bytesPerToken) }
