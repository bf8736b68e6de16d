package simtok

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/tidwall/gjson"
)

// TokenizeRequest is either form of vLLM's /tokenize body, as
// DecodeTokenizeRequest reads it; Tokens tokenizes it.
type TokenizeRequest struct {
	Model                string    `json:"model"`
	Prompt               *string   `json:"prompt"`
	Messages             []Message `json:"messages"`
	Tools                []Tool    `json:"tools"`
	AddGenerationPrompt  *bool     `json:"add_generation_prompt"`
	ContinueFinalMessage bool      `json:"continue_final_message"`
	ReturnTokenStrs      bool      `json:"return_token_strs"`
}

// TokenizeBody returns the token ids a replica's POST /tokenize answers
// for body (vLLM's /tokenize request: a prompt, or messages with optional
// tools, add_generation_prompt and continue_final_message), by the
// simulator's /tokenize handler's own code: a gateway that knows its fleet
// is simulated tokenizes in process with it. It does not check the body's
// model, which every simulated replica tokenizes alike. Its errors are
// the messages of the 400s /tokenize answers.
func TokenizeBody(body []byte) ([]uint32, error) {
	tr, err := DecodeTokenizeRequest(body, true)
	if err != nil {
		return nil, err
	}
	return tr.Tokens()
}

// TokenizeChatJSON returns the ids /tokenize gives a body of these messages
// and tools with add_generation_prompt: messages and tools are JSON arrays
// known to be valid (tools "" for none), as in a request a gateway has
// parsed. It spares the gateway building a /tokenize body and parsing it
// again (half the allocation for a 16k-word prompt); the decoding and
// rendering are the handler's own.
func TokenizeChatJSON(messages, tools string) ([]uint32, error) {
	var tr TokenizeRequest
	err := tr.field("messages", gjson.Parse(messages))
	if err == nil && tools != "" {
		err = tr.field("tools", gjson.Parse(tools))
	}
	if err != nil {
		return nil, fmt.Errorf("JSON decode error: %v", err)
	}
	return tr.Tokens()
}

// TokenizePrompt returns the ids /tokenize gives a body whose prompt is
// text, a decoded JSON string: invalid UTF-8 in it reads as U+FFFD, as in
// the handler's decoding.
func TokenizePrompt(text string) []uint32 { return Tokenize(validUTF8(text)) }

// chatSize is about the size of messages rendered by the chat template,
// so the rendering is one allocation.
func chatSize(messages []Message) int {
	n := 256
	for i := range messages {
		n += len(messages[i].Content) + 64
	}
	return n
}

// Tokens renders and tokenizes the request as /tokenize does; its errors
// are the messages of /tokenize's 400s.
func (tr *TokenizeRequest) Tokens() ([]uint32, error) {
	switch {
	case tr.Messages != nil:
		addGen := tr.AddGenerationPrompt == nil || *tr.AddGenerationPrompt
		if addGen && tr.ContinueFinalMessage {
			return nil, errors.New("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		}
		text := AppendChat(make([]byte, 0, chatSize(tr.Messages)), tr.Messages, tr.Tools, addGen, tr.ContinueFinalMessage)
		// The rendered text is not written again: tokenize it in place.
		return Tokenize(unsafe.String(unsafe.SliceData(text), len(text))), nil
	case tr.Prompt != nil:
		return Tokenize(*tr.Prompt), nil
	default:
		return nil, errors.New("either prompt or messages is required")
	}
}
