package gateway

import (
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/tenancy"
)

// handler is an http handler that returns its error; serve maps the error
// onto the response in one place (apierror.Write).
type handler func(w http.ResponseWriter, r *http.Request) error

func (g *Gateway) serve(route string, h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		g.obs.m.inflight.Inc()
		// Account in a defer: the proxy aborts a response that breaks
		// mid-body with panic(http.ErrAbortHandler), which net/http
		// handles by dropping the connection.
		defer func() {
			g.obs.m.inflight.Dec()
			code := rec.code()
			if p := recover(); p != nil {
				if r.Context().Err() != nil {
					code = apierror.StatusClientClosed
				}
				g.obs.m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
				panic(p)
			}
			g.obs.m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
			g.obs.m.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
		}()
		err := h(rec, r)
		if err == nil && rec.code() >= 500 {
			// A front that writes its own errors (Responses, Messages)
			// still leaves one line per failure.
			g.log.WarnContext(r.Context(), "request failed", "route", route, "status", rec.code(), "request_id", w.Header().Get("X-Request-Id"))
		}
		if err != nil {
			he := apierror.Write(rec, err)
			if he.Status == apierror.StatusClientClosed {
				rec.status = apierror.StatusClientClosed
			}
			if route != "readyz" && (he.Status >= 500 || (he.Err != nil && he.Status != apierror.StatusClientClosed)) {
				g.log.WarnContext(r.Context(), "request failed", "route", route, "status", he.Status, "msg", he.Msg, "err", he.Err, "request_id", w.Header().Get("X-Request-Id"))
			}
		}
	}
}

// statusRecorder remembers the status written through it. It passes
// flushes on, and Unwrap lets http.ResponseController reach the
// connection.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) code() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}

// serveFront serves an API front that writes its own answers and errors
// (in its own envelope) through serve, so that its route gets the request
// metrics and failure log every route gets.
func (g *Gateway) serveFront(route string, h http.Handler) http.HandlerFunc {
	return g.serve(route, func(w http.ResponseWriter, r *http.Request) error {
		h.ServeHTTP(w, r)
		return nil
	})
}

// routes builds the HTTP surface.
func (g *Gateway) routes() http.Handler {
	r := chi.NewRouter()
	if g.obs.trace.on() {
		r.Use(g.obs.trace.middleware)
	}
	r.Use(chatapi.RequestID, g.bodyDeadline)
	r.NotFound(g.serve("not_found", func(w http.ResponseWriter, r *http.Request) error {
		return apierror.NotFound("unknown_url", "Unknown request URL: %s %s.", r.Method, r.URL.Path)
	}))
	r.MethodNotAllowed(g.serve("method_not_allowed", func(w http.ResponseWriter, r *http.Request) error {
		return &apierror.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
			Msg: "Method " + r.Method + " is not allowed for " + r.URL.Path + "."}
	}))
	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.Get("/readyz", g.serve("readyz", g.ready))
	r.Get("/ui", uiPageHandler) // the page holds no data; its JSON needs the admin key
	r.Get("/ui/status.json", g.serve("status", g.status))
	if !g.edge.separateMetrics() {
		r.Handle("/metrics", promhttp.HandlerFor(g.obs.reg, promhttp.HandlerOpts{}))
	}
	r.Get("/admin/tenants/{tenant}/prefix-breaks", g.serve("prefix_breaks", g.prefixBreaksHandler))
	if g.tenants.admin != nil {
		r.Handle("/admin/*", g.tenants.admin)
	}
	// The Messages API authenticates itself, to answer in its own envelope.
	messages := g.messagesHandler()
	r.Handle("/v1/messages", messages)
	r.Handle("/v1/messages/*", messages)
	r.Group(func(r chi.Router) {
		r.Use(g.tenants.auth.MiddlewareWith(g.obs.trace.authenticate(g.tenants.auth.Authenticate)))
		r.Post("/v1/chat/completions", g.serve("chat_completions", g.inference(request.Chat)))
		r.Post("/v1/completions", g.serve("completions", g.inference(request.Completions)))
		if g.fronts.responses != nil {
			h := g.obs.trace.front(g.fronts.responses.Handler(), responsesOp, responsesID)
			for _, p := range []string{"/v1/responses", "/v1/responses/*"} {
				r.Handle(p, g.serveFront("responses", h))
			}
			for _, p := range []string{"/v1/conversations", "/v1/conversations/*"} {
				r.Handle(p, g.serveFront("conversations", h))
			}
		}
		r.Get("/v1/models", g.serve("models", g.listModels))
		r.Get("/v1/models/*", g.serve("model", g.getModel)) // ids may contain "/"
	})
	return r
}

// inference handles POST /v1/chat/completions and /v1/completions: read
// the body once (size-limited), parse it, send it through the routed
// client (Do) and stream the answer back.
func (g *Gateway) inference(api request.API) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		body, err := chatapi.ReadBody(w, r, g.cfg.MaxBodyBytes)
		if err != nil {
			return bodyError(err)
		}
		h := r.Header.Clone()
		proxy.SetForwarded(h, r)
		// The Content-Type is not checked: a bare `curl -d` sends form
		// encoding, and the body either parses as JSON or is rejected.
		p, _ := tenancy.FromContext(r.Context())
		req, err := request.Parse(api, h, body, p)
		if err != nil {
			return err
		}
		resp, err := g.Do(r.Context(), req)
		if err != nil {
			return err
		}
		proxy.CopyResponse(w, resp)
		return nil
	}
}

// ready reports whether at least one replica can take traffic.
func (g *Gateway) ready(w http.ResponseWriter, r *http.Request) error {
	if g.edge.draining.Load() {
		return apierror.Unavailable(nil, "draining: the gateway is shutting down")
	}
	for _, rep := range g.fleet.Snapshot().Replicas {
		if rep.State().Healthy {
			_, err := w.Write([]byte("ready\n"))
			return err
		}
	}
	return apierror.Unavailable(nil, "no healthy replica")
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (g *Gateway) model(id string) modelObject {
	return modelObject{ID: id, Object: "model", Created: g.edge.started.Unix(), OwnedBy: "warmpath"}
}

// listModels answers the union of the fleet's models that the caller may
// use.
func (g *Gateway) listModels(w http.ResponseWriter, r *http.Request) error {
	p, _ := tenancy.FromContext(r.Context())
	data := []modelObject{}
	for _, id := range g.fleet.Models() {
		if p == nil || p.Allows(id) == nil {
			data = append(data, g.model(id))
		}
	}
	return chatapi.WriteJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (g *Gateway) getModel(w http.ResponseWriter, r *http.Request) error {
	id := chi.URLParam(r, "*")
	if p, ok := tenancy.FromContext(r.Context()); ok && p.Allows(id) != nil {
		return apierror.NotFound("model_not_found", "The model '%s' does not exist.", id)
	}
	for _, m := range g.fleet.Models() {
		if m == id {
			return chatapi.WriteJSON(w, http.StatusOK, g.model(id))
		}
	}
	return apierror.NotFound("model_not_found", "The model '%s' does not exist.", id)
}
