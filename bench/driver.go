package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

// errDrained cuts requests still running when the drain deadline passes.
var errDrained = errors.New("bench: cut at the drain deadline")

// sample is one request as the driver saw it. Durations are simulated
// (wall-clock × speed); -1 means unknown.
type sample struct {
	session, turn int
	class, tenant string
	warmup        bool
	// start is when the request was sent, from the start of the run; end
	// when its response ended.
	start, end time.Duration
	ttft, e2e  time.Duration
	// engineTTFT is the replica's own X-Sim-TTFT-Ms, measured on its
	// simulated clock from when the engine saw the request.
	engineTTFT time.Duration
	// queueWait is how long the gateway's queue held the request
	// (X-Warmpath-Queue-Ms, a debug header), simulated; 0 when admitted at
	// once or unknown.
	queueWait time.Duration
	// timing is the gateway's Server-Timing phases (a debug header),
	// simulated; nil without it.
	timing *gatewayTiming
	// gatewayWork is the gateway's own time before it sent the request,
	// queue wait excluded (Server-Timing's prepare + route), simulated; -1
	// when unknown.
	gatewayWork time.Duration

	promptTokens, cachedTokens, outputTokens int
	// replica, reason and predicted come from the gateway's debug headers
	// (or the simulator's X-Sim-Replica).
	replica, reason string
	predicted       int
	// estimate is the gateway's TTFT estimate for the replica that
	// answered (X-Warmpath-Estimate-TTFT, wall-clock, × speed), -1 when
	// none.
	estimate time.Duration
	err      string

	// The prompt, for the ceiling.
	messages  []vllmsim.Message
	tools     []vllmsim.Tool
	promptKey string
}

func (s *sample) ok() bool { return s.err == "" }

// driver plays a Plan's sessions against an OpenAI-compatible endpoint and
// records every request. A driver is used for one run.
type driver struct {
	// urls are the endpoints' base URLs, e.g. http://127.0.0.1:8080;
	// requests take them in turn.
	urls   []string
	next   atomic.Uint64
	model  string
	apiKey string
	// speed converts wall-clock to simulated time.
	speed float64
	// drain bounds, in simulated time after the last session's start, how
	// long outstanding sessions may run on.
	drain  time.Duration
	client *http.Client

	sent, finished, failed, inflight atomic.Int64
	t0                               atomic.Int64 // run start, Unix nanoseconds

	mu      sync.Mutex // guards samples
	samples []sample
}

func newDriver(urls []string, model, apiKey string, speed float64, drain time.Duration) *driver {
	return &driver{
		urls: urls, model: model, apiKey: apiKey, speed: speed, drain: drain,
		client: &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 1 << 16,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			ForceAttemptHTTP2:   false,
		}},
	}
}

// sim converts a wall-clock duration to simulated time.
func (d *driver) sim(w time.Duration) time.Duration { return time.Duration(float64(w) * d.speed) }

// wall converts a simulated duration to wall-clock time.
func (d *driver) wall(s time.Duration) time.Duration { return time.Duration(float64(s) / d.speed) }

// elapsed is the simulated time since the run started.
func (d *driver) elapsed() time.Duration {
	t0 := d.t0.Load()
	if t0 == 0 {
		return 0
	}
	return d.sim(time.Since(time.Unix(0, t0)))
}

// run plays the sessions (sorted by Start) and returns every request's
// sample, in no particular order. It returns ctx's error if ctx ends first.
func (d *driver) run(ctx context.Context, sessions []Session) ([]sample, error) {
	defer d.client.CloseIdleConnections()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t0 := time.Now()
	d.t0.Store(t0.UnixNano())
	var wg sync.WaitGroup
	for i := range sessions {
		s := &sessions[i]
		if !sleepUntil(ctx, t0.Add(d.wall(s.Start))) {
			break
		}
		wg.Go(func() { d.session(ctx, i, s, t0) })
	}
	if ctx.Err() == nil && len(sessions) > 0 {
		deadline := t0.Add(d.wall(sessions[len(sessions)-1].Start + d.drain))
		stop := time.AfterFunc(time.Until(deadline), func() { cancel(errDrained) })
		defer stop.Stop()
	}
	wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, errDrained) {
		return d.samples, err
	}
	return d.samples, nil
}

// session plays one session's turns.
func (d *driver) session(ctx context.Context, idx int, s *Session, t0 time.Time) {
	d.play(ctx, idx, s, s.Script, t0, t0.Add(d.wall(s.Start)))
}

// play plays script's turns for session s, the first due at due (before
// its Delay). A turn that spawns scripts has them played concurrently
// once it completes, and the script goes on when they all have ended.
func (d *driver) play(ctx context.Context, idx int, s *Session, script Script, t0, due time.Time) {
	var prev *Outcome
	for turn := 0; ; turn++ {
		t, ok := script.Next(prev)
		if !ok {
			return
		}
		due = due.Add(d.wall(t.Delay))
		if !sleepUntil(ctx, due) {
			return
		}
		smp, out := d.send(ctx, s, &t, t0)
		smp.session, smp.turn = idx, turn
		d.mu.Lock()
		d.samples = append(d.samples, smp)
		d.mu.Unlock()
		if !smp.ok() {
			return
		}
		if len(t.Spawn) > 0 {
			var wg sync.WaitGroup
			for _, sub := range t.Spawn {
				wg.Go(func() { d.play(ctx, idx, s, sub, t0, time.Now()) })
			}
			wg.Wait()
		}
		prev = &out
		due = time.Now()
	}
}

// sleepUntil sleeps until t; it reports false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// chatBody is the request body the driver sends.
type chatBody struct {
	Model         string            `json:"model"`
	Messages      []vllmsim.Message `json:"messages"`
	Tools         []vllmsim.Tool    `json:"tools,omitempty"`
	ToolChoice    string            `json:"tool_choice,omitempty"`
	MaxTokens     int               `json:"max_tokens,omitempty"`
	IgnoreEOS     bool              `json:"ignore_eos,omitempty"`
	Stream        bool              `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// send performs one turn: a streamed chat completion, read chunk by chunk.
func (d *driver) send(ctx context.Context, s *Session, t *Turn, t0 time.Time) (smp sample, out Outcome) {
	smp = sample{class: s.Class, tenant: s.Tenant, warmup: s.Warmup, ttft: -1, e2e: -1, engineTTFT: -1, estimate: -1, gatewayWork: -1,
		messages: t.Messages, tools: t.Tools, promptKey: t.PromptKey}
	cb := chatBody{Model: d.model, Messages: t.Messages, Tools: t.Tools, ToolChoice: t.ToolChoice,
		MaxTokens: t.MaxTokens, IgnoreEOS: t.IgnoreEOS, Stream: true}
	cb.StreamOptions.IncludeUsage = true
	body, err := json.Marshal(cb)
	if err != nil {
		smp.err = "encode: " + err.Error()
		return smp, out
	}
	url := d.urls[(d.next.Add(1)-1)%uint64(len(d.urls))]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		smp.err = err.Error()
		return smp, out
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if d.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+d.apiKey)
	}
	for k, vs := range s.Header {
		req.Header[k] = vs
	}
	for k, vs := range t.Header {
		req.Header[k] = vs
	}

	d.sent.Add(1)
	d.inflight.Add(1)
	defer d.inflight.Add(-1)
	start := time.Now()
	smp.start = d.sim(start.Sub(t0))
	defer func() {
		end := time.Now()
		smp.end = d.sim(end.Sub(t0))
		if smp.ok() {
			smp.e2e = d.sim(end.Sub(start))
			if smp.ttft < 0 {
				smp.ttft = smp.e2e // the whole output came in the last chunk
			}
			d.finished.Add(1)
		} else {
			d.failed.Add(1)
		}
	}()

	resp, err := d.client.Do(req)
	if err != nil {
		smp.err = requestError(ctx, err)
		return smp, out
	}
	defer resp.Body.Close()
	h := resp.Header
	smp.replica = h.Get("X-Warmpath-Replica")
	if smp.replica == "" {
		smp.replica = h.Get("X-Sim-Replica")
	}
	smp.reason = h.Get("X-Warmpath-Reason")
	smp.predicted, _ = strconv.Atoi(h.Get("X-Warmpath-Predicted-Cached"))
	if v, err := strconv.ParseFloat(h.Get("X-Warmpath-Estimate-TTFT"), 64); err == nil && v >= 0 {
		smp.estimate = time.Duration(v * d.speed * float64(time.Second))
	}
	if ms, err := strconv.ParseFloat(h.Get("X-Warmpath-Queue-Ms"), 64); err == nil && ms > 0 {
		smp.queueWait = d.sim(time.Duration(ms * float64(time.Millisecond)))
	}
	if smp.timing = parseServerTiming(h.Get("Server-Timing"), d.speed); smp.timing != nil {
		smp.gatewayWork = smp.timing.prepare + smp.timing.route
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		smp.err = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return smp, out
	}
	if v := h.Get("X-Sim-TTFT-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil {
			smp.engineTTFT = time.Duration(ms * float64(time.Millisecond))
		}
	}
	var reply []byte
	var u *usageChunk
	err = readSSE(resp.Body, func(data []byte) error {
		if smp.ttft < 0 {
			if text, ok := contentOf(data); ok {
				smp.ttft = d.sim(time.Since(start))
				if t.WantReply {
					reply = append(reply, text...)
				}
			} else if hasToolCall(data) {
				smp.ttft = d.sim(time.Since(start))
			}
		} else if t.WantReply {
			if text, ok := contentOf(data); ok {
				reply = append(reply, text...)
			}
		}
		switch {
		case bytes.HasPrefix(data, []byte(`{"error"`)):
			return fmt.Errorf("stream error: %s", data)
		case bytes.Contains(data, []byte(`"usage":{`)):
			var c usageChunk
			if err := json.Unmarshal(data, &c); err != nil {
				return fmt.Errorf("usage chunk: %w", err)
			}
			u = &c
		}
		return nil
	})
	if err != nil {
		smp.err = requestError(ctx, err)
		return smp, out
	}
	if u == nil {
		smp.err = "stream ended without a usage chunk"
		return smp, out
	}
	smp.promptTokens = u.Usage.PromptTokens
	smp.cachedTokens = u.Usage.PromptTokensDetails.CachedTokens
	smp.outputTokens = u.Usage.CompletionTokens
	out.OutputTokens = smp.outputTokens
	out.Reply = string(reply)
	return smp, out
}

// requestError describes a failed request, naming the drain deadline when
// that is what cut it.
func requestError(ctx context.Context, err error) string {
	if cause := context.Cause(ctx); cause != nil {
		return cause.Error()
	}
	return err.Error()
}

// usageChunk is the part of the final streamed chunk the driver reads.
type usageChunk struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// readSSE calls fn with the payload of each "data:" line of an SSE stream
// until "[DONE]" or the end of the stream. The payload is only valid during
// the call.
func readSSE(r io.Reader, fn func(data []byte) error) error {
	br := bufio.NewReaderSize(r, 16<<10)
	var long []byte
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, line...)
			continue
		}
		if long != nil {
			line = append(long, line...)
			long = nil
		}
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if string(data) == "[DONE]" {
				return nil
			}
			if len(data) > 0 {
				if ferr := fn(data); ferr != nil {
					return ferr
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// Keys the stream reader looks for.
const (
	contentKey  = `"content":"`
	toolCallKey = `"tool_calls":[`
)

// contentOf returns the non-empty delta content of a chat chunk without
// unmarshalling it: the JSON string after the first "content":". Escapes
// are decoded only when present.
func contentOf(data []byte) ([]byte, bool) {
	i := bytes.Index(data, []byte(contentKey))
	if i < 0 {
		return nil, false
	}
	s := data[i+len(contentKey)-1:] // from the opening quote
	escaped := false
	for j := 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			if j == 1 {
				return nil, false // ""
			}
			if !escaped {
				return s[1:j], true
			}
			var str string
			if json.Unmarshal(s[:j+1], &str) != nil {
				return nil, false
			}
			return []byte(str), true
		}
	}
	return nil, false
}

// hasToolCall reports whether a chat chunk carries a tool-call delta (the
// first token of a function call).
func hasToolCall(data []byte) bool { return bytes.Contains(data, []byte(toolCallKey)) }
