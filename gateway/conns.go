package gateway

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/internal/apierror"
)

// ServerConfig bounds what clients can hold of the gateway's HTTP server:
// slow or huge requests, and connections.
type ServerConfig struct {
	// HeaderTimeout bounds reading a request's headers; default 10s.
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// MaxHeaderBytes bounds a request's headers; default 64 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// BodyTimeout bounds reading a request's body, from the end of its
	// headers; default 60s. A slower body is answered 408 and its
	// connection closed.
	BodyTimeout time.Duration `yaml:"body_timeout"`
	// IdleTimeout closes keep-alive connections idle this long; default
	// 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnsPerClient bounds the connections one client address holds
	// at once; more are closed as they arrive. Default 512; negative
	// disables.
	MaxConnsPerClient int `yaml:"max_conns_per_client"`
	// PreStop is how long, after SIGTERM, the gateway keeps serving with
	// /readyz answering 503, so load balancers stop sending it traffic;
	// default 5s, negative for none (nothing in front to drain).
	PreStop time.Duration `yaml:"pre_stop"`
	// DrainTimeout is how long, after the pre-stop period, in-flight
	// requests may take to finish; streams still open then are ended with
	// an error event. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
}

func (s *ServerConfig) withDefaults() {
	def := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	def(&s.HeaderTimeout, 10*time.Second)
	def(&s.BodyTimeout, time.Minute)
	def(&s.IdleTimeout, 2*time.Minute)
	def(&s.PreStop, 5*time.Second)
	def(&s.DrainTimeout, 30*time.Second)
	if s.MaxHeaderBytes == 0 {
		s.MaxHeaderBytes = 64 << 10
	}
	if s.MaxConnsPerClient == 0 {
		s.MaxConnsPerClient = 512
	}
}

// clientLimiter wraps a listener so that one client address holds at most
// limit connections at once; connections beyond it are closed on arrival
// and counted.
type clientLimiter struct {
	net.Listener
	limit    int
	rejected prometheus.Counter

	mu    sync.Mutex // guards conns
	conns map[string]int
}

func limitClients(ln net.Listener, limit int, rejected prometheus.Counter) net.Listener {
	if limit < 0 {
		return ln
	}
	return &clientLimiter{Listener: ln, limit: limit, rejected: rejected, conns: map[string]int{}}
}

// Accept implements net.Listener.
func (l *clientLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.mu.Lock()
		over := l.conns[host] >= l.limit
		if !over {
			l.conns[host]++
		}
		l.mu.Unlock()
		if over {
			l.rejected.Inc()
			c.Close()
			continue
		}
		return &countedConn{Conn: c, release: func() { l.release(host) }}, nil
	}
}

func (l *clientLimiter) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[host]--; l.conns[host] <= 0 {
		delete(l.conns, host)
	}
}

// countedConn gives its client's slot back once, when closed.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// bodyDeadline bounds the reading of every request body: the connection's
// read deadline is set to BodyTimeout when the handler starts and lifted
// once the body has been read (or closed), so it never cuts the long
// response that may follow.
func (g *Gateway) bodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(g.cfg.Server.BodyTimeout)) == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline when the body is done.
type deadlineBody struct {
	io.ReadCloser
	once sync.Once
	lift func()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.lift)
	}
	return n, err
}

func (b *deadlineBody) Close() error {
	b.once.Do(b.lift)
	return b.ReadCloser.Close()
}

// bodyError maps a failure to read a request body: too large (413), too
// slow (408, server.body_timeout), or a client that went away (499).
func bodyError(err error) error {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return err
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return &apierror.Error{Status: http.StatusRequestTimeout, Type: apierror.TypeInvalidRequest, Code: "request_timeout",
			Msg: "The request body did not arrive within the server's body timeout.", Err: err,
			Header: http.Header{"Connection": {"close"}}}
	}
	return &apierror.Error{Status: apierror.StatusClientClosed, Type: apierror.TypeInvalidRequest, Msg: "client closed request", Err: err}
}
