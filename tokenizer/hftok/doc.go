// Package hftok tokenizes in process the way a Hugging Face fast
// tokenizer does, from a model's own tokenizer.json, tokenizer_config.json
// and chat template: the ids vLLM's POST /tokenize gives for a chat
// (the chat template rendered as vLLM renders it, then encoded without
// special tokens) or for a completions prompt (encoded with them).
//
// It supports byte-level BPE, the GPT-2 / Llama 3 / Qwen2 family: added
// and special tokens matched first, normalizer none or NFC, Split
// pre-tokenizers (the Llama 3 and Qwen2 patterns by hand, any other
// through regexp2) ending in ByteLevel, merges or ranked vocab, and the
// ByteLevel and TemplateProcessing post-processors. Anything else in a
// tokenizer.json (Unigram, WordPiece, other normalizers or
// pre-tokenizers, byte fallback) is refused by Load with an error naming
// it, never tokenized approximately. A Tokenizer is safe for concurrent
// use and starts no goroutines.
//
// It imports nothing of warmpath: the gateway loads one per model of
// routing.tokenizer_dirs (routing.tokenizer: hf), and the simulated
// model's vocabulary is package simtok's, beside it under tokenizer/.
package hftok
