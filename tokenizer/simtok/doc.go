// Package simtok is the simulated vLLM's tokenizer (package vllmsim's):
// its vocabulary, its chat template, and the decoding and tokenizing of
// /tokenize bodies that the simulator's /tokenize endpoint answers with.
// The simulator's replicas tokenize, render and detokenize with it, and a
// gateway with routing.tokenizer: simulator tokenizes in process with it
// (TokenizeChatJSON, TokenizePrompt), getting a simulated replica's ids
// without importing the simulator. It imports nothing of warmpath, keeps
// no state, starts no goroutines, and everything in it is safe for
// concurrent use.
//
// # Tokenizer
//
// The tokenizer is deterministic, allocation-free per token and has no
// per-process state, so every replica and every other package agree on
// token IDs. Spaces, tabs and carriage returns only separate words; each
// newline (ID 10) and each ASCII punctuation character (ID = its byte) is
// one token; each word (a maximal run of letters, digits and non-ASCII
// bytes) is one token. IDs [1000, 151000) are words spelled as one to three
// consonant-vowel syllables (Word); a word spelled that way maps back to
// its ID, any other word is hashed (64-bit FNV-1a, fixed) into the same
// range. Special tokens reuse Qwen's IDs: <|endoftext|> 151643,
// <|im_start|> 151644, <|im_end|> 151645, <tool_call> 151657 … </think>
// 151668. Consequences: N words joined by single spaces are N tokens, and
// Tokenize(Detokenize(ids)) == ids for every ID sequence the simulator's
// generator produces.
//
// The chat template is ChatML in Qwen's style (see RenderChat): each message
// renders independently of the messages after it, tools are rendered into
// the system part, assistant tool calls as <tool_call> JSON blocks and tool
// results as <tool_response> blocks inside a user turn, one per message.
// The rendering of messages[:k] is therefore a token prefix of the rendering
// of messages[:k+1], and the generation prompt "<|im_start|>assistant\n" is
// how an assistant message starts, so multi-turn prefixes really are shared.
package simtok
