package responses

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/conversations"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/warmpath/warmpath/vllmsim"
)

// openaiClient is the real openai-go v3 client pointed at the env.
func (e *env) openaiClient(tenant string) openai.Client {
	return openai.NewClient(option.WithBaseURL(e.url+"/v1/"), option.WithAPIKey("sk-test"),
		option.WithHeader("X-Tenant", tenant), option.WithMaxRetries(0))
}

var goWeatherTool = responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
	Name: "get_weather", Description: openai.String("Current weather for a city."), Strict: openai.Bool(false),
	Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
}}

func TestOpenAIGoCreateAndChain(t *testing.T) {
	e := newEnv(t, single(t), vllmsim.Config{})
	c := e.openaiClient("acme")
	ctx := context.Background()
	r1, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: vllmsim.DefaultModel, Instructions: openai.String("Be brief."),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me about Paris.")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Status != responses.ResponseStatusCompleted || r1.OutputText() == "" || r1.Usage.InputTokens == 0 {
		t.Fatalf("r1: status %s text %q usage %+v", r1.Status, r1.OutputText(), r1.Usage)
	}
	r2, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: vllmsim.DefaultModel, PreviousResponseID: openai.String(r1.ID), Instructions: openai.String("Be brief."),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("And London?")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r2.PreviousResponseID != r1.ID || r2.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Fatalf("r2: previous %q cached %d", r2.PreviousResponseID, r2.Usage.InputTokensDetails.CachedTokens)
	}
	got, err := c.Responses.Get(ctx, r2.ID, responses.ResponseGetParams{})
	if err != nil || got.ID != r2.ID || got.OutputText() != r2.OutputText() {
		t.Fatalf("Get: %v %+v", err, got)
	}
	items, err := c.Responses.InputItems.List(ctx, r2.ID, responses.InputItemListParams{})
	if err != nil || len(items.Data) != 1 {
		t.Fatalf("InputItems.List: %v %+v", err, items)
	}
	// The exact error the SDK surfaces for an unknown previous response.
	_, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: vllmsim.DefaultModel,
		PreviousResponseID: openai.String("resp_missing"), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "previous_response_not_found" || apiErr.Param != "previous_response_id" {
		t.Fatalf("unknown previous: %v", err)
	}
	if err := c.Responses.Delete(ctx, r1.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}

func TestOpenAIGoStream(t *testing.T) {
	e := newEnv(t, single(t), vllmsim.Config{})
	c := e.openaiClient("")
	st := c.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
		Model: vllmsim.DefaultModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Stream a story.")},
	})
	var text strings.Builder
	var done *responses.Response
	n := 0
	for st.Next() {
		ev := st.Current()
		if int(ev.SequenceNumber) != n {
			t.Fatalf("event %d has sequence_number %d", n, ev.SequenceNumber)
		}
		n++
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			r := ev.AsResponseCompleted().Response
			done = &r
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if done == nil || done.OutputText() != text.String() || done.Usage.OutputTokens == 0 {
		t.Fatalf("completed %+v; deltas %q", done, text.String())
	}
}

// TestOpenAIGoFunctionCallLoop runs the tool loop an agent runs: the model
// calls a function, the client answers with function_call_output chained
// on previous_response_id, the model answers in text.
func TestOpenAIGoFunctionCallLoop(t *testing.T) {
	e := newEnv(t, single(t), vllmsim.Config{})
	c := e.openaiClient("")
	ctx := context.Background()
	params := responses.ResponseNewParams{Model: vllmsim.DefaultModel, Tools: []responses.ToolUnionParam{goWeatherTool},
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Use the get_weather tool for Oslo.")}}
	r, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	for step := 0; ; step++ {
		var outputs responses.ResponseInputParam
		for _, it := range r.Output {
			if it.Type == "function_call" {
				fc := it.AsFunctionCall()
				if fc.Name != "get_weather" || !strings.Contains(fc.Arguments, "city") {
					t.Fatalf("call = %+v", fc)
				}
				out := responses.ResponseInputItemParamOfFunctionCallOutput("sunny, 21C")
				out.OfFunctionCallOutput.CallID = openai.String(fc.CallID)
				outputs = append(outputs, out)
			}
		}
		if len(outputs) == 0 {
			break
		}
		if step > 3 {
			t.Fatal("the tool loop does not end")
		}
		r, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: vllmsim.DefaultModel, Tools: params.Tools,
			PreviousResponseID: openai.String(r.ID), Input: responses.ResponseNewParamsInputUnion{OfInputItemList: outputs}})
		if err != nil {
			t.Fatal(err)
		}
	}
	if r.OutputText() == "" || r.Status != responses.ResponseStatusCompleted {
		t.Fatalf("final: %+v", r)
	}
}

func TestOpenAIGoConversations(t *testing.T) {
	e := newEnv(t, single(t), vllmsim.Config{})
	c := e.openaiClient("acme")
	ctx := context.Background()
	conv, err := c.Conversations.New(ctx, conversations.ConversationNewParams{
		Items: []responses.ResponseInputItemUnionParam{responses.ResponseInputItemParamOfMessage("The code word is plum.", responses.EasyInputMessageRoleUser)},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"What is the code word?", "Say it again."} {
		r, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: vllmsim.DefaultModel,
			Conversation: responses.ResponseNewParamsConversationUnion{OfString: openai.String(conv.ID)},
			Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String(q)}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Conversation.ID != conv.ID {
			t.Fatalf("response conversation %q", r.Conversation.ID)
		}
	}
	page, err := c.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{Order: conversations.ItemListParamsOrderAsc})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 5 || page.Data[0].Type != "message" {
		t.Fatalf("items: %d", len(page.Data))
	}
	// Auto-paging over pages of 2 sees every item once.
	iter := c.Conversations.Items.ListAutoPaging(ctx, conv.ID, conversations.ItemListParams{Limit: openai.Int(2)})
	n := 0
	for iter.Next() {
		n++
	}
	if iter.Err() != nil || n != 5 {
		t.Fatalf("auto-paged %d items, %v", n, iter.Err())
	}
	if _, err := c.Conversations.Delete(ctx, conv.ID); err != nil {
		t.Fatal(err)
	}
}
