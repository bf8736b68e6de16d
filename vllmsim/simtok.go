package vllmsim

import "github.com/warmpath/warmpath/tokenizer/simtok"

// The simulator's vocabulary, chat template and /tokenize code are package
// simtok's (see its doc); these names are simtok's, kept here for the
// simulator's callers.

// Token IDs of the simulator's vocabulary (simtok's).
const (
	NewlineToken           = simtok.NewlineToken
	WordBase               = simtok.WordBase
	NumWords               = simtok.NumWords
	VocabSize              = simtok.VocabSize
	EndOfTextToken         = simtok.EndOfTextToken
	IMStartToken           = simtok.IMStartToken
	IMEndToken             = simtok.IMEndToken
	ToolCallStartToken     = simtok.ToolCallStartToken
	ToolCallEndToken       = simtok.ToolCallEndToken
	ToolResponseStartToken = simtok.ToolResponseStartToken
	ToolResponseEndToken   = simtok.ToolResponseEndToken
	ThinkStartToken        = simtok.ThinkStartToken
	ThinkEndToken          = simtok.ThinkEndToken
)

// Chat messages and tools as the chat template renders them (simtok's).
type (
	Message      = simtok.Message
	ToolCall     = simtok.ToolCall
	FunctionCall = simtok.FunctionCall
	Tool         = simtok.Tool
	ToolFunction = simtok.ToolFunction
)

// Tokenize is simtok.Tokenize.
func Tokenize(text string) []uint32 { return simtok.Tokenize(text) }

// AppendTokens is simtok.AppendTokens.
func AppendTokens(dst []uint32, text string) []uint32 { return simtok.AppendTokens(dst, text) }

// IsWord is simtok.IsWord.
func IsWord(id uint32) bool { return simtok.IsWord(id) }

// Word is simtok.Word.
func Word(id uint32) string { return simtok.Word(id) }

// TokenString is simtok.TokenString.
func TokenString(id uint32) string { return simtok.TokenString(id) }

// Detokenize is simtok.Detokenize.
func Detokenize(ids []uint32) string { return simtok.Detokenize(ids) }

// AppendText is simtok.AppendText.
func AppendText(dst []byte, prev uint32, ids []uint32, skipSpecial bool) []byte {
	return simtok.AppendText(dst, prev, ids, skipSpecial)
}

// RenderChat is simtok.RenderChat.
func RenderChat(messages []Message, tools []Tool, addGenerationPrompt bool) string {
	return simtok.RenderChat(messages, tools, addGenerationPrompt)
}

// TokenizeChat is simtok.TokenizeChat.
func TokenizeChat(messages []Message, tools []Tool, addGenerationPrompt bool) []uint32 {
	return simtok.TokenizeChat(messages, tools, addGenerationPrompt)
}

// TokenizeBody is simtok.TokenizeBody: the ids a replica's POST /tokenize
// answers for body.
func TokenizeBody(body []byte) ([]uint32, error) { return simtok.TokenizeBody(body) }

// TokenizeChatJSON is simtok.TokenizeChatJSON.
func TokenizeChatJSON(messages, tools string) ([]uint32, error) {
	return simtok.TokenizeChatJSON(messages, tools)
}

// TokenizePrompt is simtok.TokenizePrompt.
func TokenizePrompt(text string) []uint32 { return simtok.TokenizePrompt(text) }
