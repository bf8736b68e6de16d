package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/warmpath/warmpath/kvevents"
)

// TestKVRelayCommand runs `warmpath kv-relay` in process: an engine's
// connecting PUB reaches a subscriber of --publish through it, frames
// unchanged, and /metrics counts the message.
func TestKVRelayCommand(t *testing.T) {
	var base int
	var done chan error
	cancel := func() {}
	for i := range 50 {
		base = 20000 + (i*7919+int(time.Now().UnixNano()%997))%40000
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		done = make(chan error, 1)
		args := []string{"--bind", fmt.Sprintf("tcp://127.0.0.1:%d", base), "--publish", fmt.Sprintf("tcp://127.0.0.1:%d", base+1),
			"--metrics", fmt.Sprintf("127.0.0.1:%d", base+2), "--log-level", "warn"}
		go func() { done <- runKVRelay(ctx, args) }()
		if waitHealthy(fmt.Sprintf("http://127.0.0.1:%d/health", base+2), done) {
			break
		}
		cancel()
		done = nil
	}
	if done == nil {
		t.Fatal("kv-relay never came up")
	}
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("kv-relay returned %v; want context.Canceled", err)
		}
	}()

	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	pub, err := kvevents.NewPublisher(zctx, kvevents.PublisherConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base), Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pstop := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- pub.Run(pctx) }()
	defer func() { pstop(); <-pdone }()
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_ = sub.SetLinger(0)
	_ = sub.SetRcvtimeo(20 * time.Millisecond)
	_ = sub.SetSubscribe("kv@")
	if err := sub.Connect(fmt.Sprintf("tcp://127.0.0.1:%d", base+1)); err != nil {
		t.Fatal(err)
	}
	var frames [][]byte
	for deadline := time.Now().Add(15 * time.Second); frames == nil; {
		if time.Now().After(deadline) {
			t.Fatal("nothing relayed")
		}
		if err := pub.Publish(kvevents.Batch{TS: 1, Events: []kvevents.Event{&kvevents.AllBlocksCleared{}}}); err != nil {
			t.Fatal(err)
		}
		if f, err := sub.RecvMessageBytes(0); err == nil {
			frames = f
		}
	}
	if len(frames) != 3 || string(frames[0]) != "kv@e@m" || len(frames[1]) != 8 {
		t.Errorf("relayed %q", frames)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", base+2))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "warmpath_kvrelay_messages_total") || !strings.Contains(string(body), "warmpath_kvrelay_subscriptions 1") {
		t.Errorf("/metrics:\n%s", body)
	}
}

// waitHealthy polls url until it answers 200 (true) or the command ends
// (false, e.g. its ports were taken).
func waitHealthy(url string, done <-chan error) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-done:
			return false
		default:
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}
