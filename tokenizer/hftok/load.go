package hftok

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tidwall/gjson"
)

// Tokenizer is one model's tokenizer, built by Load or Parse.
type Tokenizer struct {
	raw    *addedSplitter // added tokens matched on the raw text
	normed *addedSplitter // added tokens matched after normalization; nil for none
	nfc    bool           // the normalizer is NFC
	splits []splitter     // the pre-tokenizer's splits, in order
	bpe    *bpe
	// prefix and suffix are the post-processor's special tokens around a
	// sequence encoded with special tokens (a completions prompt).
	prefix, suffix []uint32
	chat           *chatTemplate // nil when the model has no chat template
}

// Files in a model's directory, as Hugging Face lays them out.
const (
	TokenizerFile       = "tokenizer.json"
	TokenizerConfigFile = "tokenizer_config.json"
	ChatTemplateFile    = "chat_template.jinja" // takes precedence over tokenizer_config's chat_template
)

// Load reads a model's tokenizer from dir: tokenizer.json (required),
// tokenizer_config.json (for the chat template and its special tokens;
// optional) and chat_template.jinja (optional, preferred over the
// config's chat_template, as transformers does).
func Load(dir string) (*Tokenizer, error) {
	tj, err := os.ReadFile(filepath.Join(dir, TokenizerFile))
	if err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile(filepath.Join(dir, TokenizerConfigFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	tmpl, err := os.ReadFile(filepath.Join(dir, ChatTemplateFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return Parse(tj, cfg, string(tmpl))
}

// Parse builds a Tokenizer from the contents of tokenizer.json,
// tokenizer_config.json (nil for none) and chat_template.jinja ("" for
// none).
func Parse(tokenizerJSON, configJSON []byte, chatTemplate string) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
	}
	t, err := f.build()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
	}
	if t.chat, err = parseChat(configJSON, chatTemplate); err != nil {
		return nil, err
	}
	return t, nil
}

// fileJSON is the part of tokenizer.json the encoder uses.
type fileJSON struct {
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         modelJSON       `json:"model"`
}

type addedJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
}

type modelJSON struct {
	Type                    string   `json:"type"`
	Dropout                 *float64 `json:"dropout"`
	ContinuingSubwordPrefix *string  `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string  `json:"end_of_word_suffix"`
	ByteFallback            bool     `json:"byte_fallback"`
	IgnoreMerges            bool     `json:"ignore_merges"`
	// Vocab (token → id) and Merges (ranked pairs) are read with gjson:
	// reflection over Qwen3's 151k entries of each took most of a second.
	Vocab  json.RawMessage `json:"vocab"`
	Merges json.RawMessage `json:"merges"`
}

// component is the common shape of a normalizer, pre-tokenizer or
// post-processor: its type and its other fields.
type component struct {
	Type string `json:"type"`
	// Sequence
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	// Split
	Pattern  struct{ Regex, String *string } `json:"pattern"`
	Behavior string                          `json:"behavior"`
	Invert   bool                            `json:"invert"`
	// ByteLevel
	AddPrefixSpace bool  `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"` // absent is true, as in Hugging Face tokenizers
	// TemplateProcessing
	Single        []map[string]struct{ ID string }  `json:"single"`
	SpecialTokens map[string]struct{ IDs []uint32 } `json:"special_tokens"`
}

// parseComponent decodes raw; ok is false for null or absent.
func parseComponent(raw json.RawMessage) (c component, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return c, false, nil
	}
	err = json.Unmarshal(raw, &c)
	return c, true, err
}

func (f *fileJSON) build() (*Tokenizer, error) {
	t := &Tokenizer{}
	var err error
	if t.bpe, err = newBPE(&f.Model); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if t.nfc, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	var byteLevel bool
	if t.splits, byteLevel, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	if !byteLevel {
		return nil, errors.New("pre_tokenizer: no ByteLevel step: only byte-level BPE (GPT-2, Llama 3, Qwen2 families) is supported")
	}
	if t.prefix, t.suffix, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	if t.raw, t.normed, err = newAddedSplitters(f.AddedTokens, t.nfc); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	return t, nil
}

// parseNormalizer accepts none, NFC, or a Sequence of at most one NFC.
func parseNormalizer(raw json.RawMessage) (nfc bool, err error) {
	c, ok, err := parseComponent(raw)
	if err != nil || !ok {
		return false, err
	}
	switch c.Type {
	case "NFC":
		return true, nil
	case "Sequence":
		if len(c.Normalizers) > 1 {
			return false, errors.New("a Sequence of more than one normalizer is not supported")
		}
		if len(c.Normalizers) == 1 {
			return parseNormalizer(c.Normalizers[0])
		}
		return false, nil
	}
	return false, fmt.Errorf("%q is not supported (only none and NFC)", c.Type)
}

// parsePreTokenizer returns the splits and whether a ByteLevel step ends
// the chain; a step after ByteLevel is refused.
func parsePreTokenizer(raw json.RawMessage) (splits []splitter, byteLevel bool, err error) {
	c, ok, err := parseComponent(raw)
	if err != nil || !ok {
		return nil, false, err
	}
	steps := []component{c}
	if c.Type == "Sequence" {
		steps = steps[:0]
		for _, r := range c.PreTokenizers {
			s, ok, err := parseComponent(r)
			if err != nil {
				return nil, false, err
			}
			if ok {
				steps = append(steps, s)
			}
		}
	}
	for i, s := range steps {
		if byteLevel {
			return nil, false, fmt.Errorf("step %d (%s) after ByteLevel is not supported", i, s.Type)
		}
		switch s.Type {
		case "Split":
			sp, err := newSplit(s)
			if err != nil {
				return nil, false, fmt.Errorf("step %d: %w", i, err)
			}
			splits = append(splits, sp)
		case "ByteLevel":
			if s.AddPrefixSpace {
				return nil, false, errors.New("ByteLevel add_prefix_space is not supported")
			}
			if s.UseRegex == nil || *s.UseRegex {
				sp, err := newSplitter(gpt2Pattern, true)
				if err != nil {
					return nil, false, err
				}
				splits = append(splits, sp)
			}
			byteLevel = true
		default:
			return nil, false, fmt.Errorf("step %d: %q is not supported (only Split and ByteLevel)", i, s.Type)
		}
	}
	return splits, byteLevel, nil
}

func newSplit(s component) (splitter, error) {
	if s.Pattern.Regex == nil {
		return nil, errors.New("Split: only a Regex pattern is supported")
	}
	if s.Behavior != "Isolated" || s.Invert {
		return nil, fmt.Errorf("Split: behavior %q (invert %v) is not supported (only Isolated)", s.Behavior, s.Invert)
	}
	return newSplitter(*s.Pattern.Regex, true)
}

// parsePostProcessor returns the special tokens added around a sequence:
// none for ByteLevel (it only moves offsets), TemplateProcessing's single
// template, or a Sequence of those.
func parsePostProcessor(raw json.RawMessage) (prefix, suffix []uint32, err error) {
	c, ok, err := parseComponent(raw)
	if err != nil || !ok {
		return nil, nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil, nil
	case "TemplateProcessing":
		return parseTemplate(c)
	case "Sequence":
		for _, r := range c.Processors {
			p, s, err := parsePostProcessor(r)
			if err != nil {
				return nil, nil, err
			}
			if len(p)+len(s) > 0 && len(prefix)+len(suffix) > 0 {
				return nil, nil, errors.New("more than one TemplateProcessing is not supported")
			}
			if len(p)+len(s) > 0 {
				prefix, suffix = p, s
			}
		}
		return prefix, suffix, nil
	}
	return nil, nil, fmt.Errorf("%q is not supported (only ByteLevel and TemplateProcessing)", c.Type)
}

// parseTemplate reads TemplateProcessing's single template: special
// tokens, one sequence $A, special tokens.
func parseTemplate(c component) (prefix, suffix []uint32, err error) {
	seen := false
	for _, item := range c.Single {
		if seq, ok := item["Sequence"]; ok {
			if seen || seq.ID != "A" {
				return nil, nil, errors.New(`TemplateProcessing: single must hold exactly one sequence "A"`)
			}
			seen = true
			continue
		}
		sp, ok := item["SpecialToken"]
		if !ok || len(item) != 1 {
			return nil, nil, errors.New("TemplateProcessing: single has an item that is neither SpecialToken nor Sequence")
		}
		tok, ok := c.SpecialTokens[sp.ID]
		if !ok {
			return nil, nil, fmt.Errorf("TemplateProcessing: special token %q is not in special_tokens", sp.ID)
		}
		if seen {
			suffix = append(suffix, tok.IDs...)
		} else {
			prefix = append(prefix, tok.IDs...)
		}
	}
	if !seen {
		return nil, nil, errors.New(`TemplateProcessing: single has no sequence "A"`)
	}
	return prefix, suffix, nil
}

// mergePair reads one merges entry: "a b" (older files) or ["a", "b"].
func mergePair(m gjson.Result) (a, b string, err error) {
	if m.Type == gjson.String {
		a, b, ok := strings.Cut(m.String(), " ")
		if !ok || strings.Contains(b, " ") {
			return "", "", fmt.Errorf("merge %q is not two tokens", m.String())
		}
		return a, b, nil
	}
	var parts []string
	if m.IsArray() {
		m.ForEach(func(_, p gjson.Result) bool {
			parts = append(parts, p.String())
			return p.Type == gjson.String && len(parts) <= 2
		})
	}
	if len(parts) != 2 {
		return "", "", fmt.Errorf("merge %s is not two tokens", m.Raw)
	}
	return parts[0], parts[1], nil
}
