package record

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Limits of a line Read accepts.
const (
	// MaxLineBytes caps a line: 16 MiB holds a million-token prompt's
	// block hashes at 16 tokens a block.
	MaxLineBytes = 16 << 20
	maxTokens    = 1 << 30
	maxIDBytes   = 256
	maxTimestamp = 253402300799999 // 9999-12-31T23:59:59.999Z in ms
)

// Read parses r's lines and calls fn with each entry, in order; it stops
// at the first bad line (an error naming it) or at fn's error. Blank
// lines are skipped, unknown fields ignored, and so is a last line that
// neither ends in a newline nor parses: a write cut short by a crash.
func Read(r io.Reader, fn func(Entry) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for n := 1; ; n++ {
		b, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("record: line %d: %w", n, err)
		}
		complete := len(b) > 0 && b[len(b)-1] == '\n'
		if t := bytes.TrimSpace(b); len(t) > 0 {
			e, perr := parseLine(t)
			switch {
			case perr != nil && !complete:
				return nil
			case perr != nil:
				return fmt.Errorf("record: line %d: %w", n, perr)
			}
			if err := fn(e); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
	}
}

// errLineTooLong reports a line over MaxLineBytes.
var errLineTooLong = fmt.Errorf("longer than %d bytes", MaxLineBytes)

// readLine returns the next line with its newline (without one at the
// end of the input, with io.EOF).
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > MaxLineBytes {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// ReadDir reads the recorded files in dir, oldest first (see Read).
func ReadDir(dir string, fn func(Entry) error) error {
	names, err := Files(dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := readFile(name, fn); err != nil {
			return err
		}
	}
	return nil
}

func readFile(name string, fn func(Entry) error) error {
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	defer f.Close()
	if err := Read(f, fn); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// parseLine decodes and validates one line.
func parseLine(b []byte) (Entry, error) {
	var l line
	if err := json.Unmarshal(b, &l); err != nil {
		return Entry{}, err
	}
	if err := l.validate(); err != nil {
		return Entry{}, err
	}
	e := Entry{Time: time.UnixMilli(l.Timestamp).UTC(), Tenant: l.Tenant, Session: l.Session, BlockTokens: l.BlockTokens,
		PromptTokens: l.InputLength, OutputTokens: l.OutputLength, Replica: l.Replica, CachedTokens: l.CachedTokens}
	if len(l.HashIDs) > 0 {
		e.Blocks = make([]uint64, len(l.HashIDs))
		for i, id := range l.HashIDs {
			e.Blocks[i] = uint64(id)
		}
	}
	return e, nil
}

// validate checks a decoded line's ranges.
func (l *line) validate() error {
	switch {
	case l.Timestamp < 0 || l.Timestamp > maxTimestamp:
		return fmt.Errorf("timestamp %d out of range", l.Timestamp)
	case l.InputLength < 0 || l.InputLength > maxTokens:
		return fmt.Errorf("input_length %d out of range", l.InputLength)
	case l.OutputLength < 0 || l.OutputLength > maxTokens:
		return fmt.Errorf("output_length %d out of range", l.OutputLength)
	case l.CachedTokens < 0 || l.CachedTokens > l.InputLength:
		return fmt.Errorf("cached_tokens %d not within input_length %d", l.CachedTokens, l.InputLength)
	case l.BlockTokens < 0 || l.BlockTokens > maxTokens:
		return fmt.Errorf("block_tokens %d out of range", l.BlockTokens)
	case len(l.HashIDs) > 0 && l.BlockTokens == 0:
		return errors.New("hash_ids without block_tokens")
	case len(l.Tenant) > maxIDBytes || len(l.Session) > maxIDBytes || len(l.Replica) > maxIDBytes:
		return errors.New("tenant, session or replica too long")
	}
	return nil
}
