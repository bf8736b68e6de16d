package gateway

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/warmpath/warmpath/misses"
	"github.com/warmpath/warmpath/vllmsim"
)

// A 50-turn run chained with previous_response_id through the gateway (the
// openai-go client, API keys, four replicas): every chained turn is routed
// sticky, without the tokenizer, to the replica holding its prefix, and
// the fleet serves most of the prompt from cache. Another tenant cannot
// chain onto the run.
func TestResponsesChainedRunThroughGateway(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	client := func(key string) openai.Client {
		return openai.NewClient(option.WithBaseURL(gw.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	}
	a := client(newTenant(t, gw.URL, "chainer", ""))
	ctx := context.Background()
	const turns = 50
	prev := ""
	for i := range turns {
		p := responses.ResponseNewParams{Model: vllmsim.DefaultModel, Instructions: openai.String(words("instructions", 200)),
			Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("turn %d: %s", i, words(fmt.Sprint("q", i), 20)))},
			MaxOutputTokens: openai.Int(24)}
		if prev != "" {
			p.PreviousResponseID = openai.String(prev)
		}
		r, err := a.Responses.New(ctx, p)
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		prev = r.ID
	}
	sticky := counter(t, gw.obs.reg, "warmpath_routing_decisions_total", map[string]string{"reason": "sticky"})
	avoided := counter(t, gw.obs.reg, "warmpath_tokenizer_avoided_total", nil)
	prompt := counter(t, gw.obs.reg, "warmpath_prompt_tokens_total", map[string]string{"tenant": "chainer"})
	cached := counter(t, gw.obs.reg, "warmpath_cached_tokens_total", map[string]string{"tenant": "chainer"})
	t.Logf("%d turns: %v sticky, %v without the tokenizer, cached %.0f of %.0f prompt tokens (%.1f%%)",
		turns, sticky, avoided, cached, prompt, 100*cached/prompt)
	if sticky != turns-1 || avoided != turns-1 {
		t.Errorf("sticky %v, tokenizer avoided %v; want every chained turn (%d)", sticky, avoided, turns-1)
	}
	if cached/prompt < 0.9 {
		t.Errorf("cached-prefix fraction %.3f; want above 0.9", cached/prompt)
	}
	// A stored chain only appends: its misses add up, none a client break.
	if by := uncachedBy(t, gw, "chainer"); sum(by) != prompt-cached || by[misses.CauseClientBreak] != 0 {
		t.Errorf("uncached tokens by cause %v (sum %v); want prompt − cached = %v, none a client prefix break", by, sum(by), prompt-cached)
	}
	if n := counter(t, gw.obs.reg, "warmpath_requests_total", map[string]string{"route": "responses", "code": "200"}); n != turns {
		t.Errorf("warmpath_requests_total{route=responses,code=200} = %v; want %d", n, turns)
	}
	b := client(newTenant(t, gw.URL, "intruder", ""))
	_, err := b.Responses.New(ctx, responses.ResponseNewParams{Model: vllmsim.DefaultModel, PreviousResponseID: openai.String(prev),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("let me in")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "previous_response_not_found" {
		t.Errorf("another tenant chaining onto the run: %v; want 400 previous_response_not_found", err)
	}
}
