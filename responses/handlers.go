package responses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
)

// readBody reads the request's body (at most MaxBodyBytes); a body too
// large stays an *http.MaxBytesError (413), any other failure is a 400.
func (s *Service) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := chatapi.ReadBody(w, r, s.opts.MaxBodyBytes)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, err
		}
		return nil, apierror.BadRequest("", "could not read the request body: %v", err)
	}
	return b, nil
}

// create serves POST /v1/responses.
func (s *Service) create(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	tenant := s.opts.Tenant(ctx)
	t, err := s.prepare(ctx, body, tenant, newID(prefixResponse), r.Header.Clone(), s.opts.Now())
	if err != nil {
		return err
	}
	if t.p.background {
		return s.enqueue(w, r, t, body)
	}
	return s.foreground(w, r, t)
}

// foreground runs a turn inside the client's request: streamed as SSE
// events, or answered as one Response.
func (s *Service) foreground(w http.ResponseWriter, r *http.Request, t *turn) error {
	ctx := r.Context()
	if t.p.conversation != "" {
		release, err := s.lockConversation(ctx, t, false)
		if err != nil {
			return err
		}
		defer release()
	}
	if err := s.loadHistory(ctx, t); err != nil {
		return err
	}
	tctx, cancel := context.WithTimeout(ctx, s.opts.TurnTimeout)
	defer cancel()
	start := s.opts.Now()
	up, err := s.call(tctx, t)
	if err != nil {
		return err
	}
	var emit emitFunc = func(*event) error { return nil }
	var sw *chatapi.Writer
	if t.p.stream {
		sw = chatapi.NewWriter(w, "")
		emit = func(ev *event) error { return sendEvent(sw, ev) }
	}
	b := newBuilder(t.resp, 0, t.namespaced, emit)
	err = s.execute(tctx, t, up, b, false, false)
	s.metrics.duration.WithLabelValues("foreground").Observe(s.opts.Now().Sub(start).Seconds())
	if sw != nil {
		if err != nil {
			return fmt.Errorf("%w: %w", chatapi.ErrStreamStarted, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if t.resp.Status == StatusFailed {
		return &apierror.Error{Status: http.StatusInternalServerError, Type: apierror.TypeServer, Code: t.resp.Error.Code,
			Msg: t.resp.Error.Message}
	}
	return chatapi.WriteJSON(w, http.StatusOK, t.resp)
}

// sendEvent writes a Responses event as "event: <type>\ndata: <json>",
// flushed at once. The stream's headers go out with the first event, so
// errors before it can still be a JSON error response.
func sendEvent(sw *chatapi.Writer, ev *event) error {
	data, err := chatapi.Marshal(ev)
	if err != nil {
		return fmt.Errorf("responses: encode %s: %w", ev.Type, err)
	}
	return sw.Event(ev.Type, data)
}

func responseNotFound(id string) error {
	return &apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeInvalidRequest, Param: "response_id",
		Msg: fmt.Sprintf("Response with id '%s' not found.", id)}
}

func (s *Service) getStored(ctx context.Context, id string, withInput bool) (*stored, error) {
	st, err := s.st.get(ctx, s.opts.Tenant(ctx), id, withInput)
	if errors.Is(err, errNotFound) {
		return nil, responseNotFound(id)
	}
	if err != nil {
		return nil, apierror.Unavailable(err, "the response store is unavailable")
	}
	return st, nil
}

// retrieve serves GET /v1/responses/{id}, and with ?stream=true replays a
// background response's events from starting_after.
func (s *Service) retrieve(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	q := r.URL.Query()
	if q.Get("stream") == "true" {
		after := -1
		if v := q.Get("starting_after"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < -1 {
				return apierror.BadRequest("starting_after", "starting_after must be a sequence number.")
			}
			after = n
		}
		st, err := s.getStored(r.Context(), id, false)
		if err != nil {
			return err
		}
		if !st.bg {
			return apierror.BadRequest("stream", "only background responses can be streamed with GET; this one is %s.", st.resp.Status)
		}
		return s.tail(w, r, s.opts.Tenant(r.Context()), id, after)
	}
	st, err := s.getStored(r.Context(), id, false)
	if err != nil {
		return err
	}
	return chatapi.WriteJSON(w, http.StatusOK, st.resp)
}

func (s *Service) deleteResponse(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	err := s.st.remove(r.Context(), s.opts.Tenant(r.Context()), id)
	if errors.Is(err, errNotFound) {
		return responseNotFound(id)
	}
	if err != nil {
		return apierror.Unavailable(err, "the response store is unavailable")
	}
	return chatapi.WriteJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

// inputItems serves GET /v1/responses/{id}/input_items.
func (s *Service) inputItems(w http.ResponseWriter, r *http.Request) error {
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	st, err := s.getStored(r.Context(), r.PathValue("id"), true)
	if err != nil {
		return err
	}
	items, more, err := pg.apply(st.input)
	if err != nil {
		return err
	}
	return chatapi.WriteJSON(w, http.StatusOK, newItemList(items, more))
}

// page is a list request's limit, order and after cursor.
type page struct {
	limit int
	desc  bool
	after string
}

func parsePage(r *http.Request) (page, error) {
	q := r.URL.Query()
	pg := page{limit: 20, desc: true, after: q.Get("after")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return page{}, apierror.BadRequest("limit", "limit must be an integer between 1 and 100.")
		}
		pg.limit = n
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		pg.desc = false
	default:
		return page{}, apierror.BadRequest("order", "order must be asc or desc.")
	}
	return pg, nil
}

// apply pages items (stored oldest first).
func (pg page) apply(items []Item) ([]Item, bool, error) {
	ordered := make([]Item, len(items))
	for i := range items {
		if pg.desc {
			ordered[i] = items[len(items)-1-i]
		} else {
			ordered[i] = items[i]
		}
	}
	if pg.after != "" {
		i := 0
		for i < len(ordered) && ordered[i].ID != pg.after {
			i++
		}
		if i == len(ordered) {
			return nil, false, apierror.BadRequest("after", "No item with id '%s' in this list.", pg.after)
		}
		ordered = ordered[i+1:]
	}
	if len(ordered) > pg.limit {
		return ordered[:pg.limit], true, nil
	}
	return ordered, false, nil
}

// inputTokens serves POST /v1/responses/input_tokens: the prompt tokens
// the request would send, history included.
func (s *Service) inputTokens(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	t, err := s.prepare(ctx, body, s.opts.Tenant(ctx), newID(prefixResponse), r.Header.Clone(), s.opts.Now())
	if err != nil {
		return err
	}
	t.p.store, t.p.background = false, false
	if err := s.loadHistory(ctx, t); err != nil {
		return err
	}
	n, err := s.countTokens(ctx, t)
	if err != nil {
		return err
	}
	return chatapi.WriteJSON(w, http.StatusOK, map[string]any{"object": "response.input_tokens", "input_tokens": n})
}

func (s *Service) countTokens(ctx context.Context, t *turn) (int, error) {
	if s.opts.Tokenize != nil {
		body, err := t.upstreamBody()
		if err != nil {
			return 0, err
		}
		n, err := s.opts.Tokenize(ctx, body)
		if err != nil {
			return 0, apierror.BadGateway(err, "the prompt could not be tokenized")
		}
		return n, nil
	}
	one := 1
	t.p.raw.MaxOutputTokens = &one
	ctx, cancel := context.WithTimeout(ctx, s.opts.TurnTimeout)
	defer cancel()
	up, err := s.call(ctx, t)
	if err != nil {
		return 0, err
	}
	defer up.Body.Close()
	b := newBuilder(t.resp, 0, t.namespaced, func(*event) error { return nil })
	if _, err := consume(ctx, up.Body, b); err != nil {
		return 0, err
	}
	if b.usage == nil {
		return 0, apierror.BadGateway(errors.New("no usage in the upstream stream"), "the model reported no usage")
	}
	return b.usage.InputTokens, nil
}

// cancel serves POST /v1/responses/{id}/cancel.
func (s *Service) cancel(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	ctx := r.Context()
	tenant := s.opts.Tenant(ctx)
	res, err := s.st.cancel(ctx, tenant, id)
	switch {
	case errors.Is(err, errNotFound):
		return responseNotFound(id)
	case err != nil:
		return apierror.Unavailable(err, "the response store is unavailable")
	case res == "notbg":
		return apierror.BadRequest("response_id", "Only responses created with background set to true can be cancelled.")
	case res == "running":
		if err := s.opts.Redis.Publish(ctx, s.st.cancelChannel(), s.st.recKey(tenant, id)).Err(); err != nil {
			s.log.Warn("responses: publish cancel", "id", id, "err", err) // the lease loop sees the flag
		}
	}
	st, err := s.getStored(ctx, id, false)
	if err != nil {
		return err
	}
	return chatapi.WriteJSON(w, http.StatusOK, st.resp)
}

// headerJSON keeps a background turn's client headers, minus credentials
// and hop-by-hop headers.
func headerJSON(h http.Header) []byte {
	keep := http.Header{}
	for k, v := range h {
		switch strings.ToLower(k) {
		case "authorization", "cookie", "proxy-authorization", "x-api-key", "api-key",
			"content-length", "content-type", "connection", "accept-encoding", "transfer-encoding":
			continue
		}
		keep[k] = v
	}
	b, _ := json.Marshal(keep)
	return b
}
