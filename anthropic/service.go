package anthropic

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tidwall/sjson"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
)

// Options configures a Service. Every field has the default its doc
// states.
type Options struct {
	// Authenticate checks a request's credential (x-api-key or
	// Authorization: Bearer) and returns the context the request runs
	// under (carrying its principal); its error is answered in Anthropic's
	// envelope with the error's status. nil lets every request in.
	Authenticate func(ctx context.Context, h http.Header) (context.Context, error)
	// CountTokens counts the prompt tokens of a chat-completions body for
	// POST /v1/messages/count_tokens, with the tokenizer routing uses. nil
	// counts them by a one-token completion through Chat (exact, but it
	// runs the model).
	CountTokens func(ctx context.Context, chatBody []byte) (int, error)
	// Models lists the served models; when set, count_tokens for another
	// answers 404 (/v1/messages learns it from Chat). nil accepts any.
	Models func() []string
	// MaxBodyBytes bounds a request body; default 32 MiB (Anthropic's
	// limit).
	MaxBodyBytes int64
	// TurnTimeout bounds one request, from its arrival to the last event;
	// default 10 minutes (Claude Code's own request timeout).
	TurnTimeout time.Duration
	// PingInterval is how long a stream may stay silent before a ping
	// event is sent; default 10s, negative for none (one ping still
	// follows message_start, as Anthropic sends).
	PingInterval time.Duration
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
}

// Defaults of Options.
const (
	DefaultMaxBodyBytes = 32 << 20
	DefaultTurnTimeout  = 10 * time.Minute
	DefaultPingInterval = 10 * time.Second
)

func (o *Options) fill() {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.TurnTimeout <= 0 {
		o.TurnTimeout = DefaultTurnTimeout
	}
	switch {
	case o.PingInterval == 0:
		o.PingInterval = DefaultPingInterval
	case o.PingInterval < 0:
		o.PingInterval = 0
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Service serves the Messages API over a Chat. It is safe for concurrent
// use and starts no goroutines.
type Service struct {
	opts Options
	chat chatapi.Chat
	log  *slog.Logger
}

// New returns a Service over chat.
func New(opts Options, chat chatapi.Chat) (*Service, error) {
	if chat == nil {
		return nil, errors.New("anthropic: a Chat is required")
	}
	opts.fill()
	return &Service{opts: opts, chat: chat, log: opts.Logger}, nil
}

// Handler serves POST /v1/messages (with or without ?beta=true) and POST
// /v1/messages/count_tokens; any other path under /v1/messages is a 404,
// any other method a 405, all in Anthropic's error envelope.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/messages", s.adapt(s.messages))
	mux.Handle("/v1/messages/count_tokens", s.adapt(s.countTokens))
	mux.Handle("/", s.adapt(func(w http.ResponseWriter, r *http.Request) error {
		return apierror.NotFound("unknown_url", "Unknown request URL: %s %s.", r.Method, r.URL.Path)
	}))
	return mux
}

// adapt runs an error-returning handler: it names the request (request-id,
// the gateway's X-Request-Id when set), authenticates it, checks the
// method, bounds the body, and writes every error in Anthropic's
// envelope.
func (s *Service) adapt(fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := w.Header().Get("X-Request-Id")
		if id == "" {
			id = chatapi.NewRequestID()
		}
		w.Header().Set("Request-Id", id)
		r, err := s.authenticate(r)
		if err == nil && r.Method != http.MethodPost {
			err = &apierror.Error{Status: http.StatusMethodNotAllowed, Msg: "Method " + r.Method + " is not allowed for " + r.URL.Path + "."}
		}
		if err == nil {
			err = fn(w, r)
		}
		switch {
		case err == nil:
		case errors.Is(err, chatapi.ErrStreamStarted) && r.Context().Err() != nil:
			s.log.Debug("anthropic: client went away mid-stream", "path", r.URL.Path, "request_id", id)
		case errors.Is(err, chatapi.ErrStreamStarted):
			s.log.Warn("anthropic: stream ended early", "path", r.URL.Path, "err", err, "request_id", id)
		default:
			he := writeError(w, err, id)
			if he.Status >= 500 {
				s.log.Warn("anthropic: request failed", "path", r.URL.Path, "status", he.Status, "msg", he.Msg, "err", he.Err, "request_id", id)
			}
		}
	})
}

// authenticate returns r under the context Options.Authenticate gave it,
// without its credential headers, so they never reach an upstream.
func (s *Service) authenticate(r *http.Request) (*http.Request, error) {
	if s.opts.Authenticate != nil {
		ctx, err := s.opts.Authenticate(r.Context(), r.Header)
		if err != nil {
			return r, err
		}
		r = r.WithContext(ctx)
	}
	r.Header.Del("Authorization")
	r.Header.Del("X-Api-Key")
	return r, nil
}

// readBody reads the request's body (at most MaxBodyBytes); a body too
// large stays an *http.MaxBytesError (413), any other failure is a 400.
func (s *Service) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := chatapi.ReadBody(w, r, s.opts.MaxBodyBytes)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, err
		}
		return nil, invalid("reading request body: %v", err)
	}
	return body, nil
}

// messages serves POST /v1/messages: parse, translate, send the chat turn
// through Chat, and answer as a stream or a Message.
func (s *Service) messages(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	req, err := parseRequest(body, false)
	if err != nil {
		return err
	}
	chatBody, err := toChat(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.TurnTimeout)
	defer cancel()
	resp, err := s.chat.Complete(ctx, chatapi.Turn{Body: chatBody, Header: turnHeader(r.Header, req)})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if req.Stream != nil && *req.Stream {
		return s.stream(w, req, resp)
	}
	return s.complete(w, req, resp)
}

// turnHeader is the header a turn is sent with: the client's less its
// credentials (gone since authenticate) and the anthropic-* headers, which
// only the Messages API reads; the session headers
// (X-Claude-Code-Session-Id, x-claude-code-agent-id…) stay for the
// gateway's session key. A request without a session header whose
// metadata.user_id names a session gets that id as
// X-Claude-Code-Session-Id.
func turnHeader(in http.Header, req *request) http.Header {
	h := make(http.Header, len(in))
	for k, v := range in {
		if strings.HasPrefix(k, "Anthropic-") || k == "Content-Length" {
			continue
		}
		h[k] = v
	}
	if h.Get("X-Claude-Code-Session-Id") == "" && req.Metadata != nil {
		if id := sessionFromUserID(req.Metadata.UserID); id != "" {
			h.Set("X-Claude-Code-Session-Id", id)
		}
	}
	return h
}

// copyHeader passes the upstream's headers on (the gateway's debug and
// rate-limit headers among them), less its framing.
func copyHeader(dst, src http.Header) {
	for k, v := range src {
		switch k {
		case "Content-Type", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive":
			continue
		}
		dst[k] = v
	}
}

// stream answers as text/event-stream: message_start and a ping at once,
// then the translated events as the upstream's chunks arrive.
func (s *Service) stream(w http.ResponseWriter, req *request, resp *http.Response) error {
	copyHeader(w.Header(), resp.Header)
	sw := chatapi.NewWriter(w, "text/event-stream; charset=utf-8")
	sw.Start()
	out := newSSESink(sw, s.opts.PingInterval)
	defer out.close()
	t := newTranslator(out, req.Model, req.StopSequences)
	err := t.start()
	if err == nil {
		err = out.ping()
	}
	if err == nil {
		err = t.run(resp)
	}
	if err == nil && t.failure != nil {
		err = errors.New(t.failure.detail.Message)
	}
	if err != nil {
		return errors.Join(chatapi.ErrStreamStarted, err)
	}
	return nil
}

// complete answers with one Message, built from the same event sequence.
func (s *Service) complete(w http.ResponseWriter, req *request, resp *http.Response) error {
	acc := &accumulator{}
	t := newTranslator(acc, req.Model, req.StopSequences)
	if err := t.start(); err != nil {
		return err
	}
	if err := t.run(resp); err != nil {
		return err
	}
	if f := t.failure; f != nil {
		return &apierror.Error{Status: f.status, Msg: f.detail.Message}
	}
	copyHeader(w.Header(), resp.Header)
	return chatapi.WriteJSON(w, http.StatusOK, acc.msg)
}

// countTokens serves POST /v1/messages/count_tokens: the prompt tokens
// of the chat body the request translates to, with the tools.
func (s *Service) countTokens(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	req, err := parseRequest(body, true)
	if err != nil {
		return err
	}
	if s.opts.Models != nil && !slices.Contains(s.opts.Models(), req.Model) {
		return apierror.NotFound("model_not_found", "The model '%s' does not exist.", req.Model)
	}
	chatBody, err := toChat(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.TurnTimeout)
	defer cancel()
	var n int
	if s.opts.CountTokens != nil {
		n, err = s.opts.CountTokens(ctx, chatBody)
	} else {
		n, err = s.countByCompletion(ctx, r.Header, req, chatBody)
	}
	if err != nil {
		return err
	}
	return chatapi.WriteJSON(w, http.StatusOK, map[string]int{"input_tokens": n})
}

// countByCompletion counts prompt tokens by a one-token completion.
func (s *Service) countByCompletion(ctx context.Context, h http.Header, req *request, chatBody []byte) (int, error) {
	chatBody, _ = sjson.SetBytes(chatBody, "max_tokens", 1)
	resp, err := s.chat.Complete(ctx, chatapi.Turn{Body: chatBody, Header: turnHeader(h, req)})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	acc := &accumulator{}
	t := newTranslator(acc, req.Model, nil)
	if err := t.start(); err != nil {
		return 0, err
	}
	if err := t.run(resp); err != nil {
		return 0, err
	}
	if f := t.failure; f != nil {
		return 0, &apierror.Error{Status: f.status, Msg: f.detail.Message}
	}
	return acc.msg.Usage.InputTokens + acc.msg.Usage.CacheReadInputTokens, nil
}
