package chatapi

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// MaxEventBytes bounds one upstream SSE event (and the line it is read
// in), so a misbehaving upstream cannot exhaust memory.
const MaxEventBytes = 8 << 20

// Errors Reader.Next returns besides the body's own.
var (
	// ErrDone is the end of a stream that sent data: [DONE].
	ErrDone = errors.New("chatapi: [DONE]")
	// ErrEventTooLarge ends a stream whose event exceeds MaxEventBytes.
	ErrEventTooLarge = errors.New("chatapi: upstream event exceeds 8 MiB")
)

// ErrStreamStarted marks a front's failure after its stream's headers
// went out (Writer.Started): nothing more can be said to the client, so
// the front logs it rather than rendering an error response.
var ErrStreamStarted = errors.New("chatapi: stream already started")

// Reader reads the events of an upstream chat-completions stream
// (text/event-stream of chat.completion.chunk), one event per Next, never
// more of the body than the event needs. Lines end in LF or CRLF; the
// data lines of an event are joined with "\n" (one space after "data:"
// dropped); comments, event:, id: and retry: lines are skipped, and so is
// an event without data. A last event without its blank line still
// counts. A Reader is not safe for concurrent use.
type Reader struct {
	br   *bufio.Reader
	line []byte
	data []byte
	done bool
}

// NewReader reads the events of r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 32<<10)}
}

// Next returns the next event's data, valid until the next call. It
// returns ErrDone at data: [DONE] (and on every call after it), io.EOF when
// the body ends without one, ErrEventTooLarge for an event over
// MaxEventBytes, or the body's read error.
func (er *Reader) Next() ([]byte, error) {
	if er.done {
		return nil, ErrDone
	}
	er.data = er.data[:0]
	found := false
	for {
		l, err := er.readLine()
		if err != nil {
			if found && errors.Is(err, io.EOF) {
				return er.event()
			}
			return nil, err
		}
		switch {
		case len(l) == 0:
			if found {
				return er.event()
			}
		case bytes.HasPrefix(l, []byte("data:")):
			if found {
				er.data = append(er.data, '\n')
			}
			er.data = append(er.data, bytes.TrimPrefix(l[5:], []byte(" "))...)
			found = true
			if len(er.data) > MaxEventBytes {
				return nil, ErrEventTooLarge
			}
		}
	}
}

// event returns the data read, or ErrDone for [DONE].
func (er *Reader) event() ([]byte, error) {
	if string(bytes.TrimSpace(er.data)) == "[DONE]" {
		er.done = true
		return nil, ErrDone
	}
	return er.data, nil
}

// readLine returns the next line without its line ending; a last line
// without one is returned before io.EOF.
func (er *Reader) readLine() ([]byte, error) {
	er.line = er.line[:0]
	for {
		chunk, err := er.br.ReadSlice('\n')
		er.line = append(er.line, chunk...)
		if len(er.line) > MaxEventBytes {
			return nil, ErrEventTooLarge
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil && (len(er.line) == 0 || !errors.Is(err, io.EOF)):
			return nil, err
		}
		return bytes.TrimRight(er.line, "\r\n"), nil
	}
}

// Writer writes a front's own event stream to its client: each event as
// "event: <name>\ndata: <data>\n\n" (no event line when the name is ""; a
// data line per line of data), written and flushed at once, never held
// back. The stream's headers go out with Start or the first event, so an
// error before it can still be an error response. A Writer is not safe
// for concurrent use.
type Writer struct {
	w           http.ResponseWriter
	rc          *http.ResponseController
	contentType string
	started     bool
	buf         []byte
}

// NewWriter writes events to w with the given Content-Type; ""
// means "text/event-stream".
func NewWriter(w http.ResponseWriter, contentType string) *Writer {
	if contentType == "" {
		contentType = "text/event-stream"
	}
	return &Writer{w: w, rc: http.NewResponseController(w), contentType: contentType}
}

// Start sends the stream's headers and status 200, once: the
// Content-Type, Cache-Control: no-cache and X-Accel-Buffering: no (so
// that nginx passes each event on). Headers set on w before it go too.
func (sw *Writer) Start() {
	if sw.started {
		return
	}
	h := sw.w.Header()
	h.Set("Content-Type", sw.contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	sw.w.WriteHeader(http.StatusOK)
	sw.started = true
}

// Started reports whether the headers went out: an error can no longer
// be an error response.
func (sw *Writer) Started() bool { return sw.started }

// Event writes one event and flushes it. A writer that cannot flush is
// written to all the same.
func (sw *Writer) Event(name string, data []byte) error {
	sw.Start()
	b := sw.buf[:0]
	if name != "" {
		b = append(append(append(b, "event: "...), name...), '\n')
	}
	for {
		line, rest, more := bytes.Cut(data, []byte("\n"))
		b = append(append(append(b, "data: "...), line...), '\n')
		if !more {
			break
		}
		data = rest
	}
	b = append(b, '\n')
	sw.buf = b
	if _, err := sw.w.Write(b); err != nil {
		return fmt.Errorf("chatapi: write event: %w", err)
	}
	if err := sw.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("chatapi: flush event: %w", err)
	}
	return nil
}
