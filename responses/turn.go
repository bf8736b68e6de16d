package responses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/session"
)

// turn is one Responses request made ready to run.
type turn struct {
	p          *params
	tenant     string
	resp       *Response // the skeleton, then the response as it is built
	input      []Item    // this turn's input, references resolved, IDs assigned
	inMsgs     [][]byte  // input rendered as chat messages
	history    [][]byte  // earlier turns' chat messages (chain or conversation)
	sess       string    // the chain's session key
	sessSet    bool      // sess was decided by a chain, a conversation or a hint
	lock       string    // conversation lock token held by this turn
	header     http.Header
	namespaced map[string]bool
}

// prepare parses a CreateResponse body and resolves its input (item
// references, IDs, rendering). History is loaded separately (loadHistory),
// because a background turn loads it when it runs.
func (s *Service) prepare(ctx context.Context, body []byte, tenant, id string, header http.Header, now time.Time) (*turn, error) {
	p, err := parseCreate(body)
	if err != nil {
		return nil, err
	}
	if err := s.checkModel(p.model); err != nil {
		return nil, err
	}
	t := &turn{p: p, tenant: tenant, header: header, namespaced: map[string]bool{}}
	for _, tool := range p.tools {
		if strings.Contains(tool.Function.Name, namespaceSep) {
			t.namespaced[tool.Function.Name] = true
		}
	}
	t.hintSession(header)
	if err := s.resolveInput(ctx, t, p.input); err != nil {
		return nil, err
	}
	if t.inMsgs, err = renderItems(t.input); err != nil {
		return nil, err
	}
	t.resp = t.skeleton(id, now)
	return t, nil
}

// hintSession takes a client-named session (a harness session header or
// prompt_cache_key) as the chain key of an unchained turn, scoped by
// tenant.
func (t *turn) hintSession(h http.Header) {
	if t.p.previous != "" || t.p.conversation != "" {
		return
	}
	hint := ""
	for _, name := range session.Headers {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			hint = v
			break
		}
	}
	if hint == "" {
		hint = deref(t.p.raw.PromptCacheKey)
	}
	if hint != "" {
		t.sess, t.sessSet = "k:"+t.tenant+":"+hint, true
	}
}

// resolveInput replaces item references by the stored items of the same
// tenant (400 when one is missing), assigns IDs, and, for an unchained
// turn with no session hint, inherits the chain key of the newest stored
// item the input names, so full-history clients stay on one session.
func (s *Service) resolveInput(ctx context.Context, t *turn, input []Item) error {
	var lookup []string
	for _, it := range input {
		if it.Type == itemReference || (!t.sessSet && t.p.store && it.ID != "" && len(lookup) < 256) {
			lookup = append(lookup, it.ID)
		}
	}
	found, err := s.st.items(ctx, t.tenant, lookup)
	if err != nil {
		return apierror.Unavailable(err, "the response store is unavailable")
	}
	t.input = make([]Item, 0, len(input))
	inherited := ""
	for i, it := range input {
		si, ok := found[it.ID]
		if it.Type == itemReference {
			if !ok {
				return apierror.BadRequest(fmt.Sprintf("input[%d]", i), "Item with id '%s' not found.", it.ID)
			}
			it = si.Item
		}
		if ok && si.Sess != "" {
			inherited = si.Sess
		}
		t.input = append(t.input, it)
	}
	if !t.sessSet && inherited != "" {
		t.sess, t.sessSet = inherited, true
	}
	assignIDs(t.input)
	return nil
}

// loadHistory reads the earlier turns: the previous response's chain (one
// round trip) or the conversation's items. It decides the session key.
func (s *Service) loadHistory(ctx context.Context, t *turn) error {
	switch {
	case t.p.previous != "":
		msgs, sess, status, err := s.st.chain(ctx, t.tenant, t.p.previous)
		switch {
		case errors.Is(err, errNotFound), errors.Is(err, errBrokenChain):
			return previousNotFound(t.p.previous)
		case err != nil:
			return apierror.Unavailable(err, "the response store is unavailable")
		case !terminal(status):
			return apierror.BadRequest("previous_response_id", "Previous response with id '%s' is still %s; wait for it to finish.", t.p.previous, status)
		}
		s.metrics.chainTurns.Observe(float64(len(msgs)))
		t.history, t.sess, t.sessSet = msgs, sess, true
	case t.p.conversation != "":
		items, err := s.st.conversationItems(ctx, t.tenant, t.p.conversation)
		if errors.Is(err, errNotFound) {
			return conversationNotFound(t.p.conversation)
		}
		if err != nil {
			return apierror.Unavailable(err, "the conversation store is unavailable")
		}
		if t.history, err = renderItems(items); err != nil {
			return err
		}
		t.sess, t.sessSet = t.p.conversation, true
	}
	if !t.sessSet && t.p.store {
		t.sess = t.resp.ID // this response roots a new chain
	}
	return nil
}

// previousNotFound is the exact error OpenAI's clients key on to retry
// with full history.
func previousNotFound(id string) error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest,
		Param: "previous_response_id", Code: "previous_response_not_found",
		Msg: fmt.Sprintf("Previous response with id '%s' not found.", id)}
}

func conversationNotFound(id string) error {
	return apierror.NotFound("conversation_not_found", "Conversation with id '%s' not found.", id)
}

// skeleton is the Response echoing the request, before any output.
func (t *turn) skeleton(id string, now time.Time) *Response {
	p, r := t.p, t.p.raw
	resp := &Response{ID: id, Object: "response", CreatedAt: now.Unix(), Status: StatusInProgress,
		Background: p.background, Instructions: p.instructions, MaxOutputTokens: r.MaxOutputTokens,
		MaxToolCalls: r.MaxToolCalls, Model: p.model, Output: []Item{},
		ParallelToolCalls: r.ParallelToolCalls == nil || *r.ParallelToolCalls,
		Reasoning:         json.RawMessage(`{"effort":null,"summary":null}`), ServiceTier: "default",
		Store: p.store, Temperature: 1, TopP: 1, Text: p.textEcho, ToolChoice: p.choiceEcho,
		Tools: p.toolsEcho, TopLogprobs: deref(r.TopLogprobs), Truncation: "disabled",
		User: r.User, SafetyIdentifier: r.SafetyIdentifier, PromptCacheKey: r.PromptCacheKey,
		Metadata: r.Metadata}
	if p.previous != "" {
		resp.PreviousResponseID = &p.previous
	}
	if p.conversation != "" {
		resp.Conversation = &ConversationRef{ID: p.conversation}
	}
	if isSet(r.Reasoning) {
		resp.Reasoning = r.Reasoning
	}
	if r.Temperature != nil {
		resp.Temperature = *r.Temperature
	}
	if r.TopP != nil {
		resp.TopP = *r.TopP
	}
	if resp.Metadata == nil {
		resp.Metadata = map[string]string{}
	}
	return resp
}

// upstreamBody is the chat-completions body of the turn.
func (t *turn) upstreamBody() ([]byte, error) {
	return chatBody(t.p, append(append([][]byte(nil), t.history...), t.inMsgs...))
}

// call sends the turn upstream. A refusal is the Chat's *apierror.Error,
// as it is.
func (s *Service) call(ctx context.Context, t *turn) (*http.Response, error) {
	body, err := t.upstreamBody()
	if err != nil {
		return nil, err
	}
	var id string
	if t.resp != nil {
		id = t.resp.ID
	}
	resp, err := s.chat.Complete(ctx, chatapi.Turn{Body: body, Session: t.sess, Tenant: t.tenant,
		Background: t.p.background, Header: t.header, ResponseID: id})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if he, ok := errors.AsType[*apierror.Error](err); ok {
			return nil, he
		}
		return nil, apierror.BadGateway(err, "the model could not be reached")
	}
	return resp, nil
}

// consume reads the upstream chat stream into the builder until [DONE] or
// the end of the body. A mid-stream upstream error, or a broken stream,
// is returned as the failure the response ends with; a context error is
// returned as err.
func consume(ctx context.Context, body io.Reader, b *builder) (failure *ResponseError, err error) {
	er := chatapi.NewReader(body)
	for {
		data, err := er.Next()
		switch {
		case errors.Is(err, chatapi.ErrDone):
			return nil, nil
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, io.EOF):
			return nil, nil
		case errors.Is(err, chatapi.ErrEventTooLarge):
			// bufio.Scanner's words, which this message had before.
			return &ResponseError{Code: "server_error", Message: "the model's stream broke: bufio.Scanner: token too long"}, nil
		case err != nil:
			return &ResponseError{Code: "server_error", Message: "the model's stream broke: " + err.Error()}, nil
		}
		var c chatChunk
		if err := json.Unmarshal(data, &c); err != nil {
			return &ResponseError{Code: "server_error", Message: "the model sent an unreadable chunk"}, nil
		}
		if isSet(c.Error) {
			return chunkError(c.Error), nil
		}
		if err := b.chunk(&c); err != nil {
			return nil, err
		}
	}
}

func chunkError(raw json.RawMessage) *ResponseError {
	var e struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(raw, &e)
	if e.Message == "" {
		e.Message = "the model failed mid-stream"
	}
	return &ResponseError{Code: "server_error", Message: e.Message}
}

// execute streams an accepted upstream response through b, then settles,
// stores and terminates the response. ctx is the turn's context; cancel
// reports whether its end was the client's (abort, store nothing) rather
// than the turn timeout (store a failure).
func (s *Service) execute(ctx context.Context, t *turn, up *http.Response, b *builder, created, requireRunning bool) error {
	defer up.Body.Close()
	if err := b.begin(created); err != nil {
		return err
	}
	failure, err := consume(ctx, up.Body, b)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		failure = &ResponseError{Code: "server_error", Message: fmt.Sprintf("the turn exceeded %s", s.opts.TurnTimeout)}
	case err != nil:
		return err
	}
	return s.finish(ctx, t, b, failure, requireRunning)
}

// finish settles the response, stores it (before the terminal event, so a
// client that sees response.completed can chain at once), then sends the
// terminal event.
func (s *Service) finish(ctx context.Context, t *turn, b *builder, failure *ResponseError, requireRunning bool) error {
	status, incomplete, f := b.outcome()
	if failure != nil {
		status, incomplete, f = StatusFailed, nil, failure
	}
	if err := b.settle(status, incomplete, f, s.opts.Now().Unix()); err != nil {
		return err
	}
	if t.p.store {
		if err := s.save(context.WithoutCancel(ctx), t, requireRunning); err != nil {
			if errors.Is(err, errCancelled) {
				return err
			}
			s.metrics.storeErrors.Inc()
			s.log.Error("responses: store failed", "id", t.resp.ID, "err", err)
			t.resp.Status, t.resp.CompletedAt, t.resp.IncompleteDetails = StatusFailed, nil, nil
			t.resp.Error = &ResponseError{Code: "server_error", Message: "the response could not be stored; it cannot be retrieved or continued"}
		}
	}
	mode := "foreground"
	if t.p.background {
		mode = "background"
	}
	s.metrics.responses.WithLabelValues(mode, t.resp.Status).Inc()
	return b.terminate()
}

// save commits the finished response with a bounded context of its own:
// the client may be gone, the store must still finish.
func (s *Service) save(ctx context.Context, t *turn, requireRunning bool) error {
	outMsgs, err := renderItems(t.resp.Output)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return s.st.commit(ctx, &record{tenant: t.tenant, resp: t.resp, input: t.input, output: t.resp.Output,
		msgs: joinMessages(append(append([][]byte(nil), t.inMsgs...), outMsgs...)), prev: t.p.previous,
		sess: t.sess, conversation: t.p.conversation, lock: t.lock, requireRunning: requireRunning})
}
