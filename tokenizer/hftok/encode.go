package hftok

import (
	"errors"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// errInvalidUTF8: vLLM, behind a JSON decoder, never sees such text.
var errInvalidUTF8 = errors.New("hftok: text is not valid UTF-8")

// Encode returns text's token ids; withSpecial adds the post-processor's
// special tokens (Llama 3's <|begin_of_text|>), as vLLM does for a
// completions prompt and not for a rendered chat.
func (t *Tokenizer) Encode(text string, withSpecial bool) ([]uint32, error) {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+len(t.prefix)+len(t.suffix)), text, withSpecial)
}

// AppendEncode is Encode appending to out.
func (t *Tokenizer) AppendEncode(out []uint32, text string, withSpecial bool) ([]uint32, error) {
	if !utf8.ValidString(text) {
		return nil, errInvalidUTF8
	}
	if withSpecial {
		out = append(out, t.prefix...)
	}
	e := encoder{t: t, out: out}
	if err := t.raw.split(text, e.normalized, e.id); err != nil {
		return nil, err
	}
	if withSpecial {
		e.out = append(e.out, t.suffix...)
	}
	return e.out, nil
}

// encoder carries one Encode's output through the stages' callbacks.
type encoder struct {
	t   *Tokenizer
	out []uint32
}

func (e *encoder) id(id uint32) { e.out = append(e.out, id) }

// normalized normalizes a stretch between raw added tokens, then matches
// the normalized added tokens in it.
func (e *encoder) normalized(s string) error {
	if e.t.nfc && !norm.NFC.IsNormalString(s) {
		s = norm.NFC.String(s)
	}
	return e.t.normed.split(s, e.pretokenized, e.id)
}

// pretokenized runs the splits over s and BPE over each piece.
func (e *encoder) pretokenized(s string) error {
	return e.splitFrom(0, s)
}

func (e *encoder) splitFrom(step int, s string) error {
	if step == len(e.t.splits) {
		e.out = e.t.bpe.encode(e.out, s)
		return nil
	}
	var err error
	serr := e.t.splits[step].split(s, func(piece string) {
		if err == nil {
			err = e.splitFrom(step+1, piece)
		}
	})
	return errors.Join(serr, err)
}
