package routing

import "sync"

// Learning the ratio: each completed response's usage.prompt_tokens moves
// the model's bytes-per-token ratio a ratioWeight of the way to the
// response's own (the first one sets it); at most ratioModels models are
// tracked (the served ones, since only replicas' answers teach it).
const (
	ratioWeight = 1.0 / 8
	ratioModels = 1024
)

// tokenRatios learns, per model, how many bytes of request text make one
// prompt token, as an exponentially weighted mean over the requests whose
// answer reported usage. Prompts are estimated with it wherever they are
// not tokenized (a sticky turn's first guess, admission, a replica fleet
// without /tokenize), instead of a fixed four bytes a token that templates,
// code and non-English text make wrong by half or more. It is safe for
// concurrent use.
type tokenRatios struct {
	mu sync.RWMutex // guards m
	m  map[string]float64
}

func newTokenRatios() *tokenRatios { return &tokenRatios{m: map[string]float64{}} }

// get returns model's bytes per token, 0 while unknown.
func (t *tokenRatios) get(model string) float64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.m[model]
}

// observe learns from one answered request: textBytes of text made
// promptTokens tokens.
func (t *tokenRatios) observe(model string, textBytes, promptTokens int) {
	if textBytes <= 0 || promptTokens <= 0 {
		return
	}
	r := float64(textBytes) / float64(promptTokens)
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.m[model]
	switch {
	case ok:
		t.m[model] = old + ratioWeight*(r-old)
	case len(t.m) < ratioModels:
		t.m[model] = r
	}
}
