package responses

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/vllmsim"
)

func TestCreateText(t *testing.T) { redistest.Each(t, testCreateText) }

func testCreateText(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	r := e.create(t, "acme", map[string]any{"input": "Say hello.", "instructions": "Be brief.", "metadata": map[string]string{"k": "v"}})
	if r.Object != "response" || r.Status != StatusCompleted || !strings.HasPrefix(r.ID, "resp_") {
		t.Fatalf("got object %q status %q id %q", r.Object, r.Status, r.ID)
	}
	if len(r.Output) != 1 || r.Output[0].Type != ItemMessage || r.Output[0].Role != "assistant" || r.Output[0].Content[0].Text == "" {
		t.Fatalf("output = %+v; want one assistant message with text", r.Output)
	}
	if r.Usage == nil || r.Usage.InputTokens == 0 || r.Usage.OutputTokens == 0 || r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Fatalf("usage = %+v", r.Usage)
	}
	if r.Metadata["k"] != "v" || deref(r.Instructions) != "Be brief." || r.CompletedAt == nil {
		t.Fatalf("echo: metadata %v instructions %v completed_at %v", r.Metadata, r.Instructions, r.CompletedAt)
	}
	// The upstream got the instructions as a leading system message and the
	// input as a user message, streaming with usage.
	turns := e.chat.recorded()
	if len(turns) != 1 {
		t.Fatalf("%d upstream turns; want 1", len(turns))
	}
	var body struct {
		Messages      []map[string]any `json:"messages"`
		Stream        bool             `json:"stream"`
		StreamOptions map[string]bool  `json:"stream_options"`
	}
	if err := json.Unmarshal(turns[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}}
	if fmt.Sprint(body.Messages) != fmt.Sprint(want) || !body.Stream || !body.StreamOptions["include_usage"] {
		t.Fatalf("upstream body = %s", turns[0].Body)
	}
	if turns[0].Session != r.ID || turns[0].Tenant != "acme" {
		t.Fatalf("turn session %q tenant %q; want the response ID (chain root) and acme", turns[0].Session, turns[0].Tenant)
	}
	// GET returns the stored response with the same ID and output.
	code, b := e.do(t, "GET", "/v1/responses/"+r.ID, "acme", nil)
	var got Response
	if code != 200 || json.Unmarshal(b, &got) != nil || got.ID != r.ID || got.Output[0].Content[0].Text != r.Output[0].Content[0].Text {
		t.Fatalf("GET: %d %s", code, b)
	}
}

func TestStreamTextEventSequence(t *testing.T) { redistest.Each(t, testStreamTextEventSequence) }

func testStreamTextEventSequence(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	evs := e.stream(t, "acme", map[string]any{"input": "Say hello."})
	ts := types(evs)
	head := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	tail := []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if len(ts) < len(head)+len(tail)+1 || !slices.Equal(ts[:len(head)], head) || !slices.Equal(ts[len(ts)-len(tail):], tail) {
		t.Fatalf("event types = %v", ts)
	}
	var text strings.Builder
	for i, ev := range evs {
		if ev.Seq != i {
			t.Fatalf("event %d has sequence_number %d", i, ev.Seq)
		}
		if ev.Name != ev.Type {
			t.Fatalf("event: line %q differs from type %q", ev.Name, ev.Type)
		}
		var m map[string]json.RawMessage
		_ = json.Unmarshal(ev.Data, &m)
		if _, ok := m["error"]; ok {
			t.Fatalf("event %s has a top-level error key: %s", ev.Type, ev.Data)
		}
		if ev.Type == "response.output_text.delta" {
			var d struct {
				Delta    string            `json:"delta"`
				Logprobs []json.RawMessage `json:"logprobs"`
			}
			_ = json.Unmarshal(ev.Data, &d)
			if d.Logprobs == nil {
				t.Fatalf("delta without logprobs: %s", ev.Data)
			}
			text.WriteString(d.Delta)
		}
	}
	var done struct {
		Response Response `json:"response"`
	}
	if err := json.Unmarshal(evs[len(evs)-1].Data, &done); err != nil {
		t.Fatal(err)
	}
	r := done.Response
	if r.Status != StatusCompleted || r.Usage == nil || r.Output[0].Content[0].Text != text.String() {
		t.Fatalf("completed response %+v; deltas %q", r, text.String())
	}
	// Stored before response.completed was sent: retrievable now.
	if code, b := e.do(t, "GET", "/v1/responses/"+r.ID, "acme", nil); code != 200 {
		t.Fatalf("GET after completed: %d %s", code, b)
	}
}

func TestStreamFunctionCallEvents(t *testing.T) { redistest.Each(t, testStreamFunctionCallEvents) }

func testStreamFunctionCallEvents(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	evs := e.stream(t, "", map[string]any{"input": "Use the get_weather tool for Paris.", "tools": []any{weatherTool}})
	ts := types(evs)
	want := []string{"response.created", "response.in_progress", "response.output_item.added"}
	if !slices.Equal(ts[:3], want) || ts[len(ts)-1] != "response.completed" {
		t.Fatalf("event types = %v", ts)
	}
	var added struct {
		Item map[string]any `json:"item"`
	}
	_ = json.Unmarshal(evs[2].Data, &added)
	for _, k := range []string{"id", "call_id", "name", "arguments", "status"} {
		if _, ok := added.Item[k]; !ok {
			t.Fatalf("function_call output_item.added lacks %q: %s", k, evs[2].Data)
		}
	}
	var args strings.Builder
	var doneArgs string
	for _, ev := range evs {
		var d struct {
			Delta     string `json:"delta"`
			Arguments string `json:"arguments"`
			Name      string `json:"name"`
		}
		_ = json.Unmarshal(ev.Data, &d)
		switch ev.Type {
		case "response.function_call_arguments.delta":
			args.WriteString(d.Delta)
		case "response.function_call_arguments.done":
			doneArgs = d.Arguments
			if d.Name != "get_weather" {
				t.Fatalf("arguments.done name %q", d.Name)
			}
		}
	}
	if args.Len() == 0 || args.String() != doneArgs || !json.Valid([]byte(doneArgs)) {
		t.Fatalf("argument deltas %q, done %q", args.String(), doneArgs)
	}
	var done struct {
		Response Response `json:"response"`
	}
	_ = json.Unmarshal(evs[len(evs)-1].Data, &done)
	fc := done.Response.Output[0]
	if fc.Type != ItemFunctionCall || fc.Name != "get_weather" || fc.Arguments != doneArgs || fc.Status != StatusCompleted || !strings.HasPrefix(fc.ID, "fc_") || fc.CallID == "" {
		t.Fatalf("function call item = %+v", fc)
	}
}

func TestPreviousResponseChain(t *testing.T) { redistest.Each(t, testPreviousResponseChain) }

func testPreviousResponseChain(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	r1 := e.create(t, "acme", map[string]any{"input": "Use the get_weather tool for Paris.", "tools": []any{weatherTool}, "instructions": "old"})
	call := r1.Output[0]
	if call.Type != ItemFunctionCall {
		t.Fatalf("turn 1 output = %+v", r1.Output)
	}
	r2 := e.create(t, "acme", map[string]any{"previous_response_id": r1.ID, "tools": []any{weatherTool}, "instructions": "new",
		"input": []any{map[string]any{"type": "function_call_output", "call_id": call.CallID, "output": "sunny"}}})
	if r2.Status != StatusCompleted || r2.Output[0].Type != ItemMessage || deref(r2.PreviousResponseID) != r1.ID {
		t.Fatalf("turn 2 = %+v", r2)
	}
	turns := e.chat.recorded()
	var b2 struct {
		Messages []json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal(turns[1].Body, &b2)
	got := make([]string, len(b2.Messages))
	for i, m := range b2.Messages {
		got[i] = string(m)
	}
	want := []string{
		`{"role":"system","content":"new"}`, // earlier instructions are not carried over
		`{"role":"user","content":"Use the get_weather tool for Paris."}`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"` + call.CallID + `","type":"function","function":{"name":"get_weather","arguments":` + jsonString(call.Arguments) + `}}]}`,
		`{"role":"tool","content":"sunny","tool_call_id":"` + call.CallID + `"}`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("turn 2 messages:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if turns[0].Session != r1.ID || turns[1].Session != r1.ID {
		t.Fatalf("sessions %q, %q; want both the chain root %q", turns[0].Session, turns[1].Session, r1.ID)
	}
}

func jsonString(s string) string {
	b, _ := chatapi.Marshal(s)
	return string(b)
}

func TestPreviousResponseNotFound(t *testing.T) { redistest.Each(t, testPreviousResponseNotFound) }

func testPreviousResponseNotFound(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	r := e.create(t, "acme", map[string]any{"input": "hi"})
	unstored := e.create(t, "acme", map[string]any{"input": "hi", "store": false})
	for name, c := range map[string]struct{ tenant, id string }{
		"unknown":      {"acme", "resp_nope"},
		"other tenant": {"globex", r.ID},
		"unstored":     {"acme", unstored.ID},
	} {
		t.Run(name, func(t *testing.T) {
			code, b := e.do(t, "POST", "/v1/responses", c.tenant, map[string]any{"model": vllmsim.DefaultModel, "input": "again", "previous_response_id": c.id})
			want := `{"error":{"message":"Previous response with id '` + c.id + `' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`
			if code != 400 || strings.TrimSpace(string(b)) != want {
				t.Fatalf("got %d %s\nwant 400 %s", code, b, want)
			}
		})
	}
	// Other tenants cannot read, list or delete it either (404, not 403).
	for _, req := range [][2]string{{"GET", "/v1/responses/" + r.ID}, {"GET", "/v1/responses/" + r.ID + "/input_items"}, {"DELETE", "/v1/responses/" + r.ID}} {
		if code, b := e.do(t, req[0], req[1], "globex", nil); code != 404 {
			t.Fatalf("%s %s as another tenant: %d %s", req[0], req[1], code, b)
		}
	}
	if code, _ := e.do(t, "GET", "/v1/responses/"+r.ID, "acme", nil); code != 200 {
		t.Fatalf("owner lost access: %d", code)
	}
}

func TestDeleteAndInputItems(t *testing.T) { redistest.Each(t, testDeleteAndInputItems) }

func testDeleteAndInputItems(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	var input []any
	for i := range 5 {
		input = append(input, map[string]any{"role": "user", "content": fmt.Sprintf("message %d", i)})
	}
	r := e.create(t, "", map[string]any{"input": input})
	// Default order is desc, limit 20.
	code, b := e.do(t, "GET", "/v1/responses/"+r.ID+"/input_items", "", nil)
	var l itemList
	if code != 200 || json.Unmarshal(b, &l) != nil || len(l.Data) != 5 || l.HasMore || l.Object != "list" {
		t.Fatalf("input_items: %d %s", code, b)
	}
	if l.Data[0].Content[0].Text != "message 4" || *l.FirstID != l.Data[0].ID || *l.LastID != l.Data[4].ID {
		t.Fatalf("desc order: first %q", l.Data[0].Content[0].Text)
	}
	// Cursor pagination in asc order.
	var seen []string
	after := ""
	for range 5 {
		q := "/v1/responses/" + r.ID + "/input_items?order=asc&limit=2"
		if after != "" {
			q += "&after=" + after
		}
		_, b := e.do(t, "GET", q, "", nil)
		var p itemList
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		for _, it := range p.Data {
			seen = append(seen, it.Content[0].Text)
		}
		if !p.HasMore {
			break
		}
		after = *p.LastID
	}
	if strings.Join(seen, ",") != "message 0,message 1,message 2,message 3,message 4" {
		t.Fatalf("paged asc = %v", seen)
	}
	if code, b := e.do(t, "GET", "/v1/responses/"+r.ID+"/input_items?limit=0", "", nil); code != 400 {
		t.Fatalf("limit=0: %d %s", code, b)
	}
	code, b = e.do(t, "DELETE", "/v1/responses/"+r.ID, "", nil)
	if code != 200 || !strings.Contains(string(b), `"deleted":true`) {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	if code, _ := e.do(t, "GET", "/v1/responses/"+r.ID, "", nil); code != 404 {
		t.Fatalf("GET after DELETE: %d", code)
	}
	if code, _ := e.do(t, "DELETE", "/v1/responses/"+r.ID, "", nil); code != 404 {
		t.Fatalf("second DELETE: %d", code)
	}
}

func TestItemReference(t *testing.T) { redistest.Each(t, testItemReference) }

func testItemReference(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	r1 := e.create(t, "acme", map[string]any{"input": "Tell me a story."})
	msgID := r1.Output[0].ID
	r2 := e.create(t, "acme", map[string]any{"input": []any{
		map[string]any{"role": "user", "content": "Tell me a story."},
		map[string]any{"type": "item_reference", "id": msgID},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "And another."}}},
	}})
	if r2.Status != StatusCompleted {
		t.Fatalf("turn 2 = %+v", r2)
	}
	turns := e.chat.recorded()
	if !strings.Contains(string(turns[1].Body), jsonString(r1.Output[0].Content[0].Text)) {
		t.Fatalf("the referenced assistant text is not in the upstream body: %s", turns[1].Body)
	}
	if turns[1].Session != r1.ID {
		t.Fatalf("turn 2 session %q; want inherited %q", turns[1].Session, r1.ID)
	}
	// Another tenant cannot resolve it.
	code, b := e.do(t, "POST", "/v1/responses", "globex", map[string]any{"model": vllmsim.DefaultModel,
		"input": []any{map[string]any{"type": "item_reference", "id": msgID}}})
	if _, _, param, _ := envelope(t, b); code != 400 || deref(param) != "input[0]" {
		t.Fatalf("cross-tenant reference: %d %s", code, b)
	}
}

func TestUnsupportedFeatures(t *testing.T) {
	tp := single(t)
	e := newEnv(t, tp, vllmsim.Config{})
	cases := []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"input": "x", "tools": []any{map[string]any{"type": "file_search", "vector_store_ids": []string{"vs"}}}}, "tools[0].type"},
		{map[string]any{"input": "x", "tools": []any{map[string]any{"type": "code_interpreter"}}}, "tools[0].type"},
		{map[string]any{"input": "x", "tool_choice": map[string]any{"type": "web_search_preview"}}, "tool_choice"},
		{map[string]any{"input": "x", "prompt": map[string]any{"id": "pmpt_1"}}, "prompt"},
		{map[string]any{"input": "x", "context_management": []any{map[string]any{"type": "compaction"}}}, "context_management"},
		{map[string]any{"input": "x", "truncation": "auto"}, "truncation"},
		{map[string]any{"input": []any{map[string]any{"type": "web_search_call", "id": "ws_1"}}}, "input[0].type"},
		{map[string]any{"input": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_file", "file_id": "f"}}}}}, "input[0].content[0].type"},
		{map[string]any{"input": "x", "previous_response_id": "resp_a", "conversation": "conv_b"}, "conversation"},
		{map[string]any{"input": "x", "background": true, "store": false}, "background"},
		{map[string]any{"input": "x", "temperature": 3}, "temperature"},
		{map[string]any{"input": "x", "max_output_tokens": 5}, "max_output_tokens"},
		{map[string]any{"input": "x", "text": map[string]any{"format": map[string]any{"type": "json_schema", "schema": map[string]any{}}}}, "text.format.name"},
		{map[string]any{"input": "x", "tool_choice": map[string]any{"type": "function", "name": "nope"}}, "tool_choice"},
		{map[string]any{"input": 7}, "input"},
		{map[string]any{"input": "x", "model": 7}, "model"},
	}
	for _, c := range cases {
		t.Run(c.param, func(t *testing.T) {
			if _, ok := c.body["model"]; !ok {
				c.body["model"] = vllmsim.DefaultModel
			}
			code, b := e.do(t, "POST", "/v1/responses", "", c.body)
			_, typ, param, _ := envelope(t, b)
			if code != 400 || typ != "invalid_request_error" || deref(param) != c.param {
				t.Fatalf("got %d param %v: %s; want 400 naming %s", code, deref(param), b, c.param)
			}
		})
	}
	if code, b := e.do(t, "POST", "/v1/responses/compact", "", map[string]any{"model": "m"}); code != 400 {
		t.Fatalf("compact: %d %s", code, b)
	}
	// web_search is dropped, not refused (see doc.go); the turn runs.
	r := e.create(t, "", map[string]any{"input": "hi", "tools": []any{map[string]any{"type": "web_search", "external_web_access": false}, weatherTool}})
	if r.Status != StatusCompleted || strings.Contains(string(r.Tools), "web_search") {
		t.Fatalf("web_search drop: status %s tools %s", r.Status, r.Tools)
	}
}

func TestInputTokens(t *testing.T) {
	tp := single(t)
	e := newEnv(t, tp, vllmsim.Config{})
	r := e.create(t, "", map[string]any{"input": "Count these words please."})
	code, b := e.do(t, "POST", "/v1/responses/input_tokens", "", map[string]any{"model": vllmsim.DefaultModel, "input": "And these.", "previous_response_id": r.ID})
	var got struct {
		Object      string `json:"object"`
		InputTokens int    `json:"input_tokens"`
	}
	if code != 200 || json.Unmarshal(b, &got) != nil || got.Object != "response.input_tokens" || got.InputTokens <= r.Usage.InputTokens {
		t.Fatalf("input_tokens: %d %s (turn 1 had %d)", code, b, r.Usage.InputTokens)
	}
	// Counting stores nothing.
	if n := len(e.chat.recorded()); n != 2 {
		t.Fatalf("%d upstream calls; want 2", n)
	}
}

func TestConversations(t *testing.T) { redistest.Each(t, testConversations) }

func testConversations(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	code, b := e.do(t, "POST", "/v1/conversations", "acme", map[string]any{"metadata": map[string]string{"topic": "demo"},
		"items": []any{map[string]any{"role": "user", "content": "Remember: the code word is plum."}}})
	var c Conversation
	if code != 200 || json.Unmarshal(b, &c) != nil || !strings.HasPrefix(c.ID, "conv_") || c.Object != "conversation" || c.Metadata["topic"] != "demo" {
		t.Fatalf("create conversation: %d %s", code, b)
	}
	r1 := e.create(t, "acme", map[string]any{"conversation": c.ID, "input": "What is the code word?"})
	r2 := e.create(t, "acme", map[string]any{"conversation": map[string]string{"id": c.ID}, "input": "Thanks."})
	if r1.Conversation == nil || r1.Conversation.ID != c.ID || r2.Status != StatusCompleted {
		t.Fatalf("conversation turns: %+v %+v", r1.Conversation, r2.Status)
	}
	turns := e.chat.recorded()
	if turns[0].Session != c.ID || turns[1].Session != c.ID {
		t.Fatalf("sessions %q %q; want %q", turns[0].Session, turns[1].Session, c.ID)
	}
	if !strings.HasPrefix(string(turns[1].Body), strings.TrimSuffix(string(turns[0].Body[:strings.Index(string(turns[0].Body), `],"stream"`)]), "]")) {
		t.Fatalf("turn 2 does not extend turn 1:\n%s\n%s", turns[0].Body, turns[1].Body)
	}
	// Items: seed + (input + output) × 2 = 5, default desc.
	code, b = e.do(t, "GET", "/v1/conversations/"+c.ID+"/items?order=asc", "acme", nil)
	var l itemList
	if code != 200 || json.Unmarshal(b, &l) != nil || len(l.Data) != 5 || l.Data[0].Content[0].Text != "Remember: the code word is plum." || l.Data[2].Role != "assistant" {
		t.Fatalf("items: %d %s", code, b)
	}
	// Add, get, delete an item.
	code, b = e.do(t, "POST", "/v1/conversations/"+c.ID+"/items", "acme", map[string]any{"items": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "added"}}}}})
	var added itemList
	if code != 200 || json.Unmarshal(b, &added) != nil || len(added.Data) != 1 {
		t.Fatalf("add items: %d %s", code, b)
	}
	iid := added.Data[0].ID
	if code, b := e.do(t, "GET", "/v1/conversations/"+c.ID+"/items/"+iid, "acme", nil); code != 200 || !strings.Contains(string(b), "added") {
		t.Fatalf("get item: %d %s", code, b)
	}
	if code, b := e.do(t, "DELETE", "/v1/conversations/"+c.ID+"/items/"+iid, "acme", nil); code != 200 || !strings.Contains(string(b), `"object":"conversation"`) {
		t.Fatalf("delete item: %d %s", code, b)
	}
	if code, _ := e.do(t, "GET", "/v1/conversations/"+c.ID+"/items/"+iid, "acme", nil); code != 404 {
		t.Fatalf("get deleted item: %d", code)
	}
	// Update metadata; other tenants see nothing.
	if code, b := e.do(t, "POST", "/v1/conversations/"+c.ID, "acme", map[string]any{"metadata": map[string]string{"topic": "new"}}); code != 200 || !strings.Contains(string(b), `"topic":"new"`) {
		t.Fatalf("update: %d %s", code, b)
	}
	for _, p := range []string{"/v1/conversations/" + c.ID, "/v1/conversations/" + c.ID + "/items"} {
		if code, _ := e.do(t, "GET", p, "globex", nil); code != 404 {
			t.Fatalf("GET %s as another tenant: %d", p, code)
		}
	}
	if code, b := e.do(t, "POST", "/v1/responses", "globex", map[string]any{"model": vllmsim.DefaultModel, "conversation": c.ID, "input": "x"}); code != 404 {
		t.Fatalf("turn on another tenant's conversation: %d %s", code, b)
	}
	code, b = e.do(t, "DELETE", "/v1/conversations/"+c.ID, "acme", nil)
	if code != 200 || !strings.Contains(string(b), `"object":"conversation.deleted"`) {
		t.Fatalf("delete: %d %s", code, b)
	}
	if code, _ := e.do(t, "GET", "/v1/conversations/"+c.ID, "acme", nil); code != 404 {
		t.Fatalf("GET deleted conversation: %d", code)
	}
}

// TestConversationConcurrentTurns runs two turns on one conversation at
// once: exactly one gets 409 conversation_locked while the other runs, and
// the conversation holds the winner's items only, in order.
func TestConversationConcurrentTurns(t *testing.T) {
	redistest.Each(t, testConversationConcurrentTurns)
}

func testConversationConcurrentTurns(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	_, b := e.do(t, "POST", "/v1/conversations", "", map[string]any{})
	var c Conversation
	_ = json.Unmarshal(b, &c)
	entered := make(chan struct{})
	proceed := make(chan struct{})
	var once sync.Once
	e.chat.before = func(chatapi.Turn) {
		once.Do(func() { close(entered); <-proceed })
	}
	first := make(chan int, 1)
	go func() {
		code, _ := e.do(t, "POST", "/v1/responses", "", map[string]any{"model": vllmsim.DefaultModel, "conversation": c.ID, "input": "first"})
		first <- code
	}()
	<-entered // the first turn holds the lock and is upstream
	code, b := e.do(t, "POST", "/v1/responses", "", map[string]any{"model": vllmsim.DefaultModel, "conversation": c.ID, "input": "second"})
	if _, _, _, errCode := envelope(t, b); code != 409 || deref(errCode) != "conversation_locked" {
		t.Fatalf("concurrent turn: %d %s", code, b)
	}
	if code, b := e.do(t, "POST", "/v1/conversations/"+c.ID+"/items", "", map[string]any{"items": []any{map[string]any{"role": "user", "content": "x"}}}); code != 409 {
		t.Fatalf("item write during a turn: %d %s", code, b)
	}
	close(proceed)
	if code := <-first; code != 200 {
		t.Fatalf("first turn: %d", code)
	}
	_, b = e.do(t, "GET", "/v1/conversations/"+c.ID+"/items?order=asc", "", nil)
	var l itemList
	_ = json.Unmarshal(b, &l)
	if len(l.Data) != 2 || l.Data[0].Content[0].Text != "first" || l.Data[1].Role != "assistant" {
		t.Fatalf("items after the race: %s", b)
	}
	// The lock is released: a next turn runs.
	e.chat.before = nil
	e.create(t, "", map[string]any{"conversation": c.ID, "input": "second"})
}

func TestUpstreamErrorPassesThrough(t *testing.T) {
	tp := single(t)
	e := newEnv(t, tp, vllmsim.Config{})
	code, b := e.do(t, "POST", "/v1/responses", "", map[string]any{"model": "no-such-model", "input": "x"})
	msg, _, _, errCode := envelope(t, b)
	if code != 404 || msg == "" || errCode != nil {
		t.Fatalf("unknown model upstream: %d %s (vLLM's integer code must become null)", code, b)
	}
}

func TestModelsAndTokenizeOptions(t *testing.T) {
	tp := single(t)
	e := newEnv(t, tp, vllmsim.Config{}, func(o *Options) {
		o.Models = func() []string { return []string{vllmsim.DefaultModel} }
		o.Tokenize = func(_ context.Context, body []byte) (int, error) { return len(body), nil }
	})
	code, b := e.do(t, "POST", "/v1/responses", "", map[string]any{"model": "other", "input": "x"})
	if _, _, _, c := envelope(t, b); code != 404 || deref(c) != "model_not_found" {
		t.Fatalf("unlisted model: %d %s", code, b)
	}
	code, b = e.do(t, "POST", "/v1/responses/input_tokens", "", map[string]any{"model": vllmsim.DefaultModel, "input": "x"})
	if code != 200 || !strings.Contains(string(b), `"input_tokens":`) || len(e.chat.recorded()) != 0 {
		t.Fatalf("input_tokens with Tokenize: %d %s (upstream calls %d)", code, b, len(e.chat.recorded()))
	}
	if code, b := e.do(t, "GET", "/v1/nothing", "", nil); code != 404 {
		t.Fatalf("unknown path: %d %s", code, b)
	}
}
