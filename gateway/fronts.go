package gateway

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/anthropic"
	"github.com/warmpath/warmpath/responses"
)

// fronts are the API fronts that translate to a chat request and back
// over the routed client (Do): the Responses and Conversations APIs and
// the Anthropic Messages API.
type fronts struct {
	responses *responses.Service // nil without Redis
	messages  *anthropic.Service
}

// run starts the Responses API's background workers under eg.
func (f *fronts) run(ctx context.Context, eg *errgroup.Group) {
	if f.responses != nil {
		eg.Go(func() error { return ignoreCanceled(f.responses.Run(ctx)) })
	}
}
