package misses

import (
	"reflect"
	"testing"
)

func TestFingerprintBinaryRoundTrip(t *testing.T) {
	p := mustPrompt(t, chatBody(t, weatherTools, turn2...))
	p.SetBlocks([]uint64{1, 1 << 63, 3}, 16)
	fp := p.Fingerprint(Options{})
	fp.Tokens = 321
	b, err := fp.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Fingerprint
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, fp) {
		t.Errorf("round trip: got %+v; want %+v", got, *fp)
	}
	if len(b) > fp.Size() {
		t.Errorf("encoded %d bytes; want at most Size() = %d", len(b), fp.Size())
	}
	// A decoded fingerprint locates like the original.
	cur := mustPrompt(t, chatBody(t, weatherTools[1:], turn2...))
	if a, b := Locate(fp, cur, Options{}), Locate(&got, cur, Options{}); a != b {
		t.Errorf("Locate differs after a round trip: %+v vs %+v", a, b)
	}
	for _, bad := range [][]byte{nil, {2}, b[:len(b)-1], append(append([]byte(nil), b...), 0)} {
		if err := new(Fingerprint).UnmarshalBinary(bad); err == nil {
			t.Errorf("UnmarshalBinary(%x): got no error", bad)
		}
	}
}

// FuzzFingerprintBinary checks that UnmarshalBinary never panics on bytes
// from a store, and that what it accepts encodes back to the same bytes'
// meaning.
func FuzzFingerprintBinary(f *testing.F) {
	for _, body := range [][]byte{chatBody(f, weatherTools, turn2...), chatBody(f, nil, turn1...)} {
		p := mustPrompt(f, body)
		p.SetBlocks([]uint64{7, 8}, 16)
		b, _ := p.Fingerprint(Options{}).MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{1, 16, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var fp Fingerprint
		if fp.UnmarshalBinary(data) != nil {
			return
		}
		b, err := fp.MarshalBinary()
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", fp, err)
		}
		var again Fingerprint
		if err := again.UnmarshalBinary(b); err != nil || !reflect.DeepEqual(again, fp) {
			t.Fatalf("round trip: got %+v, %v; want %+v", again, err, fp)
		}
		cur := mustPrompt(t, chatBody(t, weatherTools, turn2...))
		_ = Locate(&fp, cur, Options{Excerpts: true}) // must not panic on any decoded fingerprint
	})
}
