package proxy

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
)

// SetForwarded adds X-Forwarded-For, -Host and -Proto for a request that
// arrived as in (the proxy's conventions).
func SetForwarded(h http.Header, in *http.Request) {
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := in.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h.Set("X-Forwarded-For", ip)
	}
	h.Set("X-Forwarded-Host", in.Host)
	proto := "http"
	if in.TLS != nil {
		proto = "https"
	}
	h.Set("X-Forwarded-Proto", proto)
}

// CopyResponse writes the routed client's response to the HTTP client:
// headers minus hop-by-hop ones, the status, then the body as it arrives,
// flushing after every write of an event stream. A body that breaks after
// the headers went out aborts the connection (net/http's ErrAbortHandler),
// the honest signal once a status has been sent.
func CopyResponse(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	h := w.Header()
	for k, vv := range resp.Header {
		h[k] = vv
	}
	for _, k := range []string{"Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		h.Del(k)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	for {
		n, err := resp.Body.Read(*buf)
		if n > 0 {
			if _, werr := w.Write((*buf)[:n]); werr != nil {
				return // the client went away; closing the body cancels upstream
			}
			if stream {
				_ = rc.Flush()
			}
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			panic(http.ErrAbortHandler)
		}
	}
}

// copyBuffers lends CopyResponse 32 KiB buffers.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
