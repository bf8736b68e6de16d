package gateway

import (
	"context"
	"net/http"

	"github.com/warmpath/warmpath/anthropic"
	"github.com/warmpath/warmpath/tenancy"
)

// newMessages builds the Anthropic Messages API (package anthropic) over
// the gateway's routed client: each request is a chat turn through
// Gateway.Do, its session keyed by the Claude Code session headers, its
// prompt tokens counted by the routing tokenizer. It needs no Redis.
func (g *Gateway) newMessages() (*anthropic.Service, error) {
	return anthropic.New(anthropic.Options{
		Authenticate: g.authenticateMessages,
		CountTokens:  g.countTokens,
		Models:       g.fleet.Models,
		MaxBodyBytes: g.cfg.MaxBodyBytes,
		Logger:       g.log.With("component", "anthropic"),
	}, frontChat{g})
}

// authenticateMessages is the tenancy check of /v1/messages: the same
// keys and tokens as the OpenAI routes (x-api-key or bearer), answered in
// Anthropic's envelope by the caller.
func (g *Gateway) authenticateMessages(ctx context.Context, h http.Header) (context.Context, error) {
	p, err := g.obs.trace.authenticate(g.tenants.auth.Authenticate)(ctx, h)
	if err != nil {
		return ctx, err
	}
	return tenancy.NewContext(ctx, p), nil
}

// messagesHandler mounts the Messages API under the gateway's request
// metrics.
func (g *Gateway) messagesHandler() http.HandlerFunc {
	return g.serveFront("messages", g.obs.trace.front(g.fronts.messages.Handler(), messagesOp, noID))
}
