package hftok

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// chatTemplate is a model's compiled chat template and the special tokens
// transformers passes it (bos_token, eos_token, unk_token, pad_token).
type chatTemplate struct {
	tmpl *jinja.Template
	// toolUse is the "tool_use" template of a config that names several,
	// which transformers picks when the request has tools; nil for none.
	toolUse *jinja.Template
	vars    map[string]jinja.Value
	// indentJSON: the template calls tojson with indent, which the Jinja
	// engine renders unlike Python (keys sorted, <>& escaped), so bodies
	// whose tools or tool calls it would render are refused.
	indentJSON bool
}

// configJSON is the part of tokenizer_config.json the chat template uses.
type configJSON struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	UNK          json.RawMessage `json:"unk_token"`
	PAD          json.RawMessage `json:"pad_token"`
}

// parseChat compiles the chat template: file's, else the config's; nil
// when there is neither.
func parseChat(cfgJSON []byte, file string) (*chatTemplate, error) {
	var cfg configJSON
	if len(cfgJSON) > 0 {
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			return nil, fmt.Errorf("%s: %w", TokenizerConfigFile, err)
		}
	}
	src, toolUse, err := templateSources(cfg.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("%s: chat_template: %w", TokenizerConfigFile, err)
	}
	if file != "" {
		src, toolUse = file, ""
	}
	if src == "" {
		return nil, nil
	}
	c := &chatTemplate{vars: map[string]jinja.Value{}, indentJSON: strings.Contains(src+toolUse, "indent=")}
	if c.tmpl, err = jinja.Compile(src); err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	if toolUse != "" {
		if c.toolUse, err = jinja.Compile(toolUse); err != nil {
			return nil, fmt.Errorf("chat template tool_use: %w", err)
		}
	}
	for name, raw := range map[string]json.RawMessage{"bos_token": cfg.BOS, "eos_token": cfg.EOS, "unk_token": cfg.UNK, "pad_token": cfg.PAD} {
		if tok, ok := specialToken(raw); ok {
			c.vars[name] = jinja.NewString(tok)
		}
	}
	return c, nil
}

// templateSources reads chat_template: a string, or a list of named
// templates ("default" and maybe "tool_use").
func templateSources(raw json.RawMessage) (main, toolUse string, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", "", nil
	}
	if json.Unmarshal(raw, &main) == nil {
		return main, "", nil
	}
	var named []struct{ Name, Template string }
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", "", errors.New("neither a string nor a list of named templates")
	}
	for _, n := range named {
		switch n.Name {
		case "default":
			main = n.Template
		case "tool_use":
			toolUse = n.Template
		}
	}
	if main == "" {
		return "", "", errors.New(`no "default" template`)
	}
	return main, toolUse, nil
}

// specialToken reads a special token entry: a string or an AddedToken
// object with "content".
func specialToken(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, s != ""
	}
	var obj struct{ Content string }
	if json.Unmarshal(raw, &obj) == nil && obj.Content != "" {
		return obj.Content, true
	}
	return "", false
}
