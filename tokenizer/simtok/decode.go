package simtok

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// The decoding of chat messages and of /tokenize bodies reads the JSON in
// one pass with gjson rather than through encoding/json, whose nested
// validation scans a long message's content six or seven times: a
// 16,000-word /tokenize body took about 4 ms of CPU that way (see
// BenchmarkTokenizeBody), which matters to a gateway tokenizing in
// process. They keep encoding/json's rules: keys match case-insensitively,
// the last of duplicate keys wins, null leaves a field empty, invalid
// UTF-8 in a string becomes U+FFFD, and a value of the wrong type is an
// error.

// decodeMessage reads one chat message from v, a valid JSON value.
func decodeMessage(v gjson.Result) (Message, error) {
	var m Message
	if v.Type == gjson.Null {
		return m, nil
	}
	if !v.IsObject() {
		return m, errors.New("a message must be an object")
	}
	var err error
	v.ForEach(func(k, val gjson.Result) bool {
		switch key := k.String(); {
		case strings.EqualFold(key, "role"):
			m.Role, err = jsonString(val, "role")
		case strings.EqualFold(key, "content"):
			m.Content, err = messageContent(val)
		case strings.EqualFold(key, "tool_calls"):
			m.ToolCalls = nil
			if val.Type != gjson.Null {
				err = json.Unmarshal([]byte(val.Raw), &m.ToolCalls)
			}
		case strings.EqualFold(key, "tool_call_id"):
			m.ToolCallID, err = jsonString(val, "tool_call_id")
		case strings.EqualFold(key, "name"):
			m.Name, err = jsonString(val, "name")
		}
		return err == nil
	})
	return m, err
}

// messageContent reads a message's content: a string, null, or an array
// of parts whose "text" and "input_text" parts are joined with "\n".
func messageContent(v gjson.Result) (string, error) {
	switch {
	case v.Type == gjson.Null:
		return "", nil
	case v.Type == gjson.String:
		return validUTF8(v.Str), nil
	case !v.IsArray():
		return "", errors.New("message content must be a string, an array of parts or null")
	}
	var b strings.Builder
	n := 0
	var err error
	v.ForEach(func(_, part gjson.Result) bool {
		var typ, text string
		if typ, text, err = contentPart(part); err != nil || (typ != "text" && typ != "input_text") {
			return err == nil
		}
		if n > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(text)
		n++
		return true
	})
	if err != nil {
		return "", fmt.Errorf("message content: %w", err)
	}
	return b.String(), nil
}

// contentPart reads a content part's type and text.
func contentPart(v gjson.Result) (typ, text string, err error) {
	if v.Type == gjson.Null {
		return "", "", nil
	}
	if !v.IsObject() {
		return "", "", errors.New("a content part must be an object")
	}
	v.ForEach(func(k, val gjson.Result) bool {
		switch key := k.String(); {
		case strings.EqualFold(key, "type"):
			typ, err = jsonString(val, "type")
		case strings.EqualFold(key, "text"):
			text, err = jsonString(val, "text")
		}
		return err == nil
	})
	return typ, text, err
}

// jsonString reads a string field; null is "".
func jsonString(v gjson.Result, field string) (string, error) {
	switch v.Type {
	case gjson.Null:
		return "", nil
	case gjson.String:
		return validUTF8(v.Str), nil
	}
	return "", fmt.Errorf("%s must be a string", field)
}

// jsonBool reads a boolean field; null is false.
func jsonBool(v gjson.Result, field string) (bool, error) {
	switch v.Type {
	case gjson.Null:
		return false, nil
	case gjson.True, gjson.False:
		return v.Bool(), nil
	}
	return false, fmt.Errorf("%s must be a boolean", field)
}

// validUTF8 replaces each byte of s that is not part of valid UTF-8 with
// U+FFFD, as encoding/json does.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r) // an invalid byte ranges as utf8.RuneError
	}
	return b.String()
}

// DecodeTokenizeRequest reads a /tokenize body, checking first that it is
// valid JSON when validate is set; its errors are the messages of
// /tokenize's 400s.
func DecodeTokenizeRequest(body []byte, validate bool) (TokenizeRequest, error) {
	var tr TokenizeRequest
	if validate && !gjson.ValidBytes(body) {
		var v any
		err := json.Unmarshal(body, &v) // for encoding/json's description of the fault
		if err == nil {
			err = errors.New("invalid JSON")
		}
		return tr, fmt.Errorf("JSON decode error: %v", err)
	}
	v := gjson.ParseBytes(body)
	if v.Type == gjson.Null {
		return tr, nil
	}
	if !v.IsObject() {
		return tr, errors.New("JSON decode error: the body must be an object")
	}
	var err error
	v.ForEach(func(k, val gjson.Result) bool {
		err = tr.field(k.String(), val)
		return err == nil
	})
	if err != nil {
		return tr, fmt.Errorf("JSON decode error: %v", err)
	}
	return tr, nil
}

// field sets the request's field key to val.
func (tr *TokenizeRequest) field(key string, val gjson.Result) error {
	var err error
	switch {
	case strings.EqualFold(key, "model"):
		tr.Model, err = jsonString(val, "model")
	case strings.EqualFold(key, "prompt"):
		tr.Prompt = nil
		if val.Type != gjson.Null {
			var p string
			p, err = jsonString(val, "prompt")
			tr.Prompt = &p
		}
	case strings.EqualFold(key, "messages"):
		tr.Messages, err = decodeMessages(val)
	case strings.EqualFold(key, "tools"):
		tr.Tools = nil
		if val.Type != gjson.Null {
			err = json.Unmarshal([]byte(val.Raw), &tr.Tools)
		}
	case strings.EqualFold(key, "add_generation_prompt"):
		tr.AddGenerationPrompt = nil
		if val.Type != gjson.Null {
			var b bool
			b, err = jsonBool(val, "add_generation_prompt")
			tr.AddGenerationPrompt = &b
		}
	case strings.EqualFold(key, "continue_final_message"):
		tr.ContinueFinalMessage, err = jsonBool(val, "continue_final_message")
	case strings.EqualFold(key, "return_token_strs"):
		tr.ReturnTokenStrs, err = jsonBool(val, "return_token_strs")
	}
	return err
}

// decodeMessages reads an array of messages; null is nil, [] is empty
// but not nil.
func decodeMessages(v gjson.Result) ([]Message, error) {
	if v.Type == gjson.Null {
		return nil, nil
	}
	if !v.IsArray() {
		return nil, errors.New("messages must be an array")
	}
	out := []Message{}
	var err error
	v.ForEach(func(_, mv gjson.Result) bool {
		var m Message
		if m, err = decodeMessage(mv); err == nil {
			out = append(out, m)
		}
		return err == nil
	})
	return out, err
}
