package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
)

// tokenizer gets a prompt's token ids, after the chat template, from a
// replica's POST /tokenize (vLLM serves it; so does the simulator), and
// caches them by request body: agents often resend an identical prompt
// (retries, parallel tool calls), and every replica tokenizes alike.
// Concurrent requests for the same prompt share one call.
type tokenizer struct {
	client *http.Client
	cache  *lru.Cache[uint64, []uint32] // safe for concurrent use
	calls  singleflight.Group           // in-flight calls by body hash
	m      *metrics
}

func newTokenizer(client *http.Client, size int, m *metrics) *tokenizer {
	c, _ := lru.New[uint64, []uint32](size) // errs only for a non-positive size
	return &tokenizer{client: client, cache: c, m: m}
}

// maxTokenizeResponse bounds a /tokenize reply (a 128k-token prompt is
// under 1 MiB of JSON).
const maxTokenizeResponse = 16 << 20

// tokens returns r's prompt token ids, asking the replica at baseURL when
// they are not cached.
func (t *tokenizer) tokens(ctx context.Context, baseURL string, r *Request) ([]uint32, error) {
	if ids, ok := r.promptTokenIDs(); ok {
		return ids, nil
	}
	body := r.tokenizeBody()
	if body == nil {
		return nil, fmt.Errorf("gateway: prompt cannot be tokenized")
	}
	key := xxhash.Sum64(body)
	if ids, ok := t.cache.Get(key); ok {
		t.m.tokenizer.WithLabelValues("cached").Inc()
		return ids, nil
	}
	// The shared call outlives any one caller's cancellation (the client's
	// timeout still bounds it); each caller waits only as long as its own
	// context allows.
	ch := t.calls.DoChan(strconv.FormatUint(key, 16), func() (any, error) {
		ids, err := t.call(context.WithoutCancel(ctx), baseURL, body)
		if err != nil {
			t.m.tokenizer.WithLabelValues("error").Inc()
			return nil, err
		}
		t.m.tokenizer.WithLabelValues("ok").Inc()
		t.cache.Add(key, ids)
		return ids, nil
	})
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.([]uint32), nil
	}
}

func (t *tokenizer) call(ctx context.Context, baseURL string, body []byte) ([]uint32, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("gateway: tokenize: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gateway: tokenize at %s: %w", baseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("gateway: tokenize at %s: status %d: %s", baseURL, resp.StatusCode, bytes.TrimSpace(msg))
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxTokenizeResponse)).Decode(&out); err != nil {
		return nil, fmt.Errorf("gateway: tokenize at %s: decode: %w", baseURL, err)
	}
	return out.Tokens, nil
}
