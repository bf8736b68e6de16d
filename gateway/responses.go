package gateway

import (
	"context"
	"net/http"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/responses"
	"github.com/warmpath/warmpath/session"
	"github.com/warmpath/warmpath/tenancy"
)

// newResponses builds the Responses API over the gateway's routed client.
// It needs Redis (its state is shared by every gateway); without one it is
// off and its routes answer 404.
func (g *Gateway) newResponses() (*responses.Service, error) {
	if g.store.rdb == nil {
		g.log.Info("responses: no Redis configured; /v1/responses and /v1/conversations are off")
		return nil, nil
	}
	return responses.New(responses.Options{
		Redis:        g.store.rdb,
		KeyPrefix:    g.cfg.Redis.KeyPrefix,
		Tenant:       tenantOf,
		Config:       g.cfg.Responses,
		MaxBodyBytes: g.cfg.MaxBodyBytes,
		Models:       g.fleet.Models,
		Tokenize:     g.countTokens,
		Logger:       g.log.With("component", "responses"),
		Registerer:   g.obs.wrapped,
	}, frontChat{g})
}

// tenantOf is the authenticated tenant of a request's context.
func tenantOf(ctx context.Context) string {
	if p, ok := tenancy.FromContext(ctx); ok {
		return p.TenantID
	}
	return ""
}

// frontChat is the routed client as the API fronts see it
// (chatapi.Chat, used by packages responses and anthropic): each turn is
// a chat-completions request through Gateway.Do, keyed by the session the
// front names (a Responses chain) or the one Do derives.
type frontChat struct{ g *Gateway }

var _ chatapi.Chat = frontChat{}

// Complete implements chatapi.Chat. A turn runs as the principal of the
// request it came with; one of another tenant (Turn.Tenant), such as a
// background turn whose request is gone, runs as that tenant
// (tenancy.Authenticator.ForTenant: the tenant's limits, not its key's).
// A refusal is an *apierror.Error (complete).
func (c frontChat) Complete(ctx context.Context, t chatapi.Turn) (*http.Response, error) {
	p, ok := tenancy.FromContext(ctx)
	if !ok || (t.Tenant != "" && p.TenantID != t.Tenant) {
		var err error
		if p, err = c.g.tenants.auth.ForTenant(ctx, t.Tenant); err != nil {
			return nil, err
		}
	}
	req, err := request.Parse(request.Chat, t.Header, t.Body, p)
	if err != nil {
		return nil, err
	}
	if t.Session != "" {
		req.SetSession(session.Chain(p.TenantID, t.Session))
	}
	req.SetBackground(t.Background)
	ctx, span := c.g.obs.trace.backgroundSpan(ctx, t)
	resp, err := c.g.complete(ctx, req)
	endWithBody(span, resp, err)
	return resp, err
}

// complete is Do for an API front (the Chat of packages responses and
// anthropic): the upstream's answer when it succeeded, else an error
// value, an *apierror.Error for every refusal (the gateway's own, or the
// upstream's error response read once here: apierror.FromResponse), so
// no front parses an error body.
func (g *Gateway) complete(ctx context.Context, req *request.R) (*http.Response, error) {
	resp, err := g.Do(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		return nil, apierror.FromResponse(resp)
	}
	return resp, nil
}

// countTokens counts a chat body's prompt tokens with the tokenizer
// routing uses (POST /v1/responses/input_tokens).
func (g *Gateway) countTokens(ctx context.Context, chatBody []byte) (int, error) {
	p, _ := tenancy.FromContext(ctx)
	req, err := request.Parse(request.Chat, http.Header{}, chatBody, p)
	if err != nil {
		return 0, err
	}
	ids, err := g.router.Tokenize(ctx, req)
	if err != nil {
		return 0, apierror.Unavailable(err, "no replica could count the tokens; try again shortly")
	}
	return len(ids), nil
}
