package hftok

import (
	"testing"

	"github.com/warmpath/warmpath/tokenizer/simtok"
)

// benchBody is a chat of about 16k tokens (Qwen3's count is reported).
func benchBody(b *testing.B) ([]byte, *Tokenizer) {
	tok, _, _ := realModel(b, realModels[0].dir)
	return longChat("Qwen3", 16000), tok
}

// BenchmarkTokenizeBody16k: a 16k-token chat body, template rendered and
// encoded, with the hand pre-tokenizer (as loaded) and with regexp2
// running the same pattern; BenchmarkSimulatorTokenizeBody16k is the
// simulator's tokenizer (routing.tokenizer: simulator) on the same body.
func BenchmarkTokenizeBody16k(b *testing.B) {
	body, tok := benchBody(b)
	re, err := newSplitter(qwen2Pattern, false)
	if err != nil {
		b.Fatal(err)
	}
	slow := *tok
	slow.splits = []splitter{re}
	for _, c := range []struct {
		name string
		tok  *Tokenizer
	}{{"hand", tok}, {"regexp2", &slow}} {
		b.Run(c.name, func(b *testing.B) {
			ids, err := c.tok.TokenizeBody(body)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				c.tok.TokenizeBody(body)
			}
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}

func BenchmarkSimulatorTokenizeBody16k(b *testing.B) {
	body, _ := benchBody(b)
	ids, err := simtok.TokenizeBody(body)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		simtok.TokenizeBody(body)
	}
	b.ReportMetric(float64(len(ids)), "tokens")
}

// BenchmarkLoad: reading and building Qwen3's tokenizer (11 MB of JSON),
// paid once per model at the gateway's start.
func BenchmarkLoad(b *testing.B) {
	_, _, dir := realModel(b, realModels[0].dir)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
	}
}
