package responses

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
)

// Options configures a Service. Redis is required; every other field has
// the default its doc states.
type Options struct {
	// Redis stores responses, items, conversations and background event
	// buffers. Required.
	Redis redis.UniversalClient
	// KeyPrefix is prepended to every key; default "".
	KeyPrefix string
	// Tenant returns the authenticated tenant of a request's context;
	// every stored record is scoped by it. nil means single-tenant: "".
	Tenant func(ctx context.Context) string
	// Config holds the tunables of the responses: block (TTLs, the turn
	// timeout, background workers); zero fields take its defaults.
	Config
	// LeaseTTL is how long a background run's lease (and a conversation
	// lock) lasts without renewal; it is renewed every LeaseTTL/3. A run
	// whose lease lapses is marked failed by any Service's sweeper.
	// Default 30s.
	LeaseTTL time.Duration
	// MaxBodyBytes bounds a request body; default 32 MiB.
	MaxBodyBytes int64
	// Models lists the served models; when set, requests for others get
	// 404 model_not_found. nil accepts any model (the upstream decides).
	Models func() []string
	// Tokenize counts the prompt tokens of a chat-completions body, for
	// POST /v1/responses/input_tokens. nil counts them by a one-token
	// completion through Chat (exact, but it runs the model).
	Tokenize func(ctx context.Context, chatBody []byte) (int, error)
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// Registerer registers the service's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Defaults of Config and Options.
const (
	DefaultTTL               = 30 * 24 * time.Hour
	DefaultEventTTL          = 24 * time.Hour
	DefaultTurnTimeout       = 10 * time.Minute
	DefaultBackgroundWorkers = 4
	DefaultLeaseTTL          = 30 * time.Second
	DefaultMaxBodyBytes      = 32 << 20
)

func (o *Options) fill() error {
	if o.Redis == nil {
		return errors.New("responses: Options.Redis is required")
	}
	if o.Tenant == nil {
		o.Tenant = func(context.Context) string { return "" }
	}
	o.Config = o.Config.WithDefaults()
	o.LeaseTTL = orDefault(o.LeaseTTL, DefaultLeaseTTL)
	o.MaxBodyBytes = orDefault(o.MaxBodyBytes, DefaultMaxBodyBytes)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

func orDefault[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// Service serves the Responses and Conversations APIs over a Chat. It is
// safe for concurrent use; New starts nothing, Run owns the background
// goroutines.
type Service struct {
	opts    Options
	chat    chatapi.Chat
	st      *store
	log     *slog.Logger
	metrics *metrics
	worker  string // this Service's consumer name in the job group

	mu      sync.Mutex                    // guards running
	running map[string]context.CancelFunc // record key → cancel of a background run here
}

// New returns a Service. It validates opts and registers metrics; it starts
// no goroutines.
func New(opts Options, chat chatapi.Chat) (*Service, error) {
	if chat == nil {
		return nil, errors.New("responses: a Chat is required")
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Service{
		opts: opts, chat: chat, log: opts.Logger, metrics: m,
		st: &store{rdb: opts.Redis, prefix: opts.KeyPrefix, ttl: opts.TTL,
			convTTL: opts.ConversationTTL, evTTL: opts.EventTTL},
		worker:  newID("w"),
		running: map[string]context.CancelFunc{},
	}
	return s, nil
}

// Handler serves /v1/responses… and /v1/conversations….
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	h := func(pattern string, fn func(http.ResponseWriter, *http.Request) error) {
		mux.Handle(pattern, s.adapt(fn))
	}
	h("POST /v1/responses", s.create)
	h("POST /v1/responses/input_tokens", s.inputTokens)
	h("POST /v1/responses/compact", s.compact)
	h("GET /v1/responses/{id}", s.retrieve)
	h("DELETE /v1/responses/{id}", s.deleteResponse)
	h("POST /v1/responses/{id}/cancel", s.cancel)
	h("GET /v1/responses/{id}/input_items", s.inputItems)
	h("POST /v1/conversations", s.createConversation)
	h("GET /v1/conversations/{id}", s.getConversation)
	h("POST /v1/conversations/{id}", s.updateConversation)
	h("DELETE /v1/conversations/{id}", s.deleteConversation)
	h("POST /v1/conversations/{id}/items", s.addConversationItems)
	h("GET /v1/conversations/{id}/items", s.listConversationItems)
	h("GET /v1/conversations/{id}/items/{item}", s.getConversationItem)
	h("DELETE /v1/conversations/{id}/items/{item}", s.deleteConversationItem)
	h("/", s.notFound)
	return mux
}

// adapt turns an error-returning handler into an http.Handler: every
// error becomes OpenAI's envelope.
func (s *Service) adapt(fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := fn(w, r)
		if err == nil {
			return
		}
		if errors.Is(err, chatapi.ErrStreamStarted) {
			s.log.Warn("responses: stream aborted", "path", r.URL.Path, "err", err)
			return
		}
		he := apierror.Write(w, err)
		if he.Status >= 500 {
			s.log.Error("responses: request failed", "path", r.URL.Path, "status", he.Status, "err", he)
		}
	})
}

func (s *Service) notFound(w http.ResponseWriter, r *http.Request) error {
	return apierror.NotFound("unknown_url", "Unknown request URL: %s %s.", r.Method, r.URL.Path)
}

func (s *Service) compact(w http.ResponseWriter, r *http.Request) error {
	return apierror.BadRequest("", "POST /v1/responses/compact is not supported: compaction items are opaque to OpenAI's models; send the history, or chain with previous_response_id.")
}

// checkModel answers 404 model_not_found when Models is set and does not
// list model.
func (s *Service) checkModel(model string) error {
	if s.opts.Models == nil {
		return nil
	}
	if ms := s.opts.Models(); ms != nil && !slices.Contains(ms, model) {
		return apierror.NotFound("model_not_found", "The model '%s' does not exist or you do not have access to it.", model)
	}
	return nil
}

// Run owns the background goroutines: BackgroundWorkers workers running
// queued responses, the sweeper failing runs whose lease lapsed (on any
// gateway) and reclaiming jobs of vanished workers, and the cancel
// subscriber. It blocks until ctx ends, then waits for them. Redis being
// unreachable when it starts (an outage, a failover) is not an error: the
// workers retry, and create the job group when they first read NOGROUP.
func (s *Service) Run(ctx context.Context) error {
	if err := s.ensureGroup(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("responses: create job group (the workers retry)", "err", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	for i := range s.opts.BackgroundWorkers {
		name := fmt.Sprintf("%s-%d", s.worker, i)
		g.Go(func() error { return s.workLoop(ctx, name) })
	}
	g.Go(func() error { return s.sweepLoop(ctx) })
	g.Go(func() error { return s.cancelLoop(ctx) })
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
