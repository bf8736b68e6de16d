package routing

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"
	"golang.org/x/sync/singleflight"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/backoff"
)

// Tokenizer gets a prompt's token ids, after the chat template, from the
// in-process tokenizer when there is one for the model (routing.tokenizer,
// localtok.go), else from a POST /tokenize (vLLM serves it; so does the
// simulator): the tokenizer service (routing.tokenize_url) first when
// there is one, then the replicas. It caches the answers by request body: agents often resend an
// identical prompt (retries, parallel tool calls), and every replica
// tokenizes alike. Concurrent requests for the same prompt share one
// call. Targets whose last call failed are asked last, and a replica that
// fails (refused, timed out, 5xx) is reported to the fleet at once. A
// target without a usable /tokenize (404 behind a proxy that hides it,
// 401/403, 405, 501) is not asked at all for a while that doubles with
// each refusal (see tokenizeBackoff), which the log says once and
// warmpath_tokenizer_backoff shows.
type Tokenizer struct {
	client  *http.Client
	cache   *tokenCache
	calls   singleflight.Group // in-flight calls by body hash
	m       *tokMetrics
	log     *slog.Logger
	service string        // routing.tokenize_url, "" for none
	next    atomic.Uint64 // rotates calls over replicas
	fails   sync.Map      // target name → *atomic.Int64: Unix nanos of its last failed or refused call
	backoff sync.Map      // target name → *tokenizeBackoff
	// localTok is the in-process tokenizer (routing.tokenizer), asked
	// before the cache and the replicas; nil for none.
	localTok *localTokens
}

// serviceTarget names the tokenizer service in fails, backoff and the
// backoff metric.
const serviceTarget = "tokenize_url"

// tokenizerOptions configure buildTokenizer.
type tokenizerOptions struct {
	// Client calls /tokenize (its Timeout bounds a call).
	Client *http.Client
	// CacheBytes bounds the cache of tokenized prompts
	// (routing.tokenize_cache_bytes).
	CacheBytes int64
	// Service is the tokenizer service's base URL (routing.tokenize_url),
	// "" for none.
	Service string
	// Local names the in-process tokenizer (routing.tokenizer: one of
	// TokenizerReplicas, TokenizerSimulator, TokenizerHF) and Dirs each
	// model's tokenizer files for TokenizerHF (routing.tokenizer_dirs);
	// VerifyEvery is the sampled check's period
	// (routing.tokenizer_verify_every).
	Local       string
	Dirs        map[string]string
	VerifyEvery int
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
}

// buildTokenizer builds the tokenizer and registers its metrics; it loads
// the in-process tokenizer's files, failing when they do not load.
func buildTokenizer(o tokenizerOptions) (*Tokenizer, error) {
	lt, err := newLocalTokenizer(o.Local, o.Dirs)
	if err != nil {
		return nil, err
	}
	t := newTokenizer(o.Client, o.CacheBytes, newTokMetrics(o.Registerer))
	t.service = strings.TrimRight(o.Service, "/")
	if o.Logger != nil {
		t.log = o.Logger
	}
	if lt != nil {
		t.localTok = newLocalTokens(lt, o.VerifyEvery)
	}
	return t, nil
}

func newTokenizer(client *http.Client, cacheBytes int64, m *tokMetrics) *Tokenizer {
	return &Tokenizer{client: client, cache: newTokenCache(cacheBytes), m: m, log: slog.New(slog.DiscardHandler)}
}

// Run runs the in-process tokenizer's checker until ctx ends; without
// an in-process tokenizer it returns at once.
func (t *Tokenizer) Run(ctx context.Context) error {
	if t.localTok == nil {
		return nil
	}
	return t.localTok.Run(ctx)
}

// tokenizeTarget is one place to tokenize at: a replica, or the tokenizer
// service (rep nil).
type tokenizeTarget struct {
	name, base string
	rep        *fleet.Replica
}

// maxTokenizeResponse bounds a /tokenize reply (a 128k-token prompt is
// under 1 MiB of JSON).
const maxTokenizeResponse = 16 << 20

// failMemory is how long a failed call sends a replica to the back of the
// tokenizer's queue.
const failMemory = 30 * time.Second

// tokens returns r's prompt token ids, asking up to two of reps (healthy
// replicas serving r's model) when they are not cached.
func (t *Tokenizer) tokens(ctx context.Context, r *request.R, reps []*fleet.Replica) ([]uint32, error) {
	return t.Start(ctx, r, reps).Wait(ctx)
}

// TokenCall is a tokenization under way: the ids, or the error, when they
// were known at once (a prompt of token ids, the cache), else the shared
// call's result to come on ch.
type TokenCall struct {
	ids []uint32
	err error
	ch  <-chan singleflight.Result
	// Source is where the ids come from (ids: the prompt is token ids;
	// local: the in-process tokenizer; cache; replica: a /tokenize call),
	// Started when the call began: the trace's warmpath.tokenize span.
	Source  string
	Started time.Time
}

// Wait returns the call's ids, waiting for them as long as ctx allows.
func (c *TokenCall) Wait(ctx context.Context) ([]uint32, error) {
	if c.ch == nil {
		return c.ids, c.err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case res := <-c.ch:
		c.ch = nil
		if res.Err != nil {
			c.err = res.Err
		} else {
			c.ids = res.Val.([]uint32)
		}
		return c.ids, c.err
	}
}

// Start begins tokens' work without waiting for the replica's answer.
func (t *Tokenizer) Start(ctx context.Context, r *request.R, reps []*fleet.Replica) *TokenCall {
	started := time.Now()
	c := t.begin(ctx, r, reps)
	c.Started = started
	return c
}

// begin is start's work.
func (t *Tokenizer) begin(ctx context.Context, r *request.R, reps []*fleet.Replica) *TokenCall {
	if ids, ok := r.PromptTokenIDs(); ok {
		return &TokenCall{ids: ids, Source: "ids"}
	}
	if ids, ok := t.local(r, reps); ok {
		return &TokenCall{ids: ids, Source: "local"} // not cached: tokenizing again costs less than the memory
	}
	body := r.TokenizeBody()
	if body == nil {
		return &TokenCall{err: fmt.Errorf("gateway: prompt cannot be tokenized"), Source: "none"}
	}
	key := xxhash.Sum64(body)
	if ids, ok := t.cache.get(key); ok {
		t.m.calls.WithLabelValues("cached").Inc()
		return &TokenCall{ids: ids, Source: "cache"}
	}
	order := t.order(reps)
	if len(order) == 0 {
		t.m.calls.WithLabelValues("unavailable").Inc()
		return &TokenCall{err: ErrTokenizeUnavailable, Source: "unavailable"}
	}
	// The shared call outlives any one caller's cancellation (the client's
	// timeout still bounds it); each caller waits only as long as its own
	// context allows.
	ch := t.calls.DoChan(strconv.FormatUint(key, 16), func() (any, error) {
		ids, err := t.ask(context.WithoutCancel(ctx), order, body)
		if err != nil {
			t.m.calls.WithLabelValues("error").Inc()
			return nil, err
		}
		t.m.calls.WithLabelValues("ok").Inc()
		t.cache.add(key, ids)
		return ids, nil
	})
	return &TokenCall{ch: ch, Source: "replica"}
}

// ErrTokenizeUnavailable: every target is backed off (none has a usable
// /tokenize), so no call is made.
var ErrTokenizeUnavailable = errors.New("gateway: no tokenizer available: every replica's /tokenize refused recently (see warmpath_tokenizer_backoff; set routing.tokenize_url)")

// order lists the targets to ask: the tokenizer service, then reps
// rotating, those without a recent failure first and the rest by how long
// ago they failed; targets backed off are left out.
func (t *Tokenizer) order(reps []*fleet.Replica) []tokenizeTarget {
	now := time.Now()
	start := int(t.next.Add(1))
	var out, failed []tokenizeTarget
	add := func(tg tokenizeTarget) {
		switch {
		case t.backedOff(tg.name, now):
		case now.UnixNano()-t.lastFail(tg.name) < int64(failMemory):
			failed = append(failed, tg)
		default:
			out = append(out, tg)
		}
	}
	if t.service != "" {
		add(tokenizeTarget{name: serviceTarget, base: t.service})
	}
	for i := range reps {
		rep := reps[(start+i)%len(reps)]
		add(tokenizeTarget{name: rep.Spec.Name, base: rep.URL().String(), rep: rep})
	}
	slices.SortFunc(failed, func(a, b tokenizeTarget) int { return cmp.Compare(t.lastFail(a.name), t.lastFail(b.name)) })
	return append(out, failed...)
}

func (t *Tokenizer) lastFail(name string) int64 {
	if v, ok := t.fails.Load(name); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// ask tries the targets of order in turn until one answers, two have
// failed, or none is left. A target that failed or refused is asked last
// for a while (failMemory); one without a usable /tokenize is backed off;
// a replica that failed (not one that refused the prompt, or has no
// /tokenize) is also reported to the fleet.
func (t *Tokenizer) ask(ctx context.Context, order []tokenizeTarget, body []byte) ([]uint32, error) {
	err := errors.New("gateway: no replica to tokenize with")
	failures := 0
	for _, tg := range order {
		var ids []uint32
		began := time.Now()
		if ids, err = t.call(ctx, tg.base, body); err == nil {
			t.succeeded(tg.name)
			return ids, nil
		}
		v, _ := t.fails.LoadOrStore(tg.name, new(atomic.Int64))
		v.(*atomic.Int64).Store(time.Now().UnixNano())
		if errors.Is(err, errTokenizeUnsupported) {
			t.backOff(tg.name, err)
		}
		if errors.Is(err, errTokenizeRefused) {
			continue
		}
		if tg.rep != nil {
			tg.rep.ReportFailureOf(began, err)
		}
		if failures++; failures == 2 {
			break
		}
	}
	return nil, err
}

// errTokenizeRefused marks a 4xx from /tokenize: the replica is up but
// will not tokenize this prompt (or has no /tokenize), which says nothing
// about its health.
var errTokenizeRefused = errors.New("gateway: tokenize refused")

// errTokenizeUnsupported marks the refusals that mean there is no usable
// /tokenize at all, whatever the prompt: 401, 403, 404, 405 and 501. It
// comes wrapped with errTokenizeRefused.
var errTokenizeUnsupported = errors.New("gateway: no usable /tokenize")

// Tokenizer backoff: a target without a usable /tokenize is skipped for
// tokenizeBackoffMin after its first refusal, twice as long after each
// further one, up to tokenizeBackoffMax; an answer clears it.
const (
	tokenizeBackoffMin = 30 * time.Second
	tokenizeBackoffMax = 10 * time.Minute
)

// tokenizeBackoff is one target's backoff state.
type tokenizeBackoff struct {
	mu      sync.Mutex // guards the rest
	until   time.Time  // not asked before this
	failing bool       // refused since its last answer
	bo      backoff.Backoff
}

// backedOff reports whether name is not to be asked at now.
func (t *Tokenizer) backedOff(name string, now time.Time) bool {
	v, ok := t.backoff.Load(name)
	if !ok {
		return false
	}
	b := v.(*tokenizeBackoff)
	b.mu.Lock()
	defer b.mu.Unlock()
	return now.Before(b.until)
}

// backOff starts or extends name's backoff after a refusal, logging the
// first one (again only after an answer cleared it).
func (t *Tokenizer) backOff(name string, err error) {
	v, _ := t.backoff.LoadOrStore(name, &tokenizeBackoff{bo: backoff.Backoff{Min: tokenizeBackoffMin, Max: tokenizeBackoffMax}})
	b := v.(*tokenizeBackoff)
	b.mu.Lock()
	first := !b.failing
	b.failing = true
	wait := b.bo.Next()
	b.until = time.Now().Add(wait)
	b.mu.Unlock()
	t.m.backoff.WithLabelValues(name).Set(1)
	if first {
		t.log.Warn("tokenizer: no usable /tokenize; not asking it for a while (doubling up to 10m); "+
			"until one answers, prompts it would tokenize route without prefix information and with estimated lengths",
			"target", name, "backoff", wait, "err", err)
	} else {
		t.log.Debug("tokenizer: still no usable /tokenize", "target", name, "backoff", wait)
	}
}

// succeeded clears name's backoff after an answer.
func (t *Tokenizer) succeeded(name string) {
	v, ok := t.backoff.Load(name)
	if !ok {
		return
	}
	b := v.(*tokenizeBackoff)
	b.mu.Lock()
	was := b.failing
	b.failing, b.until = false, time.Time{}
	b.bo.Reset()
	b.mu.Unlock()
	if was {
		t.m.backoff.WithLabelValues(name).Set(0)
		t.log.Info("tokenizer: /tokenize answers again", "target", name)
	}
}

func (t *Tokenizer) call(ctx context.Context, baseURL string, body []byte) ([]uint32, error) {
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
		err := fmt.Errorf("gateway: tokenize at %s: status %d: %s", baseURL, resp.StatusCode, bytes.TrimSpace(msg))
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
			err = fmt.Errorf("%w: %w: %w", errTokenizeRefused, errTokenizeUnsupported, err)
		default:
			if resp.StatusCode < 500 {
				err = fmt.Errorf("%w: %w", errTokenizeRefused, err)
			}
		}
		return nil, err
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeResponse))
	if err != nil {
		return nil, fmt.Errorf("gateway: tokenize at %s: %w", baseURL, err)
	}
	ids, err := decodeTokens(raw)
	if err != nil {
		return nil, fmt.Errorf("gateway: tokenize at %s: decode: %w", baseURL, err)
	}
	return ids, nil
}

// decodeTokens reads the "tokens" array of a /tokenize answer
// ({"count":…,"max_model_len":…,"tokens":[…]}) without reflection: it
// finds the array with gjson and parses its integers in one pass, about
// several times faster than encoding/json for a 16k-token prompt (see
// BenchmarkDecodeTokens). Anything but an array of integers in [0, 2^32)
// is an error.
func decodeTokens(body []byte) ([]uint32, error) {
	arr := gjson.GetBytes(body, "tokens") // safe on any bytes; the array is checked below
	if !arr.IsArray() {
		return nil, errors.New(`no "tokens" array`)
	}
	raw := arr.Raw
	out := make([]uint32, 0, len(raw)/6)
	for i := 1; i < len(raw)-1; {
		switch c := raw[i]; {
		case c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == ',':
			i++
			continue
		case c < '0' || c > '9':
			return nil, fmt.Errorf("token %d is not a non-negative integer", len(out))
		}
		var v uint64
		j := i
		for ; j < len(raw) && raw[j] >= '0' && raw[j] <= '9'; j++ {
			v = v*10 + uint64(raw[j]-'0')
			if v > math.MaxUint32 {
				return nil, fmt.Errorf("token %d is out of range", len(out))
			}
		}
		if j < len(raw) && raw[j] != ',' && raw[j] != ']' && raw[j] != ' ' && raw[j] != '\n' && raw[j] != '\r' && raw[j] != '\t' {
			return nil, fmt.Errorf("token %d is not an integer", len(out))
		}
		out = append(out, uint32(v))
		i = j
	}
	return out, nil
}

// tokenCache is an LRU of tokenized prompts bounded by the bytes its token
// ids take, not by entries: a 16k-token prompt weighs 64 KiB, a short one
// almost nothing. It is safe for concurrent use.
type tokenCache struct {
	lru    *lru.Cache[uint64, []uint32]
	budget int64
	bytes  atomic.Int64
}

// entryOverhead approximates an entry's bookkeeping (list element, map
// slot, slice header).
const entryOverhead = 96

func newTokenCache(budget int64) *tokenCache {
	c := &tokenCache{budget: budget}
	// The entry bound only backs up the byte budget.
	c.lru, _ = lru.NewWithEvict(1<<22, func(_ uint64, ids []uint32) { c.bytes.Add(-weight(ids)) })
	return c
}

func weight(ids []uint32) int64 { return int64(4*len(ids) + entryOverhead) }

func (c *tokenCache) get(key uint64) ([]uint32, bool) { return c.lru.Get(key) }

// add caches ids, evicting the least recently used prompts until the cache
// is within its budget. A prompt larger than the whole budget is not kept.
func (c *tokenCache) add(key uint64, ids []uint32) {
	if weight(ids) > c.budget {
		return
	}
	if c.lru.Contains(key) {
		return
	}
	c.bytes.Add(weight(ids))
	c.lru.Add(key, ids)
	for c.bytes.Load() > c.budget {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
}
