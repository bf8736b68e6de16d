package hftok

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
	"github.com/tidwall/gjson"
)

// conversation converts the request's messages to what vLLM passes the
// template (its parse_chat_messages with the "string" content format).
func conversation(messages gjson.Result) (jinja.Value, error) {
	var out []jinja.Value
	var err error
	messages.ForEach(func(_, m gjson.Result) bool {
		var v jinja.Value
		if v, err = message(m); err == nil {
			out = append(out, v)
		}
		return err == nil
	})
	if err != nil {
		return jinja.Value{}, err
	}
	return jinja.NewList(out), nil
}

// messageFields are the fields of a message vLLM keeps, read in one
// pass: a Get per field would scan a long content once each.
type messageFields struct {
	role, content, toolCalls, reasoning, toolCallID, name, tools gjson.Result
}

func fieldsOf(m gjson.Result) (f messageFields) {
	m.ForEach(func(k, v gjson.Result) bool {
		switch k.String() {
		case "role":
			f.role = v
		case "content":
			f.content = v
		case "tool_calls":
			f.toolCalls = v
		case "reasoning":
			f.reasoning = v
		case "tool_call_id":
			f.toolCallID = v
		case "name":
			f.name = v
		case "tools":
			f.tools = v
		}
		return true
	})
	return f
}

func message(m gjson.Result) (jinja.Value, error) {
	if !m.IsObject() {
		return jinja.Value{}, errors.New("hftok: a message is not an object")
	}
	f := fieldsOf(m)
	if f.role.Type != gjson.String {
		return jinja.Value{}, errors.New("hftok: a message has no role")
	}
	content, err := contentText(f.content)
	if err != nil {
		return jinja.Value{}, err
	}
	v := jinja.NewDict()
	d := v.AsDict()
	d.Set("role", jinja.NewString(f.role.String()))
	d.Set("content", jinja.NewString(content))
	switch f.role.String() {
	case "assistant":
		if f.toolCalls.Exists() && f.toolCalls.Type != gjson.Null {
			if err := setToolCalls(d, f.toolCalls); err != nil {
				return jinja.Value{}, err
			}
		}
		if f.reasoning.Exists() && f.reasoning.Type != gjson.Null {
			d.Set("reasoning", jinja.NewString(f.reasoning.String()))
			d.Set("reasoning_content", jinja.NewString(f.reasoning.String()))
		}
	case "tool":
		if f.toolCallID.Exists() {
			d.Set("tool_call_id", value(f.toolCallID))
		}
	case "developer":
		d.Set("tools", value(f.tools))
	}
	if f.name.Type == gjson.String {
		d.Set("name", jinja.NewString(f.name.String()))
	}
	return v, nil
}

// contentText is a message's content as vLLM's "string" format gives it:
// a string as is, null as "", a list's text parts joined by "\n".
func contentText(c gjson.Result) (string, error) {
	switch {
	case !c.Exists() || c.Type == gjson.Null:
		return "", nil
	case c.Type == gjson.String:
		return c.String(), nil
	case !c.IsArray():
		return "", errors.New("hftok: message content is neither a string nor a list of parts")
	}
	var texts []string
	var err error
	c.ForEach(func(_, part gjson.Result) bool {
		switch typ := part.Get("type").String(); {
		case part.Type == gjson.String:
			texts = append(texts, part.String())
		case typ == "text" || typ == "input_text" || typ == "output_text":
			if txt := part.Get("text"); txt.Exists() && txt.Type != gjson.Null {
				texts = append(texts, txt.String())
			}
		default:
			err = fmt.Errorf("hftok: content part type %q is not supported", typ)
		}
		return err == nil
	})
	return strings.Join(texts, "\n"), err
}

// setToolCalls sets an assistant message's tool_calls as vLLM leaves
// them: dropped when empty, each function's arguments parsed from their
// JSON string into an object ({} when empty, not JSON or not an object).
func setToolCalls(d *jinja.Dict, calls gjson.Result) error {
	if !calls.IsArray() {
		d.Set("tool_calls", value(calls))
		return nil
	}
	items := calls.Array()
	if len(items) == 0 {
		return nil
	}
	list := make([]jinja.Value, 0, len(items))
	for _, call := range items {
		fn := call.Get("function")
		if !call.IsObject() || !fn.IsObject() || call.Get("type").Exists() && call.Get("type").String() != "function" {
			return errors.New("hftok: a tool call is not a function call")
		}
		args := arguments(fn.Get("arguments"))
		if !rendersAsPython(args) {
			return errUnlikePython
		}
		v := value(call)
		f, _ := v.AsDict().Get("function")
		f.AsDict().Set("arguments", value(args))
		list = append(list, v)
	}
	d.Set("tool_calls", jinja.NewList(list))
	return nil
}

// arguments returns a tool call's arguments as vLLM parses them: the
// object, or the object its JSON string holds; {} for anything else.
func arguments(a gjson.Result) gjson.Result {
	if a.Type == gjson.String {
		if s := a.String(); s != "" && gjson.Valid(s) {
			a = gjson.Parse(s)
		}
	}
	if !a.IsObject() {
		return gjson.Parse("{}")
	}
	return a
}

// errUnlikePython: what the template would pass through tojson holds a
// value the Jinja engine encodes unlike Python's json.dumps.
var errUnlikePython = errors.New("hftok: tools or tool call arguments hold a float with an integral value, a very large integer or U+2028/U+2029, which the template engine's tojson renders unlike Python's")

// rendersAsPython reports whether tojson renders r as Python's
// json.dumps(ensure_ascii=False) does: the engine writes 1.0 as 1, and
// escapes U+2028 and U+2029, where Python does not.
func rendersAsPython(r gjson.Result) bool {
	switch r.Type {
	case gjson.Number:
		if strings.ContainsAny(r.Raw, ".eE") {
			return r.Num != float64(int64(r.Num))
		}
		return len(r.Raw) < 16
	case gjson.String:
		return !strings.ContainsAny(r.String(), "\u2028\u2029")
	case gjson.JSON:
		ok := true
		r.ForEach(func(_, v gjson.Result) bool {
			ok = rendersAsPython(v)
			return ok
		})
		return ok
	}
	return true
}

// toolDicts renders the request's tools as vLLM's model_dump gives them:
// {"type", "function": {"name", "description", "parameters", …}, …},
// declared fields first (null when absent), then any others in order.
func toolDicts(tools gjson.Result) (jinja.Value, error) {
	var list []jinja.Value
	var err error
	tools.ForEach(func(_, tool gjson.Result) bool {
		fn := tool.Get("function")
		if !tool.IsObject() || !fn.IsObject() || fn.Get("name").Type != gjson.String {
			err = errors.New("hftok: a tool is not a function with a name")
			return false
		}
		if !rendersAsPython(tool) {
			err = errUnlikePython
			return false
		}
		list = append(list, ordered(tool, map[string]jinja.Value{"function": ordered(fn, nil, "name", "description", "parameters")}, "type", "function"))
		return true
	})
	return jinja.NewList(list), err
}

// ordered converts object o with the keys first in that order (null when
// absent, or the value in over when given), then o's other keys.
func ordered(o gjson.Result, over map[string]jinja.Value, first ...string) jinja.Value {
	v := jinja.NewDict()
	d := v.AsDict()
	for _, k := range first {
		switch x, ok := over[k]; {
		case ok:
			d.Set(k, x)
		case k == "type" && !o.Get(k).Exists():
			d.Set(k, jinja.NewString("function"))
		default:
			d.Set(k, value(o.Get(k)))
		}
	}
	o.ForEach(func(k, x gjson.Result) bool {
		if !d.Has(k.String()) {
			d.Set(k.String(), value(x))
		}
		return true
	})
	return v
}

// value converts JSON to a template value, keeping object keys in order.
func value(r gjson.Result) jinja.Value {
	switch r.Type {
	case gjson.String:
		return jinja.NewString(r.String())
	case gjson.True:
		return jinja.NewBool(true)
	case gjson.False:
		return jinja.NewBool(false)
	case gjson.Number:
		if strings.ContainsAny(r.Raw, ".eE") {
			return jinja.NewFloat(r.Float())
		}
		return jinja.NewInt(r.Int())
	case gjson.JSON:
		if r.IsArray() {
			var items []jinja.Value
			r.ForEach(func(_, x gjson.Result) bool { items = append(items, value(x)); return true })
			return jinja.NewList(items)
		}
		v := jinja.NewDict()
		r.ForEach(func(k, x gjson.Result) bool { v.AsDict().Set(k.String(), value(x)); return true })
		return v
	}
	return jinja.None() // null, or absent
}
